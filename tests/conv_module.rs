//! The channels-last Conformer convolution module against the composition
//! it replaced, rebuilt here from generic ops in PyTorch's (B, C, T) layout:
//! transpose, mask, pointwise conv1d as a product plus broadcast bias, GLU
//! over channels from slices and a sigmoid, the depthwise conv as a sum over taps of shifted slices
//! times the tap's weights (no conv kernel at all), batch norm over (B, C, T)
//! or layer norm between transposes, the activation, pointwise conv2, mask,
//! transpose back. Outputs, every parameter and input gradient and the
//! batch norm's running statistics must agree with the old composition
//! evaluated in f64 on the CPU (the module's parameters, input and output
//! weighting upcast): the f64 CPU module to 1e-12, the f32 (emulated) GPU
//! module to the harness's f32 tolerance. The f64 reference is the truth:
//! against an f32 reference, ill-conditioned gradients (pointwise_conv1's
//! bias, whose terms mostly cancel under batch norm) compared two roundings
//! that only agreed while both sides summed in the same order. Two
//! exceptions, both under training batch norm: the depthwise bias's
//! gradient, analytically zero, must be zero on each side up to that sum's
//! rounding; and the f32 module's gradient of pointwise_conv1's bias, whose
//! terms mostly cancel, is allowed at least the forward error of its sum,
//! 64·u·Σ|terms| per channel (derivation and measurements in `check`).

mod common;

use asrforge::autograd;
use asrforge::models::config::{Activation, ConvNorm};
use asrforge::models::convolution::{ConvModuleNorm, ConvolutionModule};
use asrforge::models::encoder::frame_pad_mask;
use asrforge::models::ffn::activate;
use asrforge::nn::Module;
use asrforge::ops::{self, BatchNormState};
use asrforge::tensor::{DType, Device, Rng, Tensor};
use asrforge::Result;
use common::gpu;

/// A copy of `t` (same values, device and dtype; no shared storage).
fn copy(t: &Tensor) -> Tensor {
    ops::mul_scalar(t, 1.0).unwrap().detach()
}

/// The depthwise conv of h (B, C, T), w (C, 1, K), zero padding p, from slices.
fn depthwise_reference(h: &Tensor, w: &Tensor, bias: &Tensor, p: usize) -> Result<Tensor> {
    let (c, k) = (w.dims()[0], w.dims()[2]);
    let hp = ops::pad(h, 2, p, p, 0.0)?;
    let to = hp.dims()[2] + 1 - k;
    let mut acc = ops::reshape(bias, [c, 1])?;
    for kk in 0..k {
        let tap = ops::reshape(&ops::narrow(w, 2, kk, 1)?, [c, 1])?;
        acc = ops::add(&acc, &ops::mul(&ops::narrow(&hp, 2, kk, to)?, &tap)?)?;
    }
    Ok(acc)
}

/// The module's old (B, C, T) composition; `stats` are the running
/// statistics to use and move (copies of the module's).
fn reference(m: &ConvolutionModule, x: &Tensor, pad: Option<&Tensor>, stats: Option<(&Tensor, &Tensor)>) -> Result<Tensor> {
    after_depthwise(m, &up_to_depthwise(m, x, pad)?, pad, stats)
}

/// The old composition up to and including the depthwise conv: its output (B, C, T).
fn up_to_depthwise(m: &ConvolutionModule, x: &Tensor, pad: Option<&Tensor>) -> Result<Tensor> {
    from_pointwise1(m, &up_to_pointwise1(m, x, pad)?, pad)
}

/// The old composition up to and including pointwise_conv1: its output (B, 2C, T + lorder).
fn up_to_pointwise1(m: &ConvolutionModule, x: &Tensor, pad: Option<&Tensor>) -> Result<Tensor> {
    let mut h = ops::transpose(x, 1, 2)?;
    if let Some(p) = pad {
        h = ops::masked_fill(&h, p, 0.0)?;
    }
    if m.lorder > 0 {
        h = ops::pad(&h, 2, m.lorder, 0, 0.0)?;
    }
    ops::conv1d_pointwise(&h, &m.pointwise_conv1.weight, m.pointwise_conv1.bias.as_ref())
}

/// The old composition from pointwise_conv1's output h2 (B, 2C, T + lorder)
/// to the depthwise conv's output (B, C, T).
fn from_pointwise1(m: &ConvolutionModule, h2: &Tensor, pad: Option<&Tensor>) -> Result<Tensor> {
    // GLU over channels from slices: a·σ(b).
    let c = h2.dims()[1] / 2;
    let mut h = ops::mul(&ops::narrow(&h2, 1, 0, c)?, &ops::sigmoid(&ops::narrow(&h2, 1, c, c)?)?)?;
    if let (Some(p), false) = (pad, m.wenet_masking) {
        // The mask widened by the unmasked causal left padding.
        let left = Tensor::zeros([p.dims()[0], 1, m.lorder], DType::U8, &p.device())?;
        h = ops::masked_fill(&h, &ops::cat(&[&left, p], 2)?, 0.0)?;
    }
    let k = m.depthwise_conv.weight.dims()[2];
    let padding = if m.lorder > 0 { 0 } else { (k - 1) / 2 };
    depthwise_reference(&h, &m.depthwise_conv.weight, m.depthwise_conv.bias.as_ref().unwrap(), padding)
}

/// The rest of the old composition, from the depthwise conv's output h (B, C, T) on.
fn after_depthwise(m: &ConvolutionModule, h: &Tensor, pad: Option<&Tensor>, stats: Option<(&Tensor, &Tensor)>) -> Result<Tensor> {
    let h = match &m.norm {
        ConvModuleNorm::Batch(bn) => {
            let (rm, rv) = stats.unwrap();
            let st = BatchNormState { running_mean: rm, running_var: rv, momentum: bn.momentum, eps: bn.eps, training: bn.training };
            ops::batch_norm(h, &bn.weight, &bn.bias, &st)?
        }
        ConvModuleNorm::Layer(ln) => ops::transpose(&ops::layer_norm(&ops::transpose(h, 1, 2)?, Some(&ln.weight), Some(&ln.bias), ln.eps)?, 1, 2)?,
    };
    after_norm(m, &h, pad)
}

/// The rest of the old composition, from the norm's output (B, C, T) on.
fn after_norm(m: &ConvolutionModule, h: &Tensor, pad: Option<&Tensor>) -> Result<Tensor> {
    let mut h = ops::conv1d_pointwise(&activate(m.act, h)?, &m.pointwise_conv2.weight, m.pointwise_conv2.bias.as_ref())?;
    if let Some(p) = pad {
        h = ops::masked_fill(&h, p, 0.0)?;
    }
    ops::transpose(&h, 1, 2)
}

/// Output, gradients (of every parameter and the input) of `f` under a fixed weighting.
fn run(m: &ConvolutionModule, x: &Tensor, wt: &Tensor, f: &dyn Fn() -> Result<Tensor>) -> (Vec<f64>, Vec<Vec<f64>>) {
    let mut leaves: Vec<Tensor> = m.named_parameters().into_iter().map(|(_, t)| t).collect();
    leaves.push(x.clone());
    for l in &leaves {
        l.zero_grad();
    }
    let y = f().unwrap();
    autograd::backward(&ops::sum_all(&ops::mul(&y, wt).unwrap()).unwrap()).unwrap();
    let grads = leaves.iter().map(|l| l.grad().expect("every leaf gets a gradient").to_f64_vec().unwrap()).collect();
    (y.to_f64_vec().unwrap(), grads)
}

/// Per channel c of a training batch norm module, the rounding scale of its
/// depthwise bias's gradient Σ_i dx_i (N = B·T positions i, dx batch norm's
/// input gradient): √N·|w_c|·r_c·‖g_c‖·(1 + √(1 + μ_c²/σ_c²)), without the
/// unit roundoff. g_c is the gradient reaching the batch norm's output in
/// channel c (from the old composition behind a leaf there, on `x`'s device
/// and dtype, with copies of the running statistics so that neither side's
/// are moved), μ_c and σ_c² the mean and biased variance of the depthwise
/// output h over the batch, r_c = 1/√(σ_c² + eps), w_c the norm's weight;
/// all in f64 on the host. See the assertion in `check` for why this scale.
fn depthwise_bias_rounding_scale(m: &ConvolutionModule, x: &Tensor, pad: &Tensor, wt: &Tensor) -> Vec<f64> {
    let ConvModuleNorm::Batch(bn) = &m.norm else { unreachable!("only a batch norm module has this scale") };
    let h = up_to_depthwise(m, x, Some(pad)).unwrap().detach();
    let (rm, rv) = (copy(&bn.running_mean), copy(&bn.running_var));
    let st = BatchNormState { running_mean: &rm, running_var: &rv, momentum: bn.momentum, eps: bn.eps, training: bn.training };
    let z = ops::batch_norm(&h, &bn.weight, &bn.bias, &st).unwrap().detach().requires_grad_();
    let y = after_norm(m, &z, Some(pad)).unwrap();
    autograd::backward(&ops::sum_all(&ops::mul(&y, wt).unwrap()).unwrap()).unwrap();
    let (b, c, t) = (h.dims()[0], h.dims()[1], h.dims()[2]);
    let g = z.grad().expect("the norm's output leaf gets a gradient").to_f64_vec().unwrap();
    let (hv, w) = (h.to_f64_vec().unwrap(), bn.weight.to_f64_vec().unwrap());
    let n = (b * t) as f64;
    (0..c)
        .map(|ch| {
            let at: Vec<usize> = (0..b).flat_map(|bb| (0..t).map(move |tt| (bb * c + ch) * t + tt)).collect();
            let mu = at.iter().map(|&i| hv[i]).sum::<f64>() / n;
            let var = at.iter().map(|&i| (hv[i] - mu).powi(2)).sum::<f64>() / n;
            let r = 1.0 / (var + bn.eps).sqrt();
            let g_norm = at.iter().map(|&i| g[i] * g[i]).sum::<f64>().sqrt();
            n.sqrt() * w[ch].abs() * r * g_norm * (1.0 + (1.0 + mu * mu / var).sqrt())
        })
        .collect()
}

/// Per output channel j of pointwise_conv1 in a batch norm module, S_j =
/// Σ_i |g_ij|: the sum of the absolute values of the terms of its bias's
/// gradient Σ_i g_ij, g the gradient reaching pointwise_conv1's output h2
/// (B, 2C, T + lorder) at its B·(T + lorder) positions i. g comes from the
/// old composition behind a leaf at h2, on `x`'s device and dtype (the test
/// passes the f64 CPU reference), with copies of the running statistics so
/// that no side's are moved. See the comparison in `check` for its use.
fn pointwise1_bias_term_sums(m: &ConvolutionModule, x: &Tensor, pad: &Tensor, wt: &Tensor) -> Vec<f64> {
    let ConvModuleNorm::Batch(bn) = &m.norm else { unreachable!("only a batch norm module has this floor") };
    let h2 = up_to_pointwise1(m, &x.detach(), Some(pad)).unwrap().detach().requires_grad_();
    let (rm, rv) = (copy(&bn.running_mean), copy(&bn.running_var));
    let y = after_depthwise(m, &from_pointwise1(m, &h2, Some(pad)).unwrap(), Some(pad), Some((&rm, &rv))).unwrap();
    autograd::backward(&ops::sum_all(&ops::mul(&y, wt).unwrap()).unwrap()).unwrap();
    let (b, c2, t) = (h2.dims()[0], h2.dims()[1], h2.dims()[2]);
    let g = h2.grad().expect("pointwise_conv1's output leaf gets a gradient").to_f64_vec().unwrap();
    (0..c2).map(|j| (0..b).flat_map(|bb| (0..t).map(move |tt| (bb * c2 + j) * t + tt)).map(|i| g[i].abs()).sum()).collect()
}

/// The unit roundoff of `dt`'s arithmetic (the GPU kernels accumulate f32
/// in f32, f64 in f64).
fn unit_roundoff(dt: DType) -> f64 {
    match dt {
        DType::F64 => f64::EPSILON,
        DType::F32 => f32::EPSILON as f64,
        other => panic!("the convolution module test runs in f64 or f32, not {other:?}"),
    }
}

/// Module vs reference for each norm, causal or not, WeNet masking or not, on `dev` in `dt`.
fn check(dev: &Device, dt: DType, tol: f64) {
    let seed = common::fresh_seed();
    let mut rng = Rng::new(seed);
    let (b, t, c) = (3, 11, 6);
    let cases = [
        (ConvNorm::BatchNorm, false, false),
        (ConvNorm::BatchNorm, true, false),
        (ConvNorm::LayerNorm, false, false),
        (ConvNorm::LayerNorm, true, false),
        (ConvNorm::LayerNorm, true, true),
        (ConvNorm::BatchNorm, false, true),
    ];
    for (norm, causal, wenet) in cases {
        let mut m = ConvolutionModule::new(c, 5, Activation::Swish, norm, causal, 1e-5, dt, &mut rng).unwrap();
        m.wenet_masking = wenet;
        // The reference's module: f64 on the CPU, every tensor an exact
        // upcast of `m`'s (its own initial values, drawn from a separate
        // generator, are all overwritten).
        let mut m64 = ConvolutionModule::new(c, 5, Activation::Swish, norm, causal, 1e-5, DType::F64, &mut Rng::new(seed ^ 1)).unwrap();
        m64.wenet_masking = wenet;
        let (sd, sd64) = (m.state_dict(), m64.state_dict());
        assert_eq!(sd.len(), sd64.len(), "{norm:?}: the f64 module has another state dict");
        for (t, t64) in sd.iter().zip(&sd64) {
            assert_eq!(t.name, t64.name, "{norm:?}: the f64 module's state dict is in another order");
            t64.tensor.assign(&ops::to_dtype(&t.tensor, t64.tensor.dtype()).unwrap()).unwrap();
        }
        for t in &sd {
            if t.tensor.dtype() == dt {
                t.tensor.move_to_device(dev).unwrap();
            }
        }
        let x = Tensor::from_vec(rng.normal(b * t * c), [b, t, c], &Device::Cpu).unwrap();
        let x = ops::to_dtype(&x, dt).unwrap();
        let x64 = ops::to_dtype(&x, DType::F64).unwrap().requires_grad_();
        let x = x.to_device(dev).unwrap().requires_grad_();
        let wt = ops::to_dtype(&Tensor::from_vec(rng.normal(b * t * c), [b, t, c], &Device::Cpu).unwrap(), dt).unwrap();
        let wt64 = ops::to_dtype(&wt, DType::F64).unwrap();
        let wt = wt.to_device(dev).unwrap();
        let pad = frame_pad_mask(&[11, 7, 4], t).unwrap();
        let stats = match &m64.norm {
            ConvModuleNorm::Batch(bn) => Some((copy(&bn.running_mean), copy(&bn.running_var))),
            ConvModuleNorm::Layer(_) => None,
        };
        let what = format!("{norm:?} causal={causal} wenet_masking={wenet} on {dev:?} {dt:?} against the f64 CPU reference");
        // Each side's rounding scale, on its own device in its own dtype.
        let bias_scales = matches!(m.norm, ConvModuleNorm::Batch(_))
            .then(|| (depthwise_bias_rounding_scale(&m, &x, &pad, &wt), depthwise_bias_rounding_scale(&m64, &x64, &pad, &wt64)));
        // pointwise_conv1's bias gradient's term sums S_j, from the truth,
        // for the f32 module under training batch norm only (the f64 CPU
        // module holds 1e-12 without a floor).
        let pw1_sums =
            (dt == DType::F32 && matches!(&m64.norm, ConvModuleNorm::Batch(bn) if bn.training)).then(|| pointwise1_bias_term_sums(&m64, &x64, &pad, &wt64));
        let (yr, gr) = run(&m64, &x64, &wt64, &|| reference(&m64, &x64, Some(&pad), stats.as_ref().map(|(a, b)| (a, b))));
        let (ym, gm) = run(&m, &x, &wt, &|| m.forward(&x, Some(&pad)));
        gpu::assert_close(&format!("{what}: output"), &ym, &yr, tol, seed);
        let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).chain(["input".to_string()]).collect();
        for ((g, r), n) in gm.iter().zip(&gr).zip(&names) {
            match (&bias_scales, n.as_str()) {
                // Training batch norm removes any per-channel constant, so
                // the depthwise bias's gradient Σ_i dx_i is analytically
                // zero: both sides compute only rounding, and comparing them
                // compared noise with noise. Each side is held instead to
                // the rounding scale of that sum, |g_c| ≤ K·u·scale_c. The
                // terms dx_i = w·r·(g_i − ḡ − x̂_i·m₂) cancel, so their
                // rounding follows the uncancelled parts, not dx: N roundings
                // of terms of size |w|·r·|g_i| (the sum, ḡ) walk to
                // u·√N·|w|·r·‖g‖; the batch mean's rounding u·|μ| shifts
                // every x̂_i alike, so Σ x̂_i is off by N·u·|μ|·r and the sum
                // by that times |w|·r·|m₂| ≤ |w|·r·‖g‖/√N (x̂ has unit RMS),
                // u·√N·|w|·r·‖g‖·|μ|/σ (see `depthwise_bias_rounding_scale`).
                // Bounding by √N·rms(dx) alone fails: up to 68 times that
                // in f64, on channels with |μ| several σ. With this scale the
                // largest ratio over 300 CPU f64 runs and 400 emulated f32
                // runs (asc, random) was 1.5 (f64) and 0.55 (f32): K = 8.
                // A gradient that is not ~0, say dx keeping a fraction ε of
                // ḡ, is ε·|w|·r·|Σ_i g_i| ~ ε·|w|·r·‖g‖, over the bound once
                // ε exceeds about K·u·√N·(2 to 8): 1e-5 to 5e-5 in f32 here.
                (Some((scale, scale64)), "depthwise_conv.bias") => {
                    const K: f64 = 8.0;
                    for (side, grad, scale, u) in [("module", g, scale, unit_roundoff(dt)), ("reference", r, scale64, unit_roundoff(DType::F64))] {
                        for (ch, (&gc, &sc)) in grad.iter().zip(scale).enumerate() {
                            let bound = K * u * sc;
                            assert!(
                                gc.abs() <= bound,
                                "{what}: the {side}'s gradient of {n} at channel {ch} is {gc:e}, want 0 up to its rounding, {K}·u·{sc:e} = {bound:e} (seed {seed})"
                            );
                        }
                    }
                }
                // Under training batch norm pointwise_conv1's bias gradient
                // Σ_i g_ij is ill-conditioned: its terms mostly cancel,
                // S_j = Σ_i |g_ij| (see `pointwise1_bias_term_sums`) was up
                // to 179·(|Σ_i g_ij| + rms over channels) in the runs below.
                // Any f32 evaluation is then off by the forward error of
                // such a sum, |fl(Σ) − Σ| ≤ γ_n·S_j, γ_n ≈ n·u (Higham,
                // Accuracy and Stability of Numerical Algorithms, 2nd ed.,
                // §4.2), not by a fraction of the result; and the terms
                // carry more than their own rounding: the depthwise
                // output's rounding, u·|μ| on channels whose batch mean is
                // several σ, reaches g through batch norm's backward
                // without cancelling. So each channel of this one gradient
                // is allowed the larger of the harness's tolerance and
                // C·u·S_j, u = f32::EPSILON = 2⁻²³ as in the rest of this
                // file (twice the strict unit roundoff 2⁻²⁴). Measured
                // error against the f64 truth over 3000 random-schedule
                // and 3000 asc runs (3 batch norm cases of 12 channels
                // each): the emulated GPU module at most 15.8·u·S_j (11.4
                // random, 15.8 asc), f32 CPU evaluations of the module and
                // of the old composition at most 39.5·u·S_j. C = 64 leaves
                // a factor 4 over the GPU module's worst and 1.6 over any
                // f32 evaluation seen. A wrong gradient still fails: one
                // term of n = B·(T + lorder) = 33 to 45 dropped (size ~S_j/n
                // against a floor of 7.6e-6·S_j) was over the allowance in
                // 40 of 40 runs, by at least 5364 times on the worst
                // channel; a relative error of 1e-3 in every channel in 40
                // of 40 runs, by at least 14 times on the worst channel.
                (_, "pointwise_conv1.bias") if pw1_sums.is_some() => {
                    const C: f64 = 64.0;
                    let sums = pw1_sums.as_ref().expect("matched on is_some");
                    assert_eq!(g.len(), sums.len(), "{what}: {n} has {} channels, its term sums {}", g.len(), sums.len());
                    let rms = (r.iter().map(|w| w * w).sum::<f64>() / r.len() as f64).sqrt();
                    let u = unit_roundoff(dt);
                    for (j, ((&gj, &rj), &sj)) in g.iter().zip(r).zip(sums).enumerate() {
                        let allowed = (tol * (rj.abs() + rms)).max(C * u * sj);
                        assert!(
                            (gj - rj).abs() <= allowed,
                            "{what}: gradient of {n} at channel {j}: got {gj}, want {rj}, off by {:e}, allowed max({tol:e}·(|want| + {rms:e}), {C}·u·S = {C}·{u:e}·{sj:e}) = {allowed:e} (seed {seed})",
                            (gj - rj).abs()
                        );
                    }
                }
                _ => gpu::assert_close(&format!("{what}: gradient of {n}"), g, r, tol, seed),
            }
        }
        if let (ConvModuleNorm::Batch(bn), Some((rm, rv))) = (&m.norm, &stats) {
            // One training forward each: the module moved its statistics, the reference copies of the f64 module's.
            gpu::assert_close(&format!("{what}: running_mean"), &bn.running_mean.to_f64_vec().unwrap(), &rm.to_f64_vec().unwrap(), tol, seed);
            gpu::assert_close(&format!("{what}: running_var"), &bn.running_var.to_f64_vec().unwrap(), &rv.to_f64_vec().unwrap(), tol, seed);
        }
    }
}

#[test]
fn channels_last_module_equals_the_old_composition_on_the_cpu() {
    check(&Device::Cpu, DType::F64, 1e-12);
}

#[test]
fn channels_last_module_equals_the_old_composition_on_the_gpu() {
    let Some(dev) = gpu::gpu("channels_last_module_equals_the_old_composition_on_the_gpu") else { return };
    check(&dev, DType::F32, gpu::F32);
}
