//! The optimizer step on `Cuda(0)`: the fused multi-tensor step
//! (`Adam::fused_step`: unscale, norm, clip and AdamW in 2·tables + 1
//! launches, one read-back) against today's per-tensor sequence
//! (`GradScaler::unscale`, `clip_grad_norm`, `Adam::step`: about four
//! launches per tensor and two read-backs), over a conformer-like mix of
//! 200 f32 tensors (weights and biases, 1.04M elements).
//!
//! Without a GPU it prints why and benches nothing; under
//! `ASRFORGE_CUDA_EMU=1` it runs on the emulator, which only shows that it
//! runs: its timings mean something on a GPU.

use asrforge::optim::{clip_grad_norm, Adam, AdamConfig, FusedOptions, GradScaler, ScalerConfig};
use asrforge::tensor::{DType, Device, Rng, Tensor};
use criterion::{criterion_group, criterion_main, Criterion};

/// 50 layers of a 64×64 weight, a 64-bias, a 64×256 weight and a 256-bias.
fn shapes() -> Vec<Vec<usize>> {
    (0..50).flat_map(|_| [vec![64, 64], vec![64], vec![64, 256], vec![256]]).collect()
}

fn optim_step(c: &mut Criterion) {
    let gpu = match Device::cuda(0) {
        Ok(d) => d,
        Err(e) => {
            println!("optim benches: skipped, no usable GPU: {e}");
            return;
        }
    };
    let mut rng = Rng::new(7);
    let make = |rng: &mut Rng| -> (Vec<(String, Tensor)>, Vec<Tensor>) {
        let shapes = shapes();
        let ps: Vec<(String, Tensor)> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("p{i}"), Tensor::randn(s.clone(), 0.0, 0.02, DType::F32, rng, &gpu).unwrap().requires_grad_()))
            .collect();
        let gs = shapes.iter().map(|s| Tensor::randn(s.clone(), 0.0, 1024.0, DType::F32, rng, &gpu).unwrap()).collect();
        (ps, gs)
    };
    let cfg = AdamConfig { lr: 1e-3, weight_decay: 0.01, decoupled: true, ..Default::default() };
    let inv = 1.0 / 1024.0;
    let mut group = c.benchmark_group("optim_step_200_tensors");
    group.sample_size(10);

    let (ps, gs) = make(&mut rng);
    let mut adam = Adam::new(ps.clone(), cfg).unwrap();
    group.bench_function("fused_amp_clip", |b| {
        b.iter(|| {
            for ((_, p), g) in ps.iter().zip(&gs) {
                p.set_grad(Some(g.clone())).unwrap();
            }
            adam.fused_step(1e-3, &FusedOptions { inv_scale: Some(inv), max_norm: Some(1.0), ..Default::default() }).unwrap().unwrap()
        })
    });

    let (ps, gs) = make(&mut rng);
    let mut adam = Adam::new(ps.clone(), cfg).unwrap();
    let mut scaler = GradScaler::new(ScalerConfig { init_scale: 1.0 / inv, ..Default::default() });
    group.bench_function("per_tensor_amp_clip", |b| {
        b.iter(|| {
            for ((_, p), g) in ps.iter().zip(&gs) {
                p.set_grad(Some(g.clone())).unwrap();
            }
            let bad = scaler.unscale(&ps).unwrap();
            let norm = clip_grad_norm(&ps, 1.0).unwrap();
            if !bad && norm.is_finite() {
                adam.step(1e-3).unwrap();
            }
            norm
        })
    });
    group.finish();
}

criterion_group!(benches, optim_step);
criterion_main!(benches);
