//! The optimizer step on `Cuda(0)`: the fused multi-tensor step
//! (`Adam::fused_step`: unscale, norm, clip and AdamW in two launches and
//! one table copy up, one read-back) against today's per-tensor sequence
//! (`GradScaler::unscale`, `clip_grad_norm`, `Adam::step`: about four
//! launches per tensor and two read-backs), over a conformer-like mix of
//! 200 f32 tensors (weights and biases, 1.04M elements), and the fused step
//! alone over the AISHELL conformer's parameters (`conf/train_conformer.yaml`:
//! 46.2M elements in several hundred tensors, the step the H200 measured at
//! 3.4 ms in 27 launches before the table moved to the device).
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

/// `Cuda(0)`, or `None` after printing why there is none.
fn gpu() -> Option<Device> {
    Device::cuda(0).map_err(|e| println!("optim benches: skipped, no usable GPU: {e}")).ok()
}

fn optim_step(c: &mut Criterion) {
    let Some(gpu) = gpu() else { return };
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

/// The fused step over the AISHELL conformer's own parameters (AMP and
/// clipping on, as in training with fp16).
fn optim_step_conformer(c: &mut Criterion) {
    let Some(gpu) = gpu() else { return };
    // The build tree's config, or the one scripts/gpu-run.sh unpacked beside the benches (run from /tmp there).
    let built = concat!(env!("CARGO_MANIFEST_DIR"), "/conf/train_conformer.yaml");
    let Some(text) = [built, "conf/train_conformer.yaml", "asrforge-device/conf/train_conformer.yaml"].iter().find_map(|p| std::fs::read_to_string(p).ok())
    else {
        println!("optim benches: the AISHELL conformer step skipped, conf/train_conformer.yaml not found");
        return;
    };
    let mut root: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    // The recipe's CMVN file is made by its data preparation: not needed for the parameters.
    if let Some(m) = root.as_mapping_mut() {
        m.remove("cmvn");
        m.remove("cmvn_conf");
    }
    let (cfg, _) = asrforge::models::ModelConfig::from_yaml(&root).unwrap();
    let model = asrforge::models::AsrModel::new(&cfg, DType::F32, &mut Rng::new(0)).unwrap();
    let ps: Vec<(String, Tensor)> = asrforge::nn::Module::named_parameters(&model);
    let mut rng = Rng::new(7);
    let gs: Vec<Tensor> = ps
        .iter()
        .map(|(_, p)| {
            p.move_to_device(&gpu).unwrap();
            Tensor::randn(p.dims().to_vec(), 0.0, 1024.0, DType::F32, &mut rng, &gpu).unwrap()
        })
        .collect();
    let elems: usize = ps.iter().map(|(_, p)| p.elem_count()).sum();
    let mut adam = Adam::new(ps.clone(), AdamConfig { lr: 1e-3, weight_decay: 1e-6, decoupled: true, ..Default::default() }).unwrap();
    let mut group = c.benchmark_group(format!("optim_step_aishell_conformer_{}_tensors_{elems}", ps.len()));
    group.sample_size(10);
    group.bench_function("fused_amp_clip", |b| {
        b.iter(|| {
            for ((_, p), g) in ps.iter().zip(&gs) {
                p.set_grad(Some(g.clone())).unwrap();
            }
            adam.fused_step(1e-3, &FusedOptions { inv_scale: Some(1.0 / 1024.0), max_norm: Some(5.0), ..Default::default() }).unwrap().unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, optim_step, optim_step_conformer);
criterion_main!(benches);
