//! layer_norm over the last dim and batch_norm over the channel dim of
//! (B, C) or (B, C, T), with PyTorch's running-statistics semantics, on the
//! CPU or the GPU (the input's storage decides; parameters must be with it).

use super::expect_shape;
use super::out_storage;
use super::placement::{as_cpu, as_gpu};
use crate::autograd::{needs_grad, no_grad, push_node, record};
use crate::backend::cpu::norm as cpu;
use crate::backend::cuda::norm as gpu;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

type Three = (Storage, Storage, Storage);

fn ln_forward(x: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>, n: usize, eps: f64) -> Result<Three> {
    let op = "layer_norm";
    let (xg, wg, bg) = (x.storage(), w.map(|t| t.storage()), b.map(|t| t.storage()));
    Ok(match &*xg {
        Storage::Cpu(c) => {
            let wc = wg.as_deref().map(|s| as_cpu(op, s)).transpose()?;
            let bc = bg.as_deref().map(|s| as_cpu(op, s)).transpose()?;
            let (y, m, r) = cpu::layer_norm(c, wc, bc, n, eps)?;
            (Storage::Cpu(y), Storage::Cpu(m), Storage::Cpu(r))
        }
        Storage::Cuda(g) => {
            let wc = wg.as_deref().map(|s| as_gpu(op, s, g)).transpose()?;
            let bc = bg.as_deref().map(|s| as_gpu(op, s, g)).transpose()?;
            let (y, m, r) = gpu::layer_norm(g, wc, bc, n, eps)?;
            (Storage::Cuda(y), Storage::Cuda(m), Storage::Cuda(r))
        }
    })
}

/// Layer norm's backward; with `acc` (on a GPU only), what x has gathered
/// is added to its gradient in the same launch (before rounding, as the
/// gradient a sum receives directly: `add_layer_norm_backward`, alpha 1).
fn ln_backward(x: &Tensor, w: Option<&Tensor>, mean: &Tensor, rstd: &Tensor, g: &Tensor, acc: Option<&Tensor>, n: usize) -> Result<Three> {
    let op = "layer_norm_backward";
    let (xg, wg, mg, rg, gg) = (x.storage(), w.map(|t| t.storage()), mean.storage(), rstd.storage(), g.storage());
    let ag = acc.map(|t| t.storage());
    Ok(match &*xg {
        Storage::Cpu(_) if ag.is_some() => return Err(Error::invalid(op, "expected the saved input on the GPU to add a gathered gradient in its launch")),
        Storage::Cpu(c) => {
            let wc = wg.as_deref().map(|s| as_cpu(op, s)).transpose()?;
            let (gx, gw, gb) = cpu::layer_norm_backward(c, wc, as_cpu(op, &mg)?, as_cpu(op, &rg)?, as_cpu(op, &gg)?, n)?;
            (Storage::Cpu(gx), Storage::Cpu(gw), Storage::Cpu(gb))
        }
        Storage::Cuda(c) => {
            let wc = wg.as_deref().map(|s| as_gpu(op, s, c)).transpose()?;
            let (m, r, gc) = (as_gpu(op, &mg, c)?, as_gpu(op, &rg, c)?, as_gpu(op, &gg, c)?);
            let (gx, gw, gb) = match ag.as_deref() {
                Some(a) => {
                    let (gx, _, gw, gb) = gpu::add_layer_norm_backward(c, wc, m, r, gc, Some(as_gpu(op, a, c)?), 1.0, None, None, n)?;
                    (gx, gw, gb)
                }
                None => gpu::layer_norm_backward(c, wc, m, r, gc, n)?,
            };
            (Storage::Cuda(gx), Storage::Cuda(gw), Storage::Cuda(gb))
        }
    })
}

/// A layer norm's weight and bias: of `n` elements, on x's device, of x's
/// parameter dtype (half inputs, autocast's, are normalised with f32 ones).
fn check_ln_params(op: &'static str, x: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>, n: usize) -> Result<()> {
    for (p, what) in [(w, "weight"), (b, "bias")] {
        if let Some(p) = p {
            expect_shape(op, what, p, &[n])?;
            if p.device() != x.device() {
                return Err(Error::DeviceMismatch { op, lhs: x.device(), rhs: p.device() });
            }
            let want = crate::backend::cpu::norm::ln_param_dtype(x.dtype());
            if p.dtype() != want {
                return Err(Error::DTypeMismatch { op, expected: want, got: p.dtype() });
            }
        }
    }
    Ok(())
}

/// Layer norm over the last dim with optional affine weight and bias of that size.
pub fn layer_norm(x: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    let n = *x.dims().last().ok_or_else(|| Error::invalid("layer_norm", "expected a tensor of rank >= 1, got a scalar"))?;
    check_ln_params("layer_norm", x, w, b, n)?;
    let rows = if n == 0 { 0 } else { x.elem_count() / n };
    let (y, mean, rstd) = ln_forward(x, w, b, n, eps)?;
    let (y, mean, rstd) = (out_storage(y, x.shape().clone()), out_storage(mean, [rows]), out_storage(rstd, [rows]));
    let (xs, ws) = (x.detach(), w.map(|t| t.detach()));
    let mut inputs = vec![x];
    inputs.extend(w);
    inputs.extend(b);
    let has_b = b.is_some();
    let saved = vec![xs.clone()];
    Ok(record("layer_norm", &inputs, y, saved, move |g, _| {
        // On a GPU, what x has gathered (a pre-norm residual stream also
        // reaches x through the skip) is added in the backward's launch:
        // add_layer_norm's backward with it as the sum's direct gradient.
        let fits = |t: &Tensor| matches!(t.device(), crate::tensor::Device::Cuda(_)) && t.shape() == xs.shape() && t.dtype() == xs.dtype();
        let acc = crate::autograd::take_accumulator(0, fits);
        let (gx, gw, gb) = ln_backward(&xs, ws.as_ref(), &mean, &rstd, g, acc.as_ref(), n)?;
        let mut v = vec![Some(out_storage(gx, xs.shape().clone()))];
        if ws.is_some() {
            v.push(Some(out_storage(gw, [n])));
        }
        if has_b {
            v.push(Some(out_storage(gb, [n])));
        }
        Ok(v)
    }))
}

/// The residual add before a pre-norm fused with that norm (fusion family
/// `norm`): `s = x + alpha·y` (the next residual stream, rounded to x's
/// dtype as `add_scaled` stores it) and `h = layer_norm(s, w, b, eps)` (the
/// next branch's input), as `(s, h)`. On the GPU each direction is one
/// launch of the layer-norm kernels with the sum formed on the fly (and, in
/// backward, the two gradients of `s` added and `alpha` applied in the pass
/// that writes them, plus the weight/bias sums' second pass); on the CPU it
/// is the composition `add_scaled` then `layer_norm`, the reference. Either
/// output may go unused: gradients that reach neither give none.
///
/// `dropout` > 0 is the residual branch's dropout (training), folded in:
/// `s = x + alpha·dropout(y, p)`, the mask drawn inside the kernels from the
/// words `ops::dropout` would reserve at this point, so the composition
/// `add_scaled(x, dropout(y))` (the CPU's) drops the same elements. 0: none.
pub fn add_layer_norm(x: &Tensor, y: &Tensor, alpha: f64, dropout: f64, w: Option<&Tensor>, b: Option<&Tensor>, eps: f64) -> Result<(Tensor, Tensor)> {
    add_layer_norm_masked(x, y, None, alpha, dropout, w, b, eps)
}

/// [`add_layer_norm`] with the branch's rows zeroed where `rows` (u8 of
/// y's shape with its last dim 1, 1 = zero that row) says: `s = x +
/// alpha·dropout(masked_fill(y, rows, 0))`, the frame mask a branch puts on
/// its padded frames (the conformer convolution module's output) folded
/// into the same launches each way. The composition (the CPU's, and the
/// reference) is those three ops.
#[allow(clippy::too_many_arguments)]
pub fn add_layer_norm_masked(
    x: &Tensor,
    y: &Tensor,
    rows: Option<&Tensor>,
    alpha: f64,
    dropout: f64,
    w: Option<&Tensor>,
    b: Option<&Tensor>,
    eps: f64,
) -> Result<(Tensor, Tensor)> {
    let op = "add_layer_norm";
    if !(0.0..=1.0).contains(&dropout) {
        return Err(Error::invalid(op, format!("expected a dropout probability 0 <= p <= 1, got {dropout}")));
    }
    if x.shape() != y.shape() || x.dtype() != y.dtype() || x.device() != y.device() {
        return Err(Error::invalid(
            op,
            format!(
                "expected the residual branch like x ({} {} on {:?}), found {} {} on {:?}",
                x.shape(),
                x.dtype().as_str(),
                x.device(),
                y.shape(),
                y.dtype().as_str(),
                y.device()
            ),
        ));
    }
    if !x.dtype().is_float() {
        return Err(Error::UnsupportedDType { op, dtype: x.dtype(), supported: "f32, f64, f16, bf16" });
    }
    if let Some(m) = rows {
        let mut want = y.dims().to_vec();
        if let Some(last) = want.last_mut() {
            *last = 1;
        }
        expect_shape(op, "row mask", m, &want)?;
        if m.dtype() != crate::tensor::DType::U8 {
            return Err(Error::DTypeMismatch { op, expected: crate::tensor::DType::U8, got: m.dtype() });
        }
    }
    // The row mask on the branch's device (a GPU mask is never read back).
    let row_mask = rows.map(|m| m.detach().to_device(&y.device())).transpose()?;
    let gpu_parts = {
        let (xg, yg, mg) = (x.storage(), y.storage(), row_mask.as_ref().map(|m| m.storage()));
        match (&*xg, &*yg) {
            (Storage::Cuda(xc), Storage::Cuda(yc)) => {
                let n = *x.dims().last().ok_or_else(|| Error::invalid(op, "expected a tensor of rank >= 1, got a scalar"))?;
                check_ln_params(op, x, w, b, n)?;
                let (wg, bg) = (w.map(|t| t.storage()), b.map(|t| t.storage()));
                let wc = wg.as_deref().map(|s| as_gpu(op, s, xc)).transpose()?;
                let bc = bg.as_deref().map(|s| as_gpu(op, s, xc)).transpose()?;
                let mc = mg.as_deref().map(|s| as_gpu(op, s, xc)).transpose()?;
                let drop = (dropout > 0.0).then(|| super::dropout::draw(y.elem_count(), dropout));
                Some((gpu::add_layer_norm(xc, yc, alpha, drop, mc, wc, bc, n, eps)?, drop))
            }
            _ => None,
        }
    };
    let Some(((sg, hg, mean, rstd), drop)) = gpu_parts else {
        // The CPU: the composition (x and y on the CPU, or on two devices:
        // add_scaled names the mismatch).
        let y = match &row_mask {
            Some(m) => super::masked_fill(y, m, 0.0)?,
            None => y.clone(),
        };
        let s = super::add_scaled(x, &super::dropout(&y, dropout, true)?, alpha)?;
        let h = layer_norm(&s, w, b, eps)?;
        return Ok((s, h));
    };
    let n = *x.dims().last().unwrap_or(&0);
    let rows = if n == 0 { 0 } else { x.elem_count() / n };
    let s = out_storage(Storage::Cuda(sg), x.shape().clone());
    let h = out_storage(Storage::Cuda(hg), x.shape().clone());
    let (mean, rstd) = (out_storage(Storage::Cuda(mean), [rows]), out_storage(Storage::Cuda(rstd), [rows]));
    let mut inputs = vec![x, y];
    inputs.extend(w);
    inputs.extend(b);
    if !needs_grad(&inputs) {
        return Ok((s, h));
    }
    let (s, h) = (s.reshaped(s.shape().clone(), true), h.reshaped(h.shape().clone(), true));
    let (ss, ws, has_w, has_b) = (s.detach(), w.map(|t| t.detach()), w.is_some(), b.is_some());
    crate::autograd::profile_mark(op, (s.size_in_bytes() + h.size_in_bytes()) as u64);
    push_node(
        op,
        &inputs,
        vec![s.id(), h.id()],
        vec![ss.clone()],
        Box::new(move |g: &[Option<Tensor>], needs: &[bool]| {
            let (gs, gh) = (g.first().cloned().flatten(), g.get(1).cloned().flatten());
            let mut out: Vec<Option<Tensor>> = vec![None; needs.len()];
            let Some(gh) = gh else {
                // Only s was used: the residual add's backward.
                if let Some(gs) = gs {
                    out[1] = if needs[1] {
                        Some(no_grad(|| {
                            let gy = super::affine(&gs, alpha, 0.0)?;
                            let gy = match drop {
                                Some(d) => super::dropout::apply(&gy, d.seed, d.offset, d.p)?,
                                None => gy,
                            };
                            match &row_mask {
                                Some(m) => super::masked_fill(&gy, m, 0.0),
                                None => Ok(gy),
                            }
                        })?)
                    } else {
                        None
                    };
                    out[0] = needs[0].then_some(gs);
                }
                return Ok(out);
            };
            let (ssg, wg, mg, rg, ghg) = (ss.storage(), ws.as_ref().map(|t| t.storage()), mean.storage(), rstd.storage(), gh.storage());
            let (gsg, rmg) = (gs.as_ref().map(|t| t.storage()), row_mask.as_ref().map(|t| t.storage()));
            let bop = "add_layer_norm_backward";
            let Storage::Cuda(sc) = &*ssg else { return Err(Error::invalid(bop, "expected the saved sum on the GPU")) };
            let wc = wg.as_deref().map(|s| as_gpu(bop, s, sc)).transpose()?;
            let gsc = gsg.as_deref().map(|s| as_gpu(bop, s, sc)).transpose()?;
            let rmc = rmg.as_deref().map(|s| as_gpu(bop, s, sc)).transpose()?;
            let (gx, gy, gw, gb) =
                gpu::add_layer_norm_backward(sc, wc, as_gpu(bop, &mg, sc)?, as_gpu(bop, &rg, sc)?, as_gpu(bop, &ghg, sc)?, gsc, alpha, drop, rmc, n)?;
            let gx = out_storage(Storage::Cuda(gx), ss.shape().clone());
            // For alpha 1 without dropout or row mask the residual's gradient is gx itself (not written twice).
            out[1] = needs[1].then(|| gy.map_or_else(|| gx.clone(), |gy| out_storage(Storage::Cuda(gy), ss.shape().clone())));
            out[0] = needs[0].then_some(gx);
            let mut k = 2;
            if has_w {
                out[k] = needs[k].then(|| out_storage(Storage::Cuda(gw), [n]));
                k += 1;
            }
            if has_b {
                out[k] = needs[k].then(|| out_storage(Storage::Cuda(gb), [n]));
            }
            Ok(out)
        }),
    );
    Ok((s, h))
}

/// The running statistics of a batch norm layer (updated in place while training).
pub struct BatchNormState<'a> {
    pub running_mean: &'a Tensor,
    pub running_var: &'a Tensor,
    /// Weight of the new batch's statistics (PyTorch's default 0.1).
    pub momentum: f64,
    pub eps: f64,
    pub training: bool,
}

/// The statistics `(mean, rstd)` (C) of one launch, moving the running
/// statistics in place while training (see the backend's `batch_norm_stats`).
pub(super) fn bn_stats(x: &Tensor, st: &BatchNormState, bs: usize, c: usize, tt: usize) -> Result<(Tensor, Tensor)> {
    let op = "batch_norm";
    let (m, r) = st.running_mean.with_storage_mut(|rm| {
        st.running_var.with_storage_mut(|rv| -> Result<(Storage, Storage)> {
            Ok(match (&*x.storage(), rm, rv) {
                (Storage::Cpu(s), Storage::Cpu(rm), Storage::Cpu(rv)) => {
                    let (m, r) = cpu::batch_norm_stats(s, rm, rv, bs, c, tt, st.eps, st.momentum, st.training)?;
                    (Storage::Cpu(m), Storage::Cpu(r))
                }
                (Storage::Cuda(s), Storage::Cuda(rm), Storage::Cuda(rv)) => {
                    let (m, r) = gpu::batch_norm_stats(s, rm, rv, bs, c, tt, st.eps, st.momentum, st.training)?;
                    (Storage::Cuda(m), Storage::Cuda(r))
                }
                _ => return Err(Error::DeviceMismatch { op, lhs: x.device(), rhs: st.running_mean.device() }),
            })
        })
    })?;
    Ok((out_storage(m, [c]), out_storage(r, [c])))
}

fn bn_apply(x: &Tensor, mean: &Tensor, rstd: &Tensor, w: &Tensor, b: &Tensor, c: usize, tt: usize) -> Result<Tensor> {
    let op = "batch_norm";
    let (xg, mg, rg, wg, bg) = (x.storage(), mean.storage(), rstd.storage(), w.storage(), b.storage());
    let y = match &*xg {
        Storage::Cpu(s) => Storage::Cpu(cpu::batch_norm_apply(s, as_cpu(op, &mg)?, as_cpu(op, &rg)?, as_cpu(op, &wg)?, as_cpu(op, &bg)?, c, tt)?),
        Storage::Cuda(s) => Storage::Cuda(gpu::batch_norm_apply(s, as_gpu(op, &mg, s)?, as_gpu(op, &rg, s)?, as_gpu(op, &wg, s)?, as_gpu(op, &bg, s)?, c, tt)?),
    };
    Ok(out_storage(y, x.shape().clone()))
}

#[allow(clippy::too_many_arguments)]
fn bn_backward(x: &Tensor, w: &Tensor, mean: &Tensor, rstd: &Tensor, g: &Tensor, bs: usize, c: usize, tt: usize, train: bool) -> Result<Three> {
    let op = "batch_norm_backward";
    let (xg, wg, mg, rg, gg) = (x.storage(), w.storage(), mean.storage(), rstd.storage(), g.storage());
    Ok(match &*xg {
        Storage::Cpu(s) => {
            let (gx, gw, gb) = cpu::batch_norm_backward(s, as_cpu(op, &wg)?, as_cpu(op, &mg)?, as_cpu(op, &rg)?, as_cpu(op, &gg)?, bs, c, tt, train)?;
            (Storage::Cpu(gx), Storage::Cpu(gw), Storage::Cpu(gb))
        }
        Storage::Cuda(s) => {
            let (gx, gw, gb) =
                gpu::batch_norm_backward(s, as_gpu(op, &wg, s)?, as_gpu(op, &mg, s)?, as_gpu(op, &rg, s)?, as_gpu(op, &gg, s)?, bs, c, tt, train)?;
            (Storage::Cuda(gx), Storage::Cuda(gw), Storage::Cuda(gb))
        }
    })
}

/// Batch norm of `x` (B, C) or (B, C, T) with affine weight and bias (C).
/// Training normalises by the batch's biased variance and moves the running
/// variance toward the unbiased one; eval uses the running statistics. The
/// statistics, the running update and rstd are one launch on the GPU. A
/// half `x` (autocast) takes f32 weight, bias and running statistics, is
/// normalised in f32 and gives a half result (no casts around it). The
/// channels-last layout (B·T, C) is the rank-2 case.
pub fn batch_norm(x: &Tensor, w: &Tensor, b: &Tensor, st: &BatchNormState) -> Result<Tensor> {
    super::expect_rank("batch_norm", "input", x, &[2, 3])?;
    let (bs, c) = (x.dims()[0], x.dims()[1]);
    let tt = if x.rank() == 3 { x.dims()[2] } else { 1 };
    let want = crate::backend::cpu::norm::ln_param_dtype(x.dtype());
    for (p, what) in [(w, "weight"), (b, "bias"), (st.running_mean, "running_mean"), (st.running_var, "running_var")] {
        expect_shape("batch_norm", what, p, &[c])?;
        if p.device() != x.device() {
            return Err(Error::DeviceMismatch { op: "batch_norm", lhs: x.device(), rhs: p.device() });
        }
        if p.dtype() != want {
            return Err(Error::DTypeMismatch { op: "batch_norm", expected: want, got: p.dtype() });
        }
    }
    if st.training && bs * tt < 2 {
        return Err(Error::invalid("batch_norm", format!("expected more than 1 value per channel when training, got input of shape {}", x.shape())));
    }
    let (mean, rstd) = no_grad(|| bn_stats(x, st, bs, c, tt))?;
    let y = bn_apply(x, &mean, &rstd, w, b, c, tt)?;
    let (xs, ws) = (x.detach(), w.detach());
    let train = st.training;
    Ok(record("batch_norm", &[x, w, b], y, vec![xs.clone()], move |g, _| {
        let (gx, gw, gb) = bn_backward(&xs, &ws, &mean, &rstd, g, bs, c, tt, train)?;
        Ok(vec![Some(out_storage(gx, xs.shape().clone())), Some(out_storage(gw, [c])), Some(out_storage(gb, [c]))])
    }))
}
