//! The fused multi-tensor optimizer step on `Cuda(0)` (`Adam::fused_step`,
//! cuda/optim.cu `mt_*`) against today's per-tensor sequence on the same
//! device (`GradScaler::unscale`, the clip's elementwise scale, `Adam::step`)
//! on fresh random tensors of ragged sizes: parameters and both moments
//! bit for bit in f32 and f64 over several steps, with and without the AMP
//! unscale, clipping active and inactive, Adam's L2 decay and AdamW's
//! decoupled one; chunk sizes that split tensors and leave tensors smaller
//! than a chunk, and enough tensors and chunks that the tables overflow into
//! more chunks than the grid (so every block runs several). The global norm
//! agrees with an f64 norm computed here to 1e-12 relative; an inf or a NaN
//! skips the step and is reported; one step costs two launches per dtype
//! (however many tensors and chunks), one copy of its table to the device
//! and one host synchronisation; f32 and f64 parameters in one step fold
//! both launches' partials into one norm.
//!
//! The harness of `common::gpu` poisons fresh allocations and caps the 1-D
//! grid at 37 blocks, so the chunk loops wrap (run the file once more with
//! `ASRFORGE_CUDA_MAX_GRID=100000` for grids that do not).

mod common;

use asrforge::backend::cuda::optim::FUSED_CHUNK;
use asrforge::engine::update::replicated_step;
use asrforge::ops;
use asrforge::optim::{clip_grad_norm, Adam, AdamConfig, FusedOptions, GradScaler, ScalerConfig};
use asrforge::tensor::{DType, Device, Rng, Tensor};
use common::gpu;
use std::sync::{Mutex, MutexGuard};

/// The device's counters count every thread's work: the tests of this file
/// run one at a time so that a test's counts are its own.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec().unwrap()
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn on(dev: &Device, v: &[f64], dt: DType) -> Tensor {
    let t = Tensor::from_vec(v.to_vec(), vec![v.len()], &Device::Cpu).unwrap();
    ops::to_dtype(&t, dt).unwrap().to_device(dev).unwrap()
}

/// Ragged sizes: single elements, sizes around a 256-element chunk, a
/// tensor of 17 chunks of 256, one of 201 (more than one table holds), and
/// `extra` more of random sizes.
fn sizes(rng: &mut Rng, extra: usize) -> Vec<usize> {
    let mut s = vec![1, 7, 255, 256, 257, 4097, 3, 51_201, 1000, 513];
    s.extend((0..extra).map(|_| 1 + rng.below(1500)));
    s
}

fn params(dev: &Device, init: &[Vec<f64>], dt: DType) -> Vec<(String, Tensor)> {
    init.iter().enumerate().map(|(i, v)| (format!("p{i}"), on(dev, v, dt).requires_grad_())).collect()
}

fn set_grads(ps: &[(String, Tensor)], grads: &[Vec<f64>], dev: &Device, dt: DType) {
    for ((_, p), g) in ps.iter().zip(grads) {
        p.set_grad(Some(on(dev, g, dt))).unwrap();
    }
}

/// Parameters then moments, as f64 values (exact for f32).
fn snapshot(ps: &[(String, Tensor)], adam: &Adam) -> Vec<Vec<f64>> {
    let mut all: Vec<Vec<f64>> = ps.iter().map(|(_, p)| vals(p)).collect();
    all.extend(adam.state().iter().map(|(_, t)| vals(t)));
    all
}

/// g·T(inv) rounded to `dt`, as the unscale kernel computes it.
fn unscaled(g: f64, inv: Option<f64>, dt: DType) -> f64 {
    match (inv, dt) {
        (None, _) => g,
        (Some(s), DType::F32) => ((g as f32) * (s as f32)) as f64,
        (Some(s), _) => g * s,
    }
}

/// The f64 norm of the unscaled gradients, summed in order here.
fn norm_here(grads: &[Vec<f64>], inv: Option<f64>, dt: DType) -> f64 {
    grads.iter().flatten().map(|&g| unscaled(if dt == DType::F32 { g as f32 as f64 } else { g }, inv, dt)).map(|u| u * u).sum::<f64>().sqrt()
}

/// Today's per-tensor sequence: unscale, clip with the coefficient of
/// `norm` (computed as clip.rs does), Adam. The fused step's norm is passed
/// in because the two sums are grouped differently, so their last bits may
/// differ, and f64 gradients are scaled by the coefficient at full precision.
fn per_tensor_step(ps: &[(String, Tensor)], adam: &mut Adam, lr: f64, inv: Option<f64>, max_norm: Option<f64>, norm: f64) {
    if let Some(inv) = inv {
        let mut s = GradScaler::new(ScalerConfig { init_scale: 1.0 / inv, ..Default::default() });
        assert!(!s.unscale(ps).unwrap(), "clean gradients");
    }
    if let Some(m) = max_norm {
        if norm > m {
            let c = m / (norm + 1e-6);
            for (_, p) in ps {
                p.set_grad(Some(ops::mul_scalar(&p.grad().unwrap(), c).unwrap())).unwrap();
            }
        }
    }
    adam.step(lr).unwrap();
    adam.zero_grad();
}

#[test]
fn fused_step_equals_the_per_tensor_sequence_bit_for_bit() {
    let _serial = serial();
    let Some(gpu) = gpu::gpu("fused_step_equals_the_per_tensor_sequence_bit_for_bit") else { return };
    let seed = common::fresh_seed();
    let mut rng = Rng::new(seed);
    // 10 + 50 = 60 tensors, more than 232 chunks of 256: several chunks per
    // block of the harness's capped grid (37 blocks).
    let sz = sizes(&mut rng, 50);
    assert!(sz.iter().map(|n| n.div_ceil(256)).sum::<usize>() > 6 * 37, "the chunk loops wrap");
    let cases = [
        // (dtype, amp inverse scale, clip factor of the first norm, decoupled, wd, chunk)
        (DType::F32, None, None, false, 0.0, 256),
        (DType::F32, Some(1.0 / 1024.0), Some(0.3), true, 0.01, 256),
        (DType::F32, Some(1.0 / 3.0), Some(3.0), false, 0.01, 1000),
        // A scale that is not a power of two: the unscale and the clip round differently in either order.
        (DType::F32, Some(1.0 / 3.0), Some(0.3), false, 0.01, 256),
        (DType::F32, None, Some(0.5), false, 0.0, FUSED_CHUNK),
        (DType::F32, Some(1.0 / 65536.0), None, true, 0.1, 97),
        (DType::F64, None, Some(0.3), true, 0.01, 256),
        (DType::F64, Some(1.0 / 3.0), Some(3.0), false, 0.01, 4096),
        (DType::F64, Some(1.0 / 3.0), Some(0.5), true, 0.0, 1000),
        (DType::F64, Some(1.0 / 512.0), None, false, 0.0, 256),
    ];
    for (dt, inv, clip, decoupled, wd, chunk) in cases {
        let what = format!("{dt:?} inv_scale={inv:?} clip={clip:?} decoupled={decoupled} wd={wd} chunk={chunk}");
        let init: Vec<Vec<f64>> = sz.iter().map(|&n| rng.normal(n)).collect();
        let cfg = AdamConfig { lr: 1e-2, weight_decay: wd, decoupled, ..Default::default() };
        let (fused_ps, ref_ps) = (params(&gpu, &init, dt), params(&gpu, &init, dt));
        let (mut fused, mut reference) = (Adam::new(fused_ps.clone(), cfg).unwrap(), Adam::new(ref_ps.clone(), cfg).unwrap());
        let scale = inv.map_or(1.0, |s| 1.0 / s);
        let mut max_norm = None;
        let mut clipped = 0;
        for step in 0..3 {
            let grads: Vec<Vec<f64>> = sz.iter().map(|&n| rng.normal(n).into_iter().map(|x| x * scale).collect()).collect();
            let want_norm = norm_here(&grads, inv, dt);
            // The clip threshold is fixed from the first step's norm: a factor
            // below 1 clips every step, above 1 never does.
            let m = *max_norm.get_or_insert(clip.map(|f| f * want_norm));
            let lr = 3e-3 * (step + 1) as f64;
            set_grads(&fused_ps, &grads, &gpu, dt);
            let out = fused.fused_step(lr, &FusedOptions { inv_scale: inv, max_norm: m, chunk }).unwrap().expect("every tensor is on the GPU");
            assert!(!out.found_inf && !out.skipped, "{what} step {step}: a clean step, got {out:?}");
            assert!((out.grad_norm - want_norm).abs() <= 1e-12 * want_norm, "{what} step {step}: norm {} vs f64 {want_norm}", out.grad_norm);
            for ((_, p), g) in fused_ps.iter().zip(&grads) {
                assert_eq!(bits(&vals(&p.grad().unwrap())), bits(&vals(&on(&Device::Cpu, g, dt))), "{what}: the gradients are left as they were");
            }
            fused.zero_grad();
            clipped += m.is_some_and(|m| out.grad_norm > m) as usize;
            set_grads(&ref_ps, &grads, &gpu, dt);
            per_tensor_step(&ref_ps, &mut reference, lr, inv, m, out.grad_norm);
            let (got, want) = (snapshot(&fused_ps, &fused), snapshot(&ref_ps, &reference));
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(bits(g), bits(w), "{what} step {step}: tensor {i} of {} (params, then moments) differs (seed {seed})", got.len());
            }
            assert_eq!(fused.step, reference.step);
        }
        assert_eq!(clipped, if clip.is_some_and(|f| f < 1.0) { 3 } else { 0 }, "{what}: clipping active as intended");
        assert_ne!(bits(&vals(&fused_ps[5].1)), bits(&vals(&on(&Device::Cpu, &init[5], dt))), "{what}: the step moved the parameters");
    }
}

#[test]
fn norm_clipping_and_counts_of_a_large_step() {
    let _serial = serial();
    let Some(gpu) = gpu::gpu("norm_clipping_and_counts_of_a_large_step") else { return };
    let seed = common::fresh_seed();
    let mut rng = Rng::new(seed);
    // Default chunks of 65536: a tensor of 5 chunks with a short last one, and small ones.
    let sz = [300_001usize, 5, 65_536, 1];
    let init: Vec<Vec<f64>> = sz.iter().map(|&n| rng.normal(n)).collect();
    let grads: Vec<Vec<f64>> = sz.iter().map(|&n| rng.normal(n)).collect();
    let cfg = AdamConfig { lr: 1e-3, weight_decay: 0.01, decoupled: true, ..Default::default() };
    let (fused_ps, ref_ps) = (params(&gpu, &init, DType::F32), params(&gpu, &init, DType::F32));
    let (mut fused, mut reference) = (Adam::new(fused_ps.clone(), cfg).unwrap(), Adam::new(ref_ps.clone(), cfg).unwrap());
    set_grads(&fused_ps, &grads, &gpu, DType::F32);
    set_grads(&ref_ps, &grads, &gpu, DType::F32);
    let want = norm_here(&grads, None, DType::F32);
    let dev = asrforge::backend::cuda::device(0).unwrap();
    let before = dev.counters();
    let out = fused.fused_step(1e-3, &FusedOptions { max_norm: Some(want / 2.0), ..Default::default() }).unwrap().unwrap();
    let cost = dev.counters().since(&before);
    // A norm launch (whose last block decides the step), an update launch,
    // the table's copy up and the outcome's read-back (the harness's poison
    // fills of the new buffers are memsets, so those are not counted here).
    assert_eq!((cost.launches, cost.htod_copies, cost.host_syncs), (2, 1, 1), "one fused step: {cost:?}");
    assert!((out.grad_norm - want).abs() <= 1e-12 * want, "norm {} vs f64 {want} (seed {seed})", out.grad_norm);
    // Today's clip_grad_norm computes its own norm (grouped by tensor): the same to rounding.
    let today = clip_grad_norm(&ref_ps, want / 2.0).unwrap();
    assert!((today - out.grad_norm).abs() <= 1e-12 * want, "norm {} vs today's {today}", out.grad_norm);
    reference.step(1e-3).unwrap();
    // So today's whole sequence, its own norm included, gives the same bits
    // (the two norms' coefficients round to one f32 but with odds of ~2⁻²⁹).
    let (got, want_v) = (snapshot(&fused_ps, &fused), snapshot(&ref_ps, &reference));
    for (i, (g, w)) in got.iter().zip(&want_v).enumerate() {
        assert_eq!(bits(g), bits(w), "tensor {i} (seed {seed})");
    }
    // However many tensors: still two launches and one copy.
    let many: Vec<Vec<f64>> = (0..700).map(|_| rng.normal(3)).collect();
    let ps = params(&gpu, &many, DType::F32);
    let mut adam = Adam::new(ps.clone(), cfg).unwrap();
    set_grads(&ps, &many, &gpu, DType::F32);
    let before = dev.counters();
    adam.fused_step(1e-3, &FusedOptions::default()).unwrap().unwrap();
    let cost = dev.counters().since(&before);
    assert_eq!((cost.launches, cost.htod_copies, cost.host_syncs), (2, 1, 1), "{} tensors: {cost:?}", many.len());
    // The kept arrival counter the norm's fold used is back at 0.
    assert!(asrforge::backend::cuda::kept_arrivals(0).unwrap().is_some_and(|c| c.iter().all(|&x| x == 0)), "the arrival counters are left at 0");
}

/// f32 and f64 parameters in one step: a norm and an update launch per
/// dtype, the second norm launch folding both launches' partials into the
/// one global norm; the parameters and moments equal the per-tensor
/// sequence's bit for bit, clipping included, with an inf in either dtype
/// skipping the whole step.
#[test]
fn mixed_dtypes_share_one_norm_and_one_decision() {
    let _serial = serial();
    let Some(gpu) = gpu::gpu("mixed_dtypes_share_one_norm_and_one_decision") else { return };
    let seed = common::fresh_seed();
    let mut rng = Rng::new(seed);
    let sz = sizes(&mut rng, 8);
    // Interleaved dtypes: the groups' chunks are numbered group by group, not in slot order.
    let dts: Vec<DType> = (0..sz.len()).map(|i| if i % 3 == 1 { DType::F64 } else { DType::F32 }).collect();
    let init: Vec<Vec<f64>> = sz.iter().map(|&n| rng.normal(n)).collect();
    let mk =
        || -> Vec<(String, Tensor)> { init.iter().zip(&dts).enumerate().map(|(i, (v, &dt))| (format!("p{i}"), on(&gpu, v, dt).requires_grad_())).collect() };
    let set = |ps: &[(String, Tensor)], grads: &[Vec<f64>]| {
        for (((_, p), g), &dt) in ps.iter().zip(grads).zip(&dts) {
            p.set_grad(Some(on(&gpu, g, dt))).unwrap();
        }
    };
    let cfg = AdamConfig { lr: 1e-2, weight_decay: 0.01, decoupled: true, ..Default::default() };
    let (fused_ps, ref_ps) = (mk(), mk());
    let (mut fused, mut reference) = (Adam::new(fused_ps.clone(), cfg).unwrap(), Adam::new(ref_ps.clone(), cfg).unwrap());
    let dev = asrforge::backend::cuda::device(0).unwrap();
    for step in 0..3 {
        let mut grads: Vec<Vec<f64>> = sz.iter().map(|&n| rng.normal(n)).collect();
        let want: f64 = grads
            .iter()
            .zip(&dts)
            .flat_map(|(g, &dt)| g.iter().map(move |&x| if dt == DType::F32 { x as f32 as f64 } else { x }))
            .map(|x| x * x)
            .sum::<f64>()
            .sqrt();
        let m = Some(want / 2.0);
        if step == 2 {
            // An inf in an f64 tensor (the first launch's) skips everything.
            grads[1][0] = f64::INFINITY;
        }
        set(&fused_ps, &grads);
        let before = dev.counters();
        let out = fused.fused_step(1e-3, &FusedOptions { max_norm: m, chunk: 256, ..Default::default() }).unwrap().unwrap();
        let cost = dev.counters().since(&before);
        assert_eq!((cost.launches, cost.htod_copies, cost.host_syncs), (4, 1, 1), "step {step}: two dtypes: {cost:?}");
        fused.zero_grad();
        if step == 2 {
            assert!(out.found_inf && out.skipped, "step {step}: {out:?} (seed {seed})");
        } else {
            assert!(!out.skipped && (out.grad_norm - want).abs() <= 1e-12 * want, "step {step}: norm {} vs f64 {want} (seed {seed})", out.grad_norm);
            set(&ref_ps, &grads);
            per_tensor_step(&ref_ps, &mut reference, 1e-3, None, m, out.grad_norm);
        }
        let (got, want_v) = (snapshot(&fused_ps, &fused), snapshot(&ref_ps, &reference));
        for (i, (g, w)) in got.iter().zip(&want_v).enumerate() {
            assert_eq!(bits(g), bits(w), "step {step}: tensor {i} (seed {seed})");
        }
    }
    assert_eq!((fused.step, reference.step), (2, 2));
}

#[test]
fn an_inf_or_nan_skips_the_step_and_is_reported() {
    let _serial = serial();
    let Some(gpu) = gpu::gpu("an_inf_or_nan_skips_the_step_and_is_reported") else { return };
    let seed = common::fresh_seed();
    let mut rng = Rng::new(seed);
    let sz = sizes(&mut rng, 44);
    for dt in [DType::F32, DType::F64] {
        for (bad, inv) in [(f64::INFINITY, Some(1.0 / 1024.0)), (f64::NAN, Some(1.0 / 1024.0)), (f64::NEG_INFINITY, None), (f64::NAN, None)] {
            let init: Vec<Vec<f64>> = sz.iter().map(|&n| rng.normal(n)).collect();
            let ps = params(&gpu, &init, dt);
            let mut adam = Adam::new(ps.clone(), AdamConfig { weight_decay: 0.01, decoupled: true, ..Default::default() }).unwrap();
            // One clean step first, so the moments are not zero.
            set_grads(&ps, &init, &gpu, dt);
            adam.fused_step(1e-3, &FusedOptions { chunk: 256, ..Default::default() }).unwrap().unwrap();
            let before = snapshot(&ps, &adam);
            let mut grads: Vec<Vec<f64>> = sz.iter().map(|&n| rng.normal(n)).collect();
            // In a random tensor at a random element (chunks of 256: one of a later block's chunks, mostly).
            let which = rng.below(sz.len());
            let at = rng.below(grads[which].len());
            grads[which][at] = bad;
            set_grads(&ps, &grads, &gpu, dt);
            let what = format!("{dt:?} {bad} at tensor {which}[{at}] inv_scale={inv:?} (seed {seed})");
            let out = adam.fused_step(1e-3, &FusedOptions { inv_scale: inv, max_norm: Some(1.0), chunk: 256 }).unwrap().unwrap();
            assert!(out.found_inf && out.skipped && !out.grad_norm.is_finite(), "{what}: {out:?}");
            assert_eq!(adam.step, 1, "{what}: a skipped step does not count");
            let after = snapshot(&ps, &adam);
            for (i, (a, b)) in after.iter().zip(&before).enumerate() {
                assert_eq!(bits(a), bits(b), "{what}: tensor {i} changed");
            }
        }
    }
}

#[test]
fn replicated_step_takes_the_fused_path_and_feeds_the_scaler() {
    let _serial = serial();
    let Some(gpu) = gpu::gpu("replicated_step_takes_the_fused_path_and_feeds_the_scaler") else { return };
    let seed = common::fresh_seed();
    let mut rng = Rng::new(seed);
    let sz = sizes(&mut rng, 3);
    let init: Vec<Vec<f64>> = sz.iter().map(|&n| rng.normal(n)).collect();
    let cfg = AdamConfig { lr: 1e-3, ..Default::default() };
    let (gps, cps) = (params(&gpu, &init, DType::F32), params(&Device::Cpu, &init, DType::F32));
    let (mut ga, mut ca) = (Adam::new(gps.clone(), cfg).unwrap(), Adam::new(cps.clone(), cfg).unwrap());
    let scaler_cfg = ScalerConfig { init_scale: 1024.0, growth_interval: 2, ..Default::default() };
    let (mut gs, mut cs) = (GradScaler::new(scaler_cfg), GradScaler::new(scaler_cfg));
    let dev = asrforge::backend::cuda::device(0).unwrap();
    for step in 0..4 {
        let mut grads: Vec<Vec<f64>> = sz.iter().map(|&n| rng.normal(n).into_iter().map(|x| x * gs.scale).collect()).collect();
        if step == 2 {
            grads[3][17] = f64::NAN;
        }
        set_grads(&gps, &grads, &gpu, DType::F32);
        set_grads(&cps, &grads, &Device::Cpu, DType::F32);
        let before = dev.counters();
        let g = replicated_step(&gps, &mut ga, 1e-3, 0.0, Some(&mut gs)).unwrap();
        let cost = dev.counters().since(&before);
        let c = replicated_step(&cps, &mut ca, 1e-3, 0.0, Some(&mut cs)).unwrap();
        assert_eq!(cost.host_syncs, 1, "step {step}: one read-back");
        assert_eq!(g.skipped, step == 2, "step {step}");
        assert_eq!(g.skipped, c.skipped, "step {step}");
        assert!(gps.iter().all(|(_, p)| p.grad().is_none()), "step {step}: the gradients are cleared");
        if !g.skipped {
            assert!((g.grad_norm - c.grad_norm).abs() <= 1e-12 * c.grad_norm, "step {step}: norm {} vs the CPU's {}", g.grad_norm, c.grad_norm);
        }
        gs.update();
        cs.update();
        assert_eq!((gs.scale, gs.skipped), (cs.scale, cs.skipped), "step {step}: the scaler saw the same");
        // The per-tensor Adam on the CPU rounds as the GPU's: bit for bit.
        for ((_, a), (_, b)) in gps.iter().zip(&cps) {
            assert_eq!(bits(&vals(a)), bits(&vals(b)), "step {step} (seed {seed})");
        }
    }
    assert_eq!((ga.step, gs.skipped), (3, 1));
}
