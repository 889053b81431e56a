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

/// Every variant of the fused CTC's recursion against production, bit for
/// bit (the same operations per state in the same order): per-sequence nll
/// and the whole gradient, on ragged batches with repeated labels (the
/// skip transition barred), an infeasible sequence, an empty input and an
/// empty label; label counts whose L' = 2L + 1 states fit one warp, take two
/// and five states per lane; more sequences than the capped grid's warps.
#[test]
fn every_ctc_variant_equals_production_bit_for_bit() {
    use asrforge::backend::cpu::ctc::CtcDims;
    use asrforge::backend::cuda::ctc as cuda_ctc;
    let Some(dev) = gpu::gpu("every_ctc_variant_equals_production_bit_for_bit") else { return };
    let Device::Cuda(ordinal) = dev else { panic!("a CUDA device") };
    let cuda = asrforge::backend::cuda::device(ordinal).unwrap();
    let seed = seed();
    let mut rng = Rng::new(seed);
    for (b, t, v, s) in [(5, 12, 7, 4), (3, 40, 9, 25), (37, 9, 6, 3), (2, 160, 11, 70)] {
        let x: Vec<f32> = rng.normal(b * t * v).into_iter().map(|z| (2.0 * z) as f32).collect();
        let mut il: Vec<usize> = (0..b).map(|_| 1 + rng.below(t)).collect();
        let mut tl: Vec<usize> = il.iter().map(|&i| rng.below((i / 2).min(s) + 1)).collect();
        // Labels from a small alphabet (repeats are common), never the blank 0.
        let mut tg: Vec<i64> = (0..b * s).map(|_| 1 + rng.below(3.min(v - 1)) as i64).collect();
        il[0] = t;
        tl[0] = s.min(t / 2);
        if b > 2 {
            // Infeasible: more labels than frames. Then an empty input.
            (il[1], tl[1]) = (2, s.min(3));
            (il[2], tl[2]) = (0, 0);
            tg[s..2 * s].iter_mut().for_each(|l| *l = 1);
        }
        let d = CtcDims { b, t, v, s, blank: 0 };
        let xg = CudaStorage::from_cpu(&cuda, &CpuStorage::F32(x)).unwrap();
        let (nll_p, g_p) = cuda_ctc::ctc_loss_fused(&xg, &tg, &il, &tl, &d, true).unwrap();
        let (nll_p, g_p) = (f64s(&nll_p), f32s(&g_p.unwrap()));
        for variant in lab::CTC_LOSS_FUSED {
            let what = format!("{variant} B={b} T={t} V={v} S={s}");
            let (nll, g) = lab::ctc_loss_fused(variant, &xg, &tg, &il, &tl, &d, true).unwrap();
            let (nll, g) = (f64s(&nll), f32s(&g.unwrap()));
            assert!(nll_p.iter().any(|l| l.is_finite() && *l > 0.0), "{what}: production gave no finite loss (seed {seed})");
            for (i, (a, p)) in nll.iter().zip(&nll_p).enumerate() {
                assert_eq!(a.to_bits(), p.to_bits(), "{what}: nll of sequence {i}: {a} vs production {p} (seed {seed})");
            }
            let diff = g.iter().zip(&g_p).position(|(a, p)| a.to_bits() != p.to_bits());
            assert!(diff.is_none(), "{what}: gradient element {diff:?} differs from production (seed {seed})");
            let (nll_n, g_n) = lab::ctc_loss_fused(variant, &xg, &tg, &il, &tl, &d, false).unwrap();
            assert!(g_n.is_none() && f64s(&nll_n).iter().zip(&nll_p).all(|(a, p)| a.to_bits() == p.to_bits()), "{what}: without the gradient");
        }
        assert!(lab::ctc_loss_fused("v9", &xg, &tg, &il, &tl, &d, true).unwrap_err().to_string().contains("v1_warp_per_sequence"));
    }
}

fn f32s(s: &CudaStorage) -> Vec<f32> {
    match s.to_cpu().unwrap() {
        CpuStorage::F32(v) => v,
        other => panic!("expected f32 results, got {:?}", other.dtype()),
    }
}
