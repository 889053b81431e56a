//! layer_norm over the last dim and batch_norm over the channel dim of
//! (B, C) or (B, C, T), with PyTorch's running-statistics semantics.

use super::{cpu, expect_shape, out};
use crate::autograd::record;
use crate::backend::cpu::{norm as k, CpuStorage};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Layer norm over the last dim with optional affine weight and bias of that size.
pub fn layer_norm(x: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    let n = *x.dims().last().ok_or_else(|| Error::invalid("layer_norm", "expected a tensor of rank >= 1, got a scalar"))?;
    for (t, what) in [(w, "weight"), (b, "bias")] {
        if let Some(t) = t {
            expect_shape("layer_norm", what, t, &[n])?;
            super::same_kind("layer_norm", x, t)?;
        }
    }
    let (wg, bg) = (w.map(|t| t.storage()), b.map(|t| t.storage()));
    let (y, mean, rstd) = k::layer_norm(cpu("norm", &x.storage())?, wg.as_deref().map(|s| cpu("norm", s)).transpose()?, bg.as_deref().map(|s| cpu("norm", s)).transpose()?, n, eps)?;
    drop((wg, bg));
    let y = out(y, x.shape().clone());
    let (xs, ws) = (x.detach(), w.map(|t| t.detach()));
    let mut inputs = vec![x];
    inputs.extend(w);
    inputs.extend(b);
    let has_b = b.is_some();
    let saved = vec![xs.clone()];
    Ok(record("layer_norm", &inputs, y, saved, move |g, _| {
        let wgd = ws.as_ref().map(|t| t.storage());
        let (gx, gw, gb) = k::layer_norm_backward(cpu("norm", &xs.storage())?, wgd.as_deref().map(|s| cpu("norm", s)).transpose()?, &mean, &rstd, cpu("norm", &g.storage())?, n)?;
        let mut v = vec![Some(out(gx, xs.shape().clone()))];
        if ws.is_some() {
            v.push(Some(out(gw, [n])));
        }
        if has_b {
            v.push(Some(out(gb, [n])));
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

/// Batch norm of `x` (B, C) or (B, C, T) with affine weight and bias (C).
/// Training normalises by the batch's biased variance and moves the running
/// variance toward the unbiased one; eval uses the running statistics.
pub fn batch_norm(x: &Tensor, w: &Tensor, b: &Tensor, st: &BatchNormState) -> Result<Tensor> {
    super::expect_rank("batch_norm", "input", x, &[2, 3])?;
    let (bs, c) = (x.dims()[0], x.dims()[1]);
    let t = if x.rank() == 3 { x.dims()[2] } else { 1 };
    for (p, what) in [(w, "weight"), (b, "bias"), (st.running_mean, "running_mean"), (st.running_var, "running_var")] {
        expect_shape("batch_norm", what, p, &[c])?;
        super::same_kind("batch_norm", x, p)?;
    }
    let (mean, rstd): (CpuStorage, CpuStorage) = if st.training {
        let cnt = bs * t;
        if cnt < 2 {
            return Err(Error::invalid("batch_norm", format!("expected more than 1 value per channel when training, got input of shape {}", x.shape())));
        }
        let (m, v) = k::batch_norm_stats(cpu("norm", &x.storage())?, bs, c, t)?;
        let mt = out(m.clone(), [c]);
        let vt = out(v.clone(), [c]);
        crate::autograd::no_grad(|| -> Result<()> {
            let unbiased = super::mul_scalar(&vt, cnt as f64 / (cnt - 1) as f64)?;
            let nm = super::add(&super::mul_scalar(st.running_mean, 1.0 - st.momentum)?, &super::mul_scalar(&mt, st.momentum)?)?;
            let nv = super::add(&super::mul_scalar(st.running_var, 1.0 - st.momentum)?, &super::mul_scalar(&unbiased, st.momentum)?)?;
            st.running_mean.assign(&nm)?;
            st.running_var.assign(&nv)
        })?;
        let r = crate::autograd::no_grad(|| super::rsqrt(&super::add_scalar(&vt, st.eps)?))?;
        let r = cpu("norm", &r.storage())?.clone();
        (m, r)
    } else {
        let r = crate::autograd::no_grad(|| super::rsqrt(&super::add_scalar(st.running_var, st.eps)?))?;
        let m = cpu("norm", &st.running_mean.storage())?.clone();
        let r = cpu("norm", &r.storage())?.clone();
        (m, r)
    };
    let y = out(k::batch_norm_apply(cpu("norm", &x.storage())?, &mean, &rstd, cpu("norm", &w.storage())?, cpu("norm", &b.storage())?, c, t)?, x.shape().clone());
    let (xs, ws) = (x.detach(), w.detach());
    let train = st.training;
    Ok(record("batch_norm", &[x, w, b], y, vec![xs.clone()], move |g, _| {
        let (gx, gw, gb) = k::batch_norm_backward(cpu("norm", &xs.storage())?, cpu("norm", &ws.storage())?, &mean, &rstd, cpu("norm", &g.storage())?, bs, c, t, train)?;
        Ok(vec![Some(out(gx, xs.shape().clone())), Some(out(gw, [c])), Some(out(gb, [c]))])
    }))
}
