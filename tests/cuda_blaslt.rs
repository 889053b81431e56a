//! cuBLASLt done once per shape, on `Cuda(0)` (a GPU, or the emulated one in
//! CI): a repeated `linear` shape reuses its cached plan (no heuristic call)
//! and still reads each call's own bias; `linear`'s weight and bias
//! gradients from one GEMM with the BGRADB epilogue (a column sum where it
//! does not apply) equal the CPU definitions in f32, f16, bf16 and f64 on
//! ragged shapes, with fresh random inputs every run.
//!
//! The tests read the device's counters, so they run one at a time.
#![cfg(feature = "cuda")]

mod common;

use asrforge::backend::cpu::CpuStorage;
use asrforge::backend::cuda::{self, blaslt, CudaDevice, CudaStorage};
use asrforge::tensor::Rng;
use asrforge::{DType, Device};
use half::{bf16, f16};
use std::sync::Arc;

use common::fresh_seed as seed;
use common::gpu::serial;

fn device(test: &str) -> Option<Arc<CudaDevice>> {
    match common::gpu::gpu(test)? {
        Device::Cuda(n) => Some(cuda::device(n).expect("the device gpu() opened")),
        Device::Cpu => None,
    }
}

/// Device storage of `dt` rounded from `v`, and the rounded values exactly.
fn upload(dev: &Arc<CudaDevice>, dt: DType, v: &[f64]) -> (CudaStorage, Vec<f64>) {
    let (h, exact) = match dt {
        DType::F64 => (CpuStorage::F64(v.to_vec()), v.to_vec()),
        DType::F32 => {
            let x: Vec<f32> = v.iter().map(|&a| a as f32).collect();
            let e = x.iter().map(|&a| a as f64).collect();
            (CpuStorage::F32(x), e)
        }
        DType::F16 => {
            let x: Vec<f16> = v.iter().map(|&a| f16::from_f64(a)).collect();
            let e = x.iter().map(|a| a.to_f64()).collect();
            (CpuStorage::F16(x), e)
        }
        DType::BF16 => {
            let x: Vec<bf16> = v.iter().map(|&a| bf16::from_f64(a)).collect();
            let e = x.iter().map(|a| a.to_f64()).collect();
            (CpuStorage::BF16(x), e)
        }
        other => panic!("no uploads of {other:?}"),
    };
    (CudaStorage::from_cpu(dev, &h).expect("upload"), exact)
}

fn values(s: &CudaStorage) -> Vec<f64> {
    match s.to_cpu().expect("download") {
        CpuStorage::F64(v) => v,
        CpuStorage::F32(v) => v.into_iter().map(f64::from).collect(),
        CpuStorage::F16(v) => v.into_iter().map(|x| x.to_f64()).collect(),
        CpuStorage::BF16(v) => v.into_iter().map(|x| x.to_f64()).collect(),
        other => panic!("unexpected storage {other:?}"),
    }
}

/// The floor of a sum of `terms` products of unit normals (see common/gpu.rs).
fn floor(terms: usize) -> f64 {
    (terms as f64).sqrt()
}

#[test]
fn a_repeated_linear_shape_reuses_its_plan_and_reads_each_calls_bias() {
    let Some(dev) = device("a_repeated_linear_shape_reuses_its_plan_and_reads_each_calls_bias") else { return };
    let _s = serial();
    let seed = seed();
    let mut rng = Rng::new(seed);
    for dt in [DType::F32, DType::F16, DType::BF16] {
        // A shape no other test uses (k > 1000), ragged in every dimension.
        let (m, n, k) = (1 + rng.below(70), 1 + rng.below(90), 1001 + rng.below(300));
        let mut heuristics = Vec::new();
        for call in 0..3 {
            let (x, ex) = upload(&dev, dt, &rng.normal(m * k));
            let (w, ew) = upload(&dev, dt, &rng.normal(n * k));
            let (b, eb) = upload(&dev, dt, &rng.normal(n));
            let before = dev.counters();
            let y = blaslt::linear_bias(&x, &w, &b, m, n, k).expect("linear_bias");
            let cost = dev.counters().since(&before);
            assert_eq!((cost.launches, cost.gemms), (1, 1), "{dt:?} call {call}: one cuBLASLt launch");
            heuristics.push(cost.lt_heuristics);
            let want: Vec<f64> = (0..m * n).map(|i| (0..k).map(|l| ex[(i / n) * k + l] * ew[(i % n) * k + l]).sum::<f64>() + eb[i % n]).collect();
            common::gpu::assert_close_floor(
                &format!("linear {dt:?} ({m}, {k}) x ({n}, {k})ᵀ call {call}"),
                &values(&y),
                &want,
                common::gpu::tol(dt),
                floor(k),
                seed,
            );
        }
        assert_eq!(heuristics, vec![1, 0, 0], "{dt:?}: the heuristic runs for the first call of a shape only");
    }
}

#[test]
fn linear_weight_and_bias_gradients_from_one_gemm_equal_the_cpu() {
    let Some(dev) = device("linear_weight_and_bias_gradients_from_one_gemm_equal_the_cpu") else { return };
    let _s = serial();
    let seed = seed();
    let mut rng = Rng::new(seed);
    for dt in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        // Rows below and above a 256-thread block, ragged features.
        for (m, n, k) in [(1 + rng.below(40), 1 + rng.below(30), 1 + rng.below(50)), (300 + rng.below(400), 17 + rng.below(60), 33 + rng.below(40))] {
            let (g, eg) = upload(&dev, dt, &rng.normal(m * n));
            let (x, ex) = upload(&dev, dt, &rng.normal(m * k));
            let before = dev.counters();
            let (dw, db) = blaslt::linear_grad_weight_bias(&g, &x, m, n, k).expect("linear backward");
            let cost = dev.counters().since(&before);
            let want_dw: Vec<f64> = (0..n * k).map(|i| (0..m).map(|r| eg[r * n + i / k] * ex[r * k + i % k]).sum()).collect();
            let want_db: Vec<f64> = (0..n).map(|j| (0..m).map(|r| eg[r * n + j]).sum()).collect();
            let what = format!("{dt:?} g ({m}, {n}), x ({m}, {k})");
            common::gpu::assert_close_floor(&format!("dw {what}"), &values(&dw), &want_dw, common::gpu::tol(dt), floor(m), seed);
            common::gpu::assert_close_floor(&format!("db {what}"), &values(&db), &want_db, common::gpu::tol(dt), floor(m), seed);
            assert_eq!(cost.gemms, 1, "{what}: one product");
            if dt == DType::F64 {
                assert_eq!(cost.launches, 2, "{what}: f64 has no BGRADB: the product and a column sum");
            } else if dev.is_emulated() {
                assert_eq!(cost.launches, 1, "{what}: db comes out of the product's BGRADB epilogue");
            } else {
                println!("{what}: {} launch(es) ({})", cost.launches, if cost.launches == 1 { "BGRADB" } else { "column sum fallback" });
            }
        }
    }
}

#[test]
fn the_workspace_is_obtained_once_and_repeated_shapes_make_no_heuristic_call() {
    let Some(dev) = device("the_workspace_is_obtained_once_and_repeated_shapes_make_no_heuristic_call") else { return };
    let _s = serial();
    let mut rng = Rng::new(seed());
    let (m, n, k) = (5 + rng.below(9), 3 + rng.below(9), 2001 + rng.below(100));
    let run = |rng: &mut Rng| {
        let (x, _) = upload(&dev, DType::F32, &rng.normal(m * k));
        let (w, _) = upload(&dev, DType::F32, &rng.normal(n * k));
        let (b, _) = upload(&dev, DType::F32, &rng.normal(n));
        blaslt::linear_bias(&x, &w, &b, m, n, k).expect("linear_bias")
    };
    drop(run(&mut rng));
    let before = dev.counters();
    for _ in 0..3 {
        drop(run(&mut rng));
    }
    let cost = dev.counters().since(&before);
    assert_eq!(cost.driver_allocs, 0, "the workspace and the buffers come back from caches: {cost:?}");
    assert_eq!(cost.lt_heuristics, 0, "{cost:?}");
    // f64 asks for no BGRADB plan, so the fallback costs no heuristic call after the first of its shape.
    let (g, _) = upload(&dev, DType::F64, &rng.normal(m * n));
    let (x, _) = upload(&dev, DType::F64, &rng.normal(m * k));
    drop(blaslt::linear_grad_weight_bias(&g, &x, m, n, k).expect("f64 backward"));
    let before = dev.counters();
    drop(blaslt::linear_grad_weight_bias(&g, &x, m, n, k).expect("f64 backward"));
    assert_eq!(dev.counters().since(&before).lt_heuristics, 0);
}
