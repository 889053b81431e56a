//! The loss and optimizer kernels on `Cuda(0)` against the CPU backend on
//! fresh random inputs: CTC (values for every reduction, zero_infinity, and
//! the gradient), label smoothing (both normalisations, value and
//! gradient), token accuracy (against its definition too), the Adam/AdamW step, the global gradient norm (and that it is
//! bit-identical run to run) and the fused unscale-and-check-for-inf (a
//! planted inf or NaN is found), and moving a tensor in place. Outputs are poisoned with NaN before every
//! kernel (`ASRFORGE_CUDA_POISON=1`), so an element a kernel never writes
//! fails; NaN never passes a comparison. Without a usable GPU every test
//! prints that it skipped and why (and fails where a GPU is required).
//!
//! Closeness, poisoning and the grid cap come from the harness of
//! `common::gpu` (f32 1e-5, f64 1e-10 per element with the RMS floor).

mod common;

use asrforge::autograd::backward;
use asrforge::ops::{self, Reduction};
use asrforge::optim::{clip_grad_norm, grad_norm, Adam, AdamConfig, GradScaler, ScalerConfig};
use asrforge::tensor::{DType, Device, Rng, Tensor};
use common::gpu;

fn seed() -> u64 {
    common::fresh_seed()
}

fn rtol(dt: DType) -> f64 {
    gpu::tol(dt)
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec().unwrap()
}

fn on(dev: &Device, v: &[f64], shape: &[usize], dt: DType) -> Tensor {
    let t = Tensor::from_vec(v.to_vec(), shape.to_vec(), &Device::Cpu).unwrap();
    ops::to_dtype(&t, dt).unwrap().to_device(dev).unwrap()
}

/// Log-softmax of standard normal logits, (B, T, V), as f64 values.
fn log_probs(rng: &mut Rng, b: usize, t: usize, v: usize) -> Vec<f64> {
    let x = Tensor::from_vec(rng.normal(b * t * v), [b, t, v], &Device::Cpu).unwrap();
    vals(&ops::log_softmax(&x).unwrap())
}

#[test]
fn ctc_matches_the_cpu() {
    let Some(gpu) = gpu::gpu("ctc_matches_the_cpu") else { return };
    let seed = seed();
    let mut rng = Rng::new(seed);
    let (b, t, v, s) = (5, 24, 7, 6);
    let lp = log_probs(&mut rng, b, t, v);
    // Sequence 1 has a repeat, 2 is empty, 3 cannot be aligned (five equal
    // labels need 9 frames, it has 5), 4 contains the blank id.
    let targets = ctc_targets(&mut rng, b, s, v);
    let il = [24, 19, 10, 5, 16];
    let tl = [6, 4, 0, 5, 5];
    let tg_cpu = Tensor::from_vec(targets.clone(), [b, s], &Device::Cpu).unwrap();
    let tg_gpu = tg_cpu.clone().to_device(&gpu).unwrap();
    for dt in [DType::F32, DType::F64] {
        let x_cpu = on(&Device::Cpu, &lp, &[b, t, v], dt);
        let x_gpu = on(&gpu, &lp, &[b, t, v], dt);
        for red in [Reduction::None, Reduction::Sum, Reduction::Mean] {
            for zi in [false, true] {
                let want = ops::ctc_loss(&x_cpu, &tg_cpu, &il, &tl, 0, red, zi).unwrap();
                let got = ops::ctc_loss(&x_gpu, &tg_gpu, &il, &tl, 0, red, zi).unwrap();
                assert_eq!(got.device(), gpu);
                gpu::assert_close_or_same_inf(&format!("ctc {dt:?} {red:?} zero_infinity={zi}"), &vals(&got), &vals(&want), rtol(dt), seed);
            }
        }
        assert!(vals(&ops::ctc_loss(&x_cpu, &tg_cpu, &il, &tl, 0, Reduction::None, false).unwrap())[3].is_infinite(), "sequence 3 is impossible");
        // The gradient, weighted per sequence by random seeds.
        let w: Vec<f64> = rng.normal(b);
        let mut grads = vec![];
        for dev in [Device::Cpu, gpu] {
            let x = on(&dev, &lp, &[b, t, v], dt).requires_grad_();
            let tg = if dev == Device::Cpu { tg_cpu.clone() } else { tg_gpu.clone() };
            let per = ops::ctc_loss(&x, &tg, &il, &tl, 0, Reduction::None, true).unwrap();
            let loss = ops::sum_all(&ops::mul(&per, &on(&dev, &w, &[b], dt)).unwrap()).unwrap();
            backward(&loss).unwrap();
            grads.push(vals(&x.grad().unwrap()));
        }
        assert!(grads[0].iter().any(|g| g.abs() > 1e-3), "the gradient is not trivial");
        gpu::assert_close(&format!("ctc grad {dt:?}"), &grads[1], &grads[0], rtol(dt), seed);
    }
}

/// A CTC batch of 5 sequences of T frames over V symbols (logits 2·N(0, 1))
/// with targets of up to 6 labels: repeats (sequence 1), an empty label
/// (2), an impossible one (3: 5 repeated labels need 9 frames), the blank
/// id as a label (4), and padded frames.
struct CtcCase {
    b: usize,
    x: Vec<f64>,
    targets: Tensor,
    il: [usize; 5],
    tl: [usize; 5],
}

/// Random labels (1..V) of b sequences of s, then planted: a repeat (4, 4)
/// opening sequence 1, five equal labels in sequence 3, the blank id (0) in
/// sequence 4.
fn ctc_targets(rng: &mut Rng, b: usize, s: usize, v: usize) -> Vec<i64> {
    let mut targets: Vec<i64> = (0..b * s).map(|_| 1 + rng.below(v - 1) as i64).collect();
    targets[s] = 4;
    targets[s + 1] = 4;
    for j in 0..5 {
        targets[3 * s + j] = 2;
    }
    targets[4 * s + 2] = 0;
    targets
}

fn ctc_case(rng: &mut Rng, t: usize, v: usize) -> CtcCase {
    let (b, s) = (5, 6);
    let x: Vec<f64> = rng.normal(b * t * v).into_iter().map(|z| 2.0 * z).collect();
    let targets = ctc_targets(rng, b, s, v);
    let il = [t, t - 5, t / 2, 5, t - 8];
    let tl = [6.min(t / 2), 4, 0, 5, 3];
    CtcCase { b, x, targets: Tensor::from_vec(targets, [b, s], &Device::Cpu).unwrap(), il, tl }
}

/// The fused CTC (log-softmax folded into the kernels, the fusion switch's
/// `loss` family) against the composition ctc_loss(log_softmax(x)) on the
/// CPU: losses and gradients with respect to the logits, on both devices,
/// over sequences with repeats, an empty label, an impossible one, the
/// blank id as a label, padded frames, and V wider than a block.
#[test]
fn ctc_fused_matches_the_composition() {
    let Some(gpu) = gpu::gpu("ctc_fused_matches_the_composition") else { return };
    let seed = seed();
    let mut rng = Rng::new(seed);
    for (t, v) in [(24, 7), (9, 600)] {
        let CtcCase { b, x, targets, il, tl } = ctc_case(&mut rng, t, v);
        let tg_cpu = targets;
        let tg_gpu = tg_cpu.clone().to_device(&gpu).unwrap();
        let w: Vec<f64> = rng.normal(b);
        for dt in [DType::F32, DType::F64] {
            let mut out = vec![];
            for (fused, dev) in [(false, Device::Cpu), (true, Device::Cpu), (true, gpu), (false, gpu)] {
                let xt = on(&dev, &x, &[b, t, v], dt).requires_grad_();
                let tg = if dev == Device::Cpu { &tg_cpu } else { &tg_gpu };
                let per = if fused {
                    ops::ctc_loss_fused(&xt, tg, &il, &tl, 0, Reduction::None, true).unwrap()
                } else {
                    ops::ctc_loss(&ops::log_softmax(&xt).unwrap(), tg, &il, &tl, 0, Reduction::None, true).unwrap()
                };
                let loss = ops::sum_all(&ops::mul(&per, &on(&dev, &w, &[b], dt)).unwrap()).unwrap();
                backward(&loss).unwrap();
                out.push((format!("fused={fused} on {dev:?}"), vals(&per), vals(&xt.grad().unwrap())));
            }
            let (_, ref_nll, ref_grad) = &out[0];
            assert_eq!(ref_nll[3], 0.0, "the impossible sequence's loss is zeroed");
            assert!(ref_grad.iter().any(|g| g.abs() > 1e-3), "the gradient is not trivial");
            // Padded frames of sequence 1 have no gradient.
            assert!(ref_grad[(t * v + (t - 5) * v)..(2 * t * v)].iter().all(|&g| g == 0.0));
            for (name, nll, grad) in &out[1..] {
                let tol = rtol(dt).max(1e-6);
                gpu::assert_close(&format!("ctc T={t} V={v} {dt:?} {name}"), nll, ref_nll, tol, seed);
                gpu::assert_close(&format!("ctc T={t} V={v} {dt:?} {name} grad"), grad, ref_grad, tol, seed);
            }
        }
    }
}

/// A loss over half logits (`logits()` makes a fresh leaf) taken as they
/// are and through their f32 copy (`widen_half`): an f32 loss, the gradient
/// in the logits' dtype, both bit for bit the same either way, and a
/// gradient with an element above `min_grad` (not trivially zero). The
/// loss (summed if it has several elements) is scaled by 3 so its incoming
/// gradient is not 1.
fn as_through_the_f32_copy(what: &str, logits: &dyn Fn() -> Tensor, min_grad: f64, seed: u64, loss: &dyn Fn(&Tensor) -> Tensor) {
    let mut out = vec![];
    for widen in [false, true] {
        let xt = logits().requires_grad_();
        let dt = xt.dtype();
        let input = if widen { ops::widen_half(&xt).unwrap() } else { xt.clone() };
        let l = loss(&input);
        assert_eq!(l.dtype(), DType::F32, "{what}: an f32 loss");
        backward(&ops::mul_scalar(&ops::sum_all(&l).unwrap(), 3.0).unwrap()).unwrap();
        let g = xt.grad().unwrap();
        assert_eq!(g.dtype(), dt, "{what}: the gradient in the logits' dtype");
        out.push((vals(&l), vals(&g)));
    }
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&out[0].0), bits(&out[1].0), "{what}: the loss as through the f32 copy (seed {seed})");
    assert!(out[0].1.iter().any(|g| g.abs() > min_grad), "{what}: the gradient is not trivial");
    assert_eq!(bits(&out[0].1), bits(&out[1].1), "{what}: the gradient as through the f32 copy (seed {seed})");
}

/// Half logits (autocast's CTC head) go into the fused CTC as they are: the
/// same per-sequence losses (f32) and the same gradient (in the logits'
/// dtype), bit for bit, as through their f32 copy, which the model took
/// before; on the CPU (no half arithmetic) the op takes the copy itself.
/// Under every reduction, with an incoming gradient that is not 1.
#[test]
fn half_logits_go_into_the_fused_ctc_as_they_are() {
    let Some(gpu) = gpu::gpu("half_logits_go_into_the_fused_ctc_as_they_are") else { return };
    let seed = seed();
    let mut rng = Rng::new(seed);
    for (t, v) in [(24, 7), (9, 600)] {
        let CtcCase { b, x, targets, il, tl } = ctc_case(&mut rng, t, v);
        for dt in [DType::F16, DType::BF16] {
            for dev in [Device::Cpu, gpu] {
                let tg = targets.clone().to_device(&dev).unwrap();
                for red in [Reduction::None, Reduction::Sum, Reduction::Mean] {
                    let what = format!("T={t} V={v} {dt:?} on {dev:?} {red:?}");
                    let xt = || on(&dev, &x, &[b, t, v], dt);
                    as_through_the_f32_copy(&what, &xt, 1e-3, seed, &|input| ops::ctc_loss_fused(input, &tg, &il, &tl, 0, red, true).unwrap());
                }
            }
        }
    }
}

#[test]
fn label_smoothing_matches_the_cpu() {
    let Some(gpu) = gpu::gpu("label_smoothing_matches_the_cpu") else { return };
    let seed = seed();
    let mut rng = Rng::new(seed);
    // A small vocabulary, and one wider than a block (the strided loops).
    for (b, l, v) in [(3, 5, 11), (2, 9, 4233)] {
        let x: Vec<f64> = rng.normal(b * l * v).into_iter().map(|z| 3.0 * z).collect();
        let tg: Vec<i64> = (0..b * l).map(|i| if i % 4 == 3 { -1 } else { rng.below(v) as i64 }).collect();
        let tg_cpu = Tensor::from_vec(tg, [b, l], &Device::Cpu).unwrap();
        let tg_gpu = tg_cpu.clone().to_device(&gpu).unwrap();
        for dt in [DType::F32, DType::F64] {
            for (eps, norm) in [(0.1, false), (0.1, true), (0.0, false)] {
                // The reference and the fused kernels (the fusion switch's
                // `loss` family) on both devices: every result against the
                // CPU reference.
                type Loss = fn(&Tensor, &Tensor, f64, i64, bool) -> asrforge::Result<Tensor>;
                let impls: [(&str, Loss); 2] = [("reference", ops::label_smoothing_loss_reference), ("fused", ops::label_smoothing_loss_fused)];
                let mut out = vec![];
                for (name, loss_fn) in impls {
                    for dev in [Device::Cpu, gpu] {
                        let xt = on(&dev, &x, &[b, l, v], dt).requires_grad_();
                        let tg = if dev == Device::Cpu { &tg_cpu } else { &tg_gpu };
                        // A loss scaled by 3 so the backward's incoming gradient is not 1.
                        let loss = loss_fn(&xt, tg, eps, -1, norm).unwrap();
                        backward(&ops::mul_scalar(&loss, 3.0).unwrap()).unwrap();
                        out.push((format!("{name} on {dev:?}"), vals(&loss), vals(&xt.grad().unwrap())));
                    }
                }
                let what = format!("label smoothing V={v} {dt:?} eps={eps} normalize_length={norm}");
                let (_, ref_loss, ref_grad) = &out[0];
                assert!(ref_grad.iter().any(|g| g.abs() > 1e-3), "{what}: the gradient is not trivial");
                for (name, loss, grad) in &out[1..] {
                    // The fused forward regroups the row's sums: within 1e-6 of the reference in f32 and far closer in f64.
                    let tol = if name.starts_with("fused") { rtol(dt).max(1e-6) } else { rtol(dt) };
                    gpu::assert_close(&format!("{what} {name}"), loss, ref_loss, tol, seed);
                    gpu::assert_close(&format!("{what} {name} grad"), grad, ref_grad, tol, seed);
                }
            }
        }
    }
}

/// Half logits (autocast's decoder output) go into the fused label
/// smoothing as they are: the same loss (f32) and the same gradient (in the
/// logits' dtype), bit for bit, as through their f32 copy, which the
/// reference and the fused loss took before; on the CPU (no half
/// arithmetic) the op takes the f32 copy itself. The reference over half
/// logits is the f32 one over their copy.
#[test]
fn half_logits_go_into_the_fused_label_smoothing_as_they_are() {
    let Some(gpu) = gpu::gpu("half_logits_go_into_the_fused_label_smoothing_as_they_are") else { return };
    let seed = seed();
    let mut rng = Rng::new(seed);
    for (b, l, v) in [(3, 5, 11), (2, 9, 4233)] {
        let x: Vec<f64> = rng.normal(b * l * v).into_iter().map(|z| 3.0 * z).collect();
        let tg: Vec<i64> = (0..b * l).map(|i| if i % 4 == 3 { -1 } else { rng.below(v) as i64 }).collect();
        let tg = Tensor::from_vec(tg, [b, l], &Device::Cpu).unwrap();
        for dt in [DType::F16, DType::BF16] {
            for dev in [Device::Cpu, gpu] {
                let tgd = tg.clone().to_device(&dev).unwrap();
                let what = format!("V={v} {dt:?} on {dev:?}");
                type Loss = fn(&Tensor, &Tensor, f64, i64, bool) -> asrforge::Result<Tensor>;
                for (name, loss_fn) in [("fused", ops::label_smoothing_loss_fused as Loss), ("reference", ops::label_smoothing_loss_reference)] {
                    let xt = || on(&dev, &x, &[b, l, v], dt);
                    as_through_the_f32_copy(&format!("{what} {name}"), &xt, 1e-4, seed, &|input| loss_fn(input, &tgd, 0.1, -1, true).unwrap());
                }
            }
        }
    }
}

/// The accuracy by its definition: the first index of the row's largest
/// value (NaN never wins, index 0 when nothing exceeds −∞) against the target.
fn accuracy_by_definition(x: &[f64], tg: &[i64], v: usize) -> f64 {
    let (mut hit, mut n) = (0usize, 0usize);
    for (r, &t) in tg.iter().enumerate() {
        if t == -1 {
            continue;
        }
        let mut arg = 0;
        let mut best = f64::NEG_INFINITY;
        for k in 0..v {
            if x[r * v + k] > best {
                best = x[r * v + k];
                arg = k;
            }
        }
        n += 1;
        hit += usize::from(arg as i64 == t);
    }
    if n == 0 {
        0.0
    } else {
        hit as f64 / n as f64
    }
}

#[test]
fn token_accuracy_matches_its_definition_and_the_cpu() {
    let seed = seed();
    let mut rng = Rng::new(seed);
    let gpu = gpu::gpu("token_accuracy_matches_its_definition_and_the_cpu");
    // A small vocabulary, one wider than a block, and more rows than the
    // capped grid (the row loop wraps).
    for (b, l, v) in [(3, 5, 11), (2, 9, 4233), (5, 13, 300)] {
        let mut x: Vec<f64> = rng.normal(b * l * v);
        let mut tg: Vec<i64> = (0..b * l).map(|i| if i % 5 == 4 { -1 } else { rng.below(v) as i64 }).collect();
        // Row 0: its target's logit is the largest (a hit). Row 1: a tie at
        // two indices, the target the later one (a miss: the first wins).
        // Row 2: a NaN at the target (a NaN never wins: a miss). Row 3: all
        // −∞ (argmax 0), target 0 (a hit).
        let row = |r: usize| r * v..(r + 1) * v;
        x[row(0).start + tg[0] as usize] = 50.0;
        let (lo, hi) = (1usize, v - 2);
        x[row(1).start + lo] = 60.0;
        x[row(1).start + hi] = 60.0;
        tg[1] = hi as i64;
        tg[2] = 3;
        x[row(2).start + 3] = f64::NAN;
        x[row(3)].iter_mut().for_each(|e| *e = f64::NEG_INFINITY);
        tg[3] = 0;
        let want = accuracy_by_definition(&x, &tg, v);
        assert!(want > 0.0 && want < 1.0, "a mix of hits and misses: {want}");
        let tg_cpu = Tensor::from_vec(tg.clone(), [b, l], &Device::Cpu).unwrap();
        for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            // The definition runs on the values rounded to dt (half rounding
            // makes ties, which the first index wins on both sides); the
            // CPU reads half logits through its f32 copy, the GPU as they are.
            let want = accuracy_by_definition(&vals(&on(&Device::Cpu, &x, &[b * l * v], dt)), &tg, v);
            let cpu = ops::token_accuracy(&on(&Device::Cpu, &x, &[b, l, v], dt), &tg_cpu, -1).unwrap();
            assert_eq!(cpu.to_scalar().unwrap(), want, "cpu {dt:?} V={v} (seed {seed})");
            if let Some(gpu) = gpu {
                let got = ops::token_accuracy(&on(&gpu, &x, &[b, l, v], dt), &tg_cpu, -1).unwrap();
                assert_eq!(got.device(), gpu);
                assert_eq!(got.to_scalar().unwrap(), want, "cuda {dt:?} V={v} (seed {seed})");
            }
        }
    }
}

#[test]
fn adam_step_matches_the_cpu() {
    let Some(gpu) = gpu::gpu("adam_step_matches_the_cpu") else { return };
    let seed = seed();
    let mut rng = Rng::new(seed);
    for (dt, decoupled, wd) in [(DType::F32, false, 0.0), (DType::F32, false, 0.01), (DType::F32, true, 0.01), (DType::F64, true, 0.1)] {
        let shapes: [&[usize]; 3] = [&[1], &[257], &[3, 70001]];
        let init: Vec<Vec<f64>> = shapes.iter().map(|s| rng.normal(s.iter().product())).collect();
        let grads: Vec<Vec<Vec<f64>>> = (0..3).map(|_| shapes.iter().map(|s| rng.normal(s.iter().product())).collect()).collect();
        let cfg = AdamConfig { lr: 1e-2, weight_decay: wd, decoupled, ..Default::default() };
        let mut result = vec![];
        for dev in [Device::Cpu, gpu] {
            let params: Vec<(String, Tensor)> =
                shapes.iter().zip(&init).enumerate().map(|(i, (s, v))| (format!("p{i}"), on(&dev, v, s, dt).requires_grad_())).collect();
            let mut adam = Adam::new(params.clone(), cfg).unwrap();
            for step in &grads {
                for ((_, p), g) in params.iter().zip(step) {
                    p.set_grad(Some(on(&dev, g, p.dims(), dt))).unwrap();
                }
                adam.step(3e-3).unwrap();
            }
            let mut all: Vec<Vec<f64>> = params.iter().map(|(_, p)| vals(p)).collect();
            all.extend(adam.state().iter().map(|(_, t)| vals(t)));
            result.push(all);
        }
        for (i, (g, c)) in result[1].iter().zip(&result[0]).enumerate() {
            gpu::assert_close(&format!("adam {dt:?} decoupled={decoupled} wd={wd} tensor {i}"), g, c, rtol(dt), seed);
        }
        assert!(result[0][0] != init[0], "the step moved the parameter");
    }
}

fn grad_params(dev: &Device, vals: &[Vec<f64>], dt: DType) -> Vec<(String, Tensor)> {
    vals.iter()
        .enumerate()
        .map(|(i, v)| {
            let p = on(dev, &vec![0.0; v.len()], &[v.len()], dt).requires_grad_();
            p.set_grad(Some(on(dev, v, &[v.len()], dt))).unwrap();
            (format!("p{i}"), p)
        })
        .collect()
}

#[test]
fn grad_norm_matches_the_cpu_and_is_deterministic() {
    let Some(gpu) = gpu::gpu("grad_norm_matches_the_cpu_and_is_deterministic") else { return };
    let seed = seed();
    let mut rng = Rng::new(seed);
    let g: Vec<Vec<f64>> = [1usize, 1000, 300_001, 5].iter().map(|&n| rng.normal(n)).collect();
    for dt in [DType::F32, DType::F64] {
        let cpu = grad_params(&Device::Cpu, &g, dt);
        let dev = grad_params(&gpu, &g, dt);
        let want = grad_norm(&cpu).unwrap();
        let got = grad_norm(&dev).unwrap();
        // Both accumulate in f64; only the order of the sum differs.
        assert!((got - want).abs() <= 1e-12 * want, "{dt:?}: gpu {got} vs cpu {want}");
        let again = grad_norm(&dev).unwrap();
        assert_eq!(got.to_bits(), again.to_bits(), "{dt:?}: the same bits on a second run");
        // Clipping to a fraction of the norm scales like the CPU's.
        let (nc, ng) = (clip_grad_norm(&cpu, want / 3.0).unwrap(), clip_grad_norm(&dev, want / 3.0).unwrap());
        assert!((nc - ng).abs() <= 1e-12 * nc);
        for ((_, c), (_, d)) in cpu.iter().zip(&dev) {
            gpu::assert_close(&format!("clipped {dt:?}"), &vals(&d.grad().unwrap()), &vals(&c.grad().unwrap()), rtol(dt), seed);
        }
    }
}

#[test]
fn unscale_matches_the_cpu_and_finds_a_planted_inf_or_nan() {
    let Some(gpu) = gpu::gpu("unscale_matches_the_cpu_and_finds_a_planted_inf_or_nan") else { return };
    let seed = seed();
    let mut rng = Rng::new(seed);
    let sizes = [3usize, 4096, 100_003];
    for dt in [DType::F32, DType::F64] {
        let base: Vec<Vec<f64>> = sizes.iter().map(|&n| rng.normal(n).into_iter().map(|x| x * 65536.0).collect()).collect();
        let mut cpu_s = GradScaler::new(ScalerConfig::default());
        let mut gpu_s = GradScaler::new(ScalerConfig::default());
        let cpu = grad_params(&Device::Cpu, &base, dt);
        let dev = grad_params(&gpu, &base, dt);
        assert!(!cpu_s.unscale(&cpu).unwrap());
        assert!(!gpu_s.unscale(&dev).unwrap(), "{dt:?}: clean gradients report no inf");
        for ((_, c), (_, d)) in cpu.iter().zip(&dev) {
            // A power-of-two scale: the products are exact on both.
            assert_eq!(vals(&d.grad().unwrap()), vals(&c.grad().unwrap()), "{dt:?}: unscaled values");
        }
        for bad in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN] {
            let mut planted = base.clone();
            let which = 1 + rng.below(2);
            let at = rng.below(planted[which].len());
            planted[which][at] = bad;
            let dev = grad_params(&gpu, &planted, dt);
            assert!(gpu_s.unscale(&dev).unwrap(), "{dt:?}: {bad} planted in tensor {which} at {at} is found");
            // And the flag starts clean on the next call.
            assert!(!gpu_s.unscale(&grad_params(&gpu, &base, dt)).unwrap(), "{dt:?}: the flag is per call");
        }
    }
}

#[test]
fn move_to_device_moves_every_handle_in_place() {
    let Some(gpu) = gpu::gpu("move_to_device_moves_every_handle_in_place") else { return };
    let seed = seed();
    let mut rng = Rng::new(seed);
    let v = rng.normal(1000);
    let p = on(&Device::Cpu, &v, &[10, 100], DType::F32).requires_grad_();
    let other = p.detach();
    p.move_to_device(&gpu).unwrap();
    assert_eq!((p.device(), other.device()), (gpu, gpu), "both handles see the move");
    assert_eq!(vals(&other), vals(&on(&Device::Cpu, &v, &[10, 100], DType::F32)), "the values moved unchanged");
    other.move_to_device(&Device::Cpu).unwrap();
    assert_eq!(p.device(), Device::Cpu);
    assert_eq!(vals(&p), vals(&on(&Device::Cpu, &v, &[10, 100], DType::F32)));
}
