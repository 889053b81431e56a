//! layer_norm over the last dim and batch_norm over the channel dim of
//! (B, C) or (B, C, T), with PyTorch's running-statistics semantics, on the
//! CPU or the GPU (the input's storage decides; parameters must be with it).

use super::expect_shape;
use super::out_storage;
use super::placement::{as_cpu, as_gpu};
use crate::autograd::{no_grad, record};
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

fn ln_backward(x: &Tensor, w: Option<&Tensor>, mean: &Tensor, rstd: &Tensor, g: &Tensor, n: usize) -> Result<Three> {
    let op = "layer_norm_backward";
    let (xg, wg, mg, rg, gg) = (x.storage(), w.map(|t| t.storage()), mean.storage(), rstd.storage(), g.storage());
    Ok(match &*xg {
        Storage::Cpu(c) => {
            let wc = wg.as_deref().map(|s| as_cpu(op, s)).transpose()?;
            let (gx, gw, gb) = cpu::layer_norm_backward(c, wc, as_cpu(op, &mg)?, as_cpu(op, &rg)?, as_cpu(op, &gg)?, n)?;
            (Storage::Cpu(gx), Storage::Cpu(gw), Storage::Cpu(gb))
        }
        Storage::Cuda(c) => {
            let wc = wg.as_deref().map(|s| as_gpu(op, s, c)).transpose()?;
            let (gx, gw, gb) = gpu::layer_norm_backward(c, wc, as_gpu(op, &mg, c)?, as_gpu(op, &rg, c)?, as_gpu(op, &gg, c)?, n)?;
            (Storage::Cuda(gx), Storage::Cuda(gw), Storage::Cuda(gb))
        }
    })
}

/// Layer norm over the last dim with optional affine weight and bias of that size.
pub fn layer_norm(x: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    let n = *x.dims().last().ok_or_else(|| Error::invalid("layer_norm", "expected a tensor of rank >= 1, got a scalar"))?;
    for (p, what) in [(w, "weight"), (b, "bias")] {
        if let Some(p) = p {
            expect_shape("layer_norm", what, p, &[n])?;
            if p.device() != x.device() {
                return Err(Error::DeviceMismatch { op: "layer_norm", lhs: x.device(), rhs: p.device() });
            }
            // Half inputs (autocast) are normalised with f32 parameters.
            let want = crate::backend::cpu::norm::ln_param_dtype(x.dtype());
            if p.dtype() != want {
                return Err(Error::DTypeMismatch { op: "layer_norm", expected: want, got: p.dtype() });
            }
        }
    }
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
        let (gx, gw, gb) = ln_backward(&xs, ws.as_ref(), &mean, &rstd, g, n)?;
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
