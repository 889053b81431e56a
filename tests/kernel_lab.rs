//! The kernel lab (cuda/lab_<family>.cu, src/backend/cuda/lab.rs): every
//! numbered variant checked against the CPU reference and the production
//! kernel on fresh random inputs, so a variant that drifts from the contract
//! fails here before anyone times it (benches/kernel_lab.rs). Runs on a GPU
//! or the emulated one.
#![cfg(feature = "cuda")]

mod common;

use asrforge::backend::cpu::{loss as cpu_loss, CpuStorage};
use asrforge::backend::cuda::{lab, loss as cuda_loss, CudaStorage};
use asrforge::tensor::Rng;
use asrforge::Device;
use common::fresh_seed as seed;
use common::gpu;

#[test]
fn every_label_smoothing_variant_matches_the_cpu_and_production() {
    let Some(dev) = gpu::gpu("every_label_smoothing_variant_matches_the_cpu_and_production") else { return };
    let Device::Cuda(ordinal) = dev else { panic!("a CUDA device") };
    let cuda = asrforge::backend::cuda::device(ordinal).unwrap();
    let seed = seed();
    let mut rng = Rng::new(seed);
    // V = 8 (every row 16-byte aligned), 3 (shorter than a pack), 4233 (odd:
    // each row starts at another alignment, so the head and tail loops run),
    // 300 rows (past the capped grid under ASRFORGE_CUDA_MAX_GRID).
    for (rows, v) in [(37, 8), (5, 3), (21, 4233), (300, 40)] {
        let x: Vec<f32> = rng.normal(rows * v).into_iter().map(|z| (3.0 * z) as f32).collect();
        let tg: Vec<i64> = (0..rows).map(|i| if i % 5 == 4 { -1 } else { rng.below(v) as i64 }).collect();
        let smoothing = 0.1;
        let (total, _, lse_cpu) = cpu_loss::label_smoothing_fused_fwd(&CpuStorage::F32(x.clone()), &tg, v, smoothing, -1).unwrap();
        let xg = CudaStorage::from_cpu(&cuda, &CpuStorage::F32(x)).unwrap();
        let (kl_prod, _, _) = cuda_loss::label_smoothing_fused_fwd(&xg, &tg, v, smoothing, -1).unwrap();
        let kl_prod = f64s(&kl_prod);
        for variant in lab::LABEL_SMOOTHING_FUSED_FWD {
            let (kl, lse) = lab::label_smoothing_fused_fwd(variant, &xg, &tg, v, smoothing, -1).unwrap();
            let (kl, lse) = (f64s(&kl), f64s(&lse));
            let what = format!("{variant} rows={rows} V={v}");
            // f64 accumulation on both sides: only the summation order differs.
            gpu::assert_close(&format!("{what} log-sum-exp"), &lse, &lse_cpu, 1e-12, seed);
            gpu::assert_close(&format!("{what} row KL vs production"), &kl, &kl_prod, 1e-10, seed);
            let sum: f64 = kl.iter().sum();
            assert!((sum - total).abs() <= 1e-10 * total.abs(), "{what}: KL total {sum} vs the CPU's {total} (seed {seed})");
            assert!(tg.iter().zip(&kl).all(|(&t, &k)| t != -1 || k == 0.0), "{what}: ignored rows give 0");
        }
        assert!(lab::label_smoothing_fused_fwd("v9", &xg, &tg, v, smoothing, -1).unwrap_err().to_string().contains("v1_two_pass"));
    }
}

fn f64s(s: &CudaStorage) -> Vec<f64> {
    match s.to_cpu().unwrap() {
        CpuStorage::F64(v) => v,
        other => panic!("expected f64 results, got {:?}", other.dtype()),
    }
}
