//! The Conformer convolution module between its two pointwise GEMMs:
//! `a` (B, T, 2C) = pointwise_conv1's output, channels last →
//! GLU over channels → zero the masked frames → depthwise conv (kernel K,
//! zero padding p) → batch or layer norm → swish → (B, To, C), the input of
//! pointwise_conv2 (`models::convolution` wraps the GEMMs around it).
//!
//! Two implementations, chosen by the fusion switch's `convmodule` family
//! (src/ops/fusion.rs): the composition of the existing ops (the reference,
//! on the CPU always: autograd and the finite-difference table go through
//! it), and on the GPU the fused kernels of `cuda/conv_module.cu`: two
//! launches forward (three with batch norm's statistics) and four backward,
//! recorded as one autograd node that saves only `a`, z (the conv's output,
//! kept in f32 for half activations: the norm amplifies its rounding) and
//! the norm's statistics. Batch norm's statistics and running-statistics
//! update are the norm op's own (`ops::batch_norm`'s launch, over all B·To
//! frames, as the composition).

use super::fusion::{self, Fusion};
use super::norm::bn_stats;
use super::out_storage;
use super::{expect_rank, expect_shape, same_kind, BatchNormState};
use crate::autograd::{no_grad, record};
use crate::backend::cpu::conv::Dw1d;
use crate::backend::cpu::norm::ln_param_dtype;
use crate::backend::cuda::conv_module as gpu;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::tensor::{DType, Device, Tensor};

/// The norm of [`conv_module_core`], with its affine parameters.
pub enum ConvCoreNorm<'a> {
    /// Batch norm over all B·To frames per channel (running statistics
    /// move in place while training, as `ops::batch_norm`).
    Batch {
        /// Scale (C).
        weight: &'a Tensor,
        /// Shift (C).
        bias: &'a Tensor,
        /// Running statistics, momentum, eps, training.
        state: BatchNormState<'a>,
    },
    /// Layer norm per frame over the C channels.
    Layer {
        /// Scale (C).
        weight: &'a Tensor,
        /// Shift (C).
        bias: &'a Tensor,
        /// Added to the variance.
        eps: f64,
    },
}

impl ConvCoreNorm<'_> {
    fn params(&self) -> (&Tensor, &Tensor) {
        match self {
            ConvCoreNorm::Batch { weight, bias, .. } | ConvCoreNorm::Layer { weight, bias, .. } => (weight, bias),
        }
    }
}

/// swish(norm(depthwise_conv(mask ? 0 : glu(a)))): `a` (B, T, 2C) channels
/// last, `mask` u8 (B, T, 1) with 1 at the frames whose GLU output is zeroed,
/// `dw_weight` (C, 1, K), `dw_bias` (C), zero `padding` on both sides →
/// (B, To, C), To = T + 2·padding − K + 1. The fused kernels when the
/// fusion switch has `convmodule` on and `a` is on a GPU; the composition
/// of glu, masked_fill, conv1d_depthwise, batch_norm or layer_norm and
/// silu otherwise. Under autocast the depthwise weights run in the half
/// type, the norm's parameters stay f32 (as in the composition).
pub fn conv_module_core(
    a: &Tensor,
    mask: Option<&Tensor>,
    dw_weight: &Tensor,
    dw_bias: Option<&Tensor>,
    padding: usize,
    norm: &ConvCoreNorm,
) -> Result<Tensor> {
    let op = "conv_module_core";
    expect_rank(op, "input a (B, T, 2C)", a, &[3])?;
    let (b, t, c2) = (a.dims()[0], a.dims()[1], a.dims()[2]);
    if c2 % 2 != 0 {
        return Err(Error::ShapeMismatch { op, expected: "an even channel count 2C in a (B, T, 2C)".into(), got: format!("{}", a.shape()) });
    }
    let c = c2 / 2;
    if let Some(m) = mask {
        expect_shape(op, "frame mask", m, &[b, t, 1])?;
        if m.dtype() != DType::U8 {
            return Err(Error::DTypeMismatch { op, expected: DType::U8, got: m.dtype() });
        }
    }
    let fused = fusion::enabled(Fusion::ConvModule) && matches!(a.device(), Device::Cuda(_)) && gpu::fits(b * t, b * t, c);
    if !fused {
        return composition(a, mask, dw_weight, dw_bias, padding, norm);
    }
    if let Some(y) = super::autocast::conv(a, dw_weight, dw_bias, |a, w, bias| conv_module_core_fused(a, mask, w, bias, padding, norm))? {
        return Ok(y);
    }
    conv_module_core_fused(a, mask, dw_weight, dw_bias, padding, norm)
}

/// The reference: the module's ops one after another.
fn composition(a: &Tensor, mask: Option<&Tensor>, dw_weight: &Tensor, dw_bias: Option<&Tensor>, padding: usize, norm: &ConvCoreNorm) -> Result<Tensor> {
    let mut h = super::glu(a, -1)?;
    if let Some(m) = mask {
        h = super::masked_fill(&h, m, 0.0)?;
    }
    let h = super::conv1d_depthwise(&h, dw_weight, dw_bias, padding)?;
    let h = match norm {
        ConvCoreNorm::Batch { weight, bias, state } => {
            let (b, t, c) = (h.dims()[0], h.dims()[1], h.dims()[2]);
            super::reshape(&super::batch_norm(&super::reshape(&h, [b * t, c])?, weight, bias, state)?, [b, t, c])?
        }
        ConvCoreNorm::Layer { weight, bias, eps } => super::layer_norm(&h, Some(weight), Some(bias), *eps)?,
    };
    super::silu(&h)
}

/// The GPU storage behind an operand of the fused kernels.
fn gpu_ref<'a>(op: &'static str, s: &'a Storage) -> Result<&'a crate::backend::cuda::CudaStorage> {
    match s {
        Storage::Cuda(g) => Ok(g),
        Storage::Cpu(_) => Err(Error::invalid(op, "expected every operand on the GPU, found one on the CPU")),
    }
}

/// The fused kernels (a on a GPU; the weights of a's dtype, the norm's
/// parameters of its parameter dtype).
fn conv_module_core_fused(
    a: &Tensor,
    mask: Option<&Tensor>,
    dw_weight: &Tensor,
    dw_bias: Option<&Tensor>,
    padding: usize,
    norm: &ConvCoreNorm,
) -> Result<Tensor> {
    let op = "conv_module_core";
    let (b, t, c) = (a.dims()[0], a.dims()[1], a.dims()[2] / 2);
    expect_rank(op, "depthwise weight (C, 1, K)", dw_weight, &[3])?;
    let k = dw_weight.dims()[2];
    expect_shape(op, "depthwise weight", dw_weight, &[c, 1, k])?;
    same_kind(op, a, dw_weight)?;
    if let Some(bb) = dw_bias {
        expect_shape(op, "depthwise bias", bb, &[c])?;
        same_kind(op, a, bb)?;
    }
    if t + 2 * padding < k {
        return Err(Error::invalid(op, format!("input of {t} frames with padding {padding} is shorter than the kernel {k}")));
    }
    let (nw, nb) = norm.params();
    let want = ln_param_dtype(a.dtype());
    for (p, what) in [(nw, "norm weight"), (nb, "norm bias")] {
        expect_shape(op, what, p, &[c])?;
        if p.device() != a.device() {
            return Err(Error::DeviceMismatch { op, lhs: a.device(), rhs: p.device() });
        }
        if p.dtype() != want {
            return Err(Error::DTypeMismatch { op, expected: want, got: p.dtype() });
        }
    }
    let g = Dw1d { b, c, t, k, pad: padding };
    let to = g.t_out();
    let rows = b * to;
    // The mask on a's GPU (it is built on the host for a causal module).
    let mask = mask.map(|m| m.detach().to_device(&a.device())).transpose()?;
    let z = {
        let (ag, mg, wg, bg) = (a.storage(), mask.as_ref().map(|m| m.storage()), dw_weight.storage(), dw_bias.map(|t| t.storage()));
        let mc = mg.as_deref().map(|s| gpu_ref(op, s)).transpose()?;
        let bc = bg.as_deref().map(|s| gpu_ref(op, s)).transpose()?;
        out_storage(Storage::Cuda(gpu::glu_dw_fwd(gpu_ref(op, &ag)?, mc, gpu_ref(op, &wg)?, bc, &g)?), [b, to, c])
    };
    let (y, mean, rstd, train) = match norm {
        ConvCoreNorm::Batch { state, .. } => {
            if state.training && rows < 2 {
                return Err(Error::invalid(op, format!("expected more than 1 frame per channel for batch norm when training, got {b} x {to}")));
            }
            let (mean, rstd) = no_grad(|| bn_stats(&z, state, rows, c, 1))?;
            let y = {
                let (zg, mg, rg, wg, bg) = (z.storage(), mean.storage(), rstd.storage(), nw.storage(), nb.storage());
                gpu::bn_swish_fwd(gpu_ref(op, &zg)?, gpu_ref(op, &mg)?, gpu_ref(op, &rg)?, gpu_ref(op, &wg)?, gpu_ref(op, &bg)?, c, a.dtype())?
            };
            (y, mean, rstd, Some(state.training))
        }
        ConvCoreNorm::Layer { eps, .. } => {
            let (zg, wg, bg) = (z.storage(), nw.storage(), nb.storage());
            let (y, mean, rstd) = gpu::ln_swish_fwd(gpu_ref(op, &zg)?, gpu_ref(op, &wg)?, gpu_ref(op, &bg)?, c, *eps, a.dtype())?;
            (y, out_storage(Storage::Cuda(mean), [rows]), out_storage(Storage::Cuda(rstd), [rows]), None)
        }
    };
    let y = out_storage(Storage::Cuda(y), [b, to, c]);
    let mut inputs = vec![a, dw_weight];
    inputs.extend(dw_bias);
    inputs.extend([nw, nb]);
    let has_bias = dw_bias.is_some();
    let (a, w, nw, nb) = (a.detach(), dw_weight.detach(), nw.detach(), nb.detach());
    let saved = vec![a.clone(), z.clone(), mean.clone(), rstd.clone()];
    Ok(record(op, &inputs, y, saved, move |gy, _| {
        let op = "conv_module_core backward";
        let (zg, nwg, nbg, mg, rg, gg) = (z.storage(), nw.storage(), nb.storage(), mean.storage(), rstd.storage(), gy.storage());
        let (zc, nwc, nbc, mc, rc, gc) = (gpu_ref(op, &zg)?, gpu_ref(op, &nwg)?, gpu_ref(op, &nbg)?, gpu_ref(op, &mg)?, gpu_ref(op, &rg)?, gpu_ref(op, &gg)?);
        let (dz, gnw, gnb) = match train {
            Some(train) => gpu::bn_swish_backward(zc, nwc, nbc, mc, rc, gc, c, train)?,
            None => gpu::ln_swish_backward(zc, nwc, nbc, mc, rc, gc, c)?,
        };
        let (ag, wg, fg) = (a.storage(), w.storage(), mask.as_ref().map(|m| m.storage()));
        let fc = fg.as_deref().map(|s| gpu_ref(op, s)).transpose()?;
        let (da, gw, gb) = gpu::dw_glu_backward(gpu_ref(op, &ag)?, fc, gpu_ref(op, &wg)?, &dz, &g)?;
        let mut v = vec![Some(out_storage(Storage::Cuda(da), [b, t, 2 * c])), Some(out_storage(Storage::Cuda(gw), [c, 1, k]))];
        if has_bias {
            v.push(Some(out_storage(Storage::Cuda(gb), [c])));
        }
        v.push(Some(out_storage(Storage::Cuda(gnw), [c])));
        v.push(Some(out_storage(Storage::Cuda(gnb), [c])));
        Ok(v)
    }))
}
