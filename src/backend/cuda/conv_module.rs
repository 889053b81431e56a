//! The Conformer convolution module fused between its two GEMMs on the GPU
//! (`cuda/conv_module.cu`; the op is `ops::conv_module_core`). Forward: the
//! GLU, mask and depthwise conv in one launch, then the norm and swish (batch
//! norm's statistics by the norm module's launch first). Backward: the norm
//! and swish backward (two launches), then the depthwise input gradient fused
//! with the mask and GLU backward, and the depthwise weight gradient (conv.cuh's
//! sums). z and dz stay in f32 for half activations (see the .cu file).

use super::conv::dw_args;
use super::kernels::conv_module as k;
use super::nn_common::{elems, expect_dtype, expect_len, rows, same, u32_arg, FLOATS};
use super::norm::{bn_launch, bn_scratch, bn_tiling, ln_param, ln_sums, LnSums};
use super::softmax::row_launch;
use super::CudaStorage;
use crate::backend::cpu::conv::Dw1d;
use crate::backend::cpu::norm::ln_param_dtype;
use crate::error::{Error, Result};
use crate::tensor::DType;

/// Whether the fused kernels take a module of `rows` frames (B·To) and `c`
/// channels: every index below 2^31 (batch norm's tiled sums and the u32
/// arguments); larger modules run the composition.
pub fn fits(rows: usize, in_frames_total: usize, c: usize) -> bool {
    bn_tiling(rows, c, 1).is_some() && super::fastdiv::fits_u32(&[in_frames_total * 2 * c])
}

/// The frame mask (B·T u8) checked, or a one-byte stand-in never read.
fn mask_arg(op: &'static str, a: &CudaStorage, mask: Option<&CudaStorage>, g: &Dw1d) -> Result<(Option<CudaStorage>, u32)> {
    match mask {
        Some(m) => {
            if m.dtype() != DType::U8 {
                return Err(Error::DTypeMismatch { op, expected: DType::U8, got: m.dtype() });
            }
            if m.ordinal() != a.ordinal() {
                return Err(Error::invalid(op, format!("expected the frame mask on cuda:{}, found cuda:{}", a.ordinal(), m.ordinal())));
            }
            expect_len(op, "the frame mask (B, T)", m, g.b * g.t)?;
            Ok((None, 1))
        }
        // The kernels read no mask when has_mask is 0: a byte of U8 stands
        // in for the pointer, uninitialised (no memset).
        None => Ok((Some(a.device().alloc(DType::U8, 1)?), 0)),
    }
}

/// z (the conv's output) is kept in the activations' parameter dtype
/// (f32 for f16/bf16 activations of dtype `dt`).
fn check_z(op: &'static str, z: &CudaStorage, dt: DType) -> Result<()> {
    expect_dtype(op, z, FLOATS)?;
    let want = ln_param_dtype(dt);
    if z.dtype() != want {
        return Err(Error::DTypeMismatch { op, expected: want, got: z.dtype() });
    }
    Ok(())
}

fn check_conv(op: &'static str, a: &CudaStorage, w: &CudaStorage, g: &Dw1d) -> Result<()> {
    expect_dtype(op, a, FLOATS)?;
    same(op, a, w)?;
    expect_len(op, "the GLU input (B, T, 2C)", a, g.b * g.t * 2 * g.c)?;
    expect_len(op, "the depthwise weight (C, 1, K)", w, g.c * g.k)
}

/// z (B, To, C) = depthwise_conv(mask ? 0 : glu(a)) + bias, a (B, T, 2C), in
/// one launch; z in a's parameter dtype (f32 for half a: unrounded).
pub fn glu_dw_fwd(a: &CudaStorage, mask: Option<&CudaStorage>, w: &CudaStorage, bias: Option<&CudaStorage>, g: &Dw1d) -> Result<CudaStorage> {
    let op = "conv_module_core";
    check_conv(op, a, w, g)?;
    if let Some(b) = bias {
        same(op, a, b)?;
        expect_len(op, "the depthwise bias (C)", b, g.c)?;
    }
    let (stand_in, has_mask) = mask_arg(op, a, mask, g)?;
    let m = mask.or(stand_in.as_ref()).ok_or_else(|| Error::invalid(op, "no frame mask buffer"))?;
    let [b, c, t, kk, pad, to] = dw_args(op, g)?;
    let dev = a.device();
    let n = g.b * g.t_out() * g.c;
    let z = dev.alloc(ln_param_dtype(a.dtype()), n)?;
    if n > 0 {
        k::conv_module_glu_dw_fwd(dev, a.dtype(), elems(n), a, m, w, bias.unwrap_or(w), &z, b, c, t, kk, pad, to, bias.is_some() as u32, has_mask)?;
    }
    Ok(z)
}

/// y = swish((z − mean)·rstd·w + b) over z (N, C) channels last, y of dtype `dt`.
pub fn bn_swish_fwd(z: &CudaStorage, mean: &CudaStorage, rstd: &CudaStorage, w: &CudaStorage, bias: &CudaStorage, c: usize, dt: DType) -> Result<CudaStorage> {
    let op = "conv_module_core";
    check_z(op, z, dt)?;
    let cc = u32_arg(op, "channel count", c)?;
    for (s, what) in [(mean, "mean"), (rstd, "rstd"), (w, "norm weight"), (bias, "norm bias")] {
        ln_param(op, what, z, s, c)?;
    }
    let dev = z.device();
    let y = dev.alloc(dt, z.len())?;
    if !z.is_empty() {
        k::conv_module_bn_swish_fwd(dev, dt, elems(z.len()), z, mean, rstd, w, bias, &y, z.len() as u64, cc)?;
    }
    Ok(y)
}

/// y = swish(layer_norm(z)·w + b) per frame of z (rows, C), y of dtype `dt`: `(y, mean, rstd)`.
pub fn ln_swish_fwd(z: &CudaStorage, w: &CudaStorage, bias: &CudaStorage, c: usize, eps: f64, dt: DType) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    let op = "conv_module_core";
    check_z(op, z, dt)?;
    ln_param(op, "norm weight", z, w, c)?;
    ln_param(op, "norm bias", z, bias, c)?;
    let n = u32_arg(op, "channel count", c)?;
    let r = z.len().checked_div(c).unwrap_or(0);
    let dev = z.device();
    let pd = z.dtype();
    let (y, mean, rstd) = (dev.alloc(dt, z.len())?, dev.alloc(pd, r)?, dev.alloc(pd, r)?);
    let (warp, cfg) = row_launch(c, r);
    let f = if warp { k::conv_module_ln_swish_fwd_warp } else { k::conv_module_ln_swish_fwd };
    if !z.is_empty() {
        f(dev, dt, cfg, z, w, bias, &y, &mean, &rstd, r as u64, n, eps)?;
    }
    Ok((y, mean, rstd))
}

/// The batch norm + swish backward over z (N, C): `(dz, gw, gb)`, dz in z's
/// dtype (f32 for half gy); with `train` the statistics were the batch's.
#[allow(clippy::too_many_arguments)]
pub fn bn_swish_backward(
    z: &CudaStorage,
    w: &CudaStorage,
    bias: &CudaStorage,
    mean: &CudaStorage,
    rstd: &CudaStorage,
    gy: &CudaStorage,
    c: usize,
    train: bool,
) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    let op = "conv_module_core backward";
    expect_dtype(op, gy, FLOATS)?;
    check_z(op, z, gy.dtype())?;
    let cc = u32_arg(op, "channel count", c)?;
    for (s, what) in [(mean, "mean"), (rstd, "rstd"), (w, "norm weight"), (bias, "norm bias")] {
        ln_param(op, what, z, s, c)?;
    }
    expect_len(op, "the output gradient", gy, z.len())?;
    let n = z.len().checked_div(c).unwrap_or(0);
    let (dt, dev) = (gy.dtype(), z.device());
    let pd = z.dtype();
    let (gb, gw) = (dev.alloc(pd, c)?, dev.alloc(pd, c)?);
    let dz = dev.alloc(pd, z.len())?;
    if z.is_empty() {
        return Ok((dz, dev.zeros(pd, c)?, dev.zeros(pd, c)?));
    }
    let (tile_rows, tiles) = bn_tiling(n, c, 1)
        .ok_or_else(|| Error::invalid(op, format!("expected fewer than 2^31 elements for the fused kernels, found {n} x {c} (the composition takes these)")))?;
    let (part, counters) = bn_scratch(z, c, tiles)?;
    k::conv_module_bn_swish_bwd_sums_cl(dev, dt, bn_launch(c, tiles), z, mean, rstd, w, bias, gy, &gb, &gw, &part, &counters, n as u32, cc, tile_rows)?;
    k::conv_module_bn_swish_bwd_dz(dev, dt, elems(z.len()), z, w, bias, mean, rstd, gy, &gb, &gw, &dz, z.len() as u64, cc, train as u32)?;
    Ok((dz, gw, gb))
}

/// The layer norm + swish backward over z (rows, C): `(dz, gw, gb)`, dz in z's dtype.
pub fn ln_swish_backward(
    z: &CudaStorage,
    w: &CudaStorage,
    bias: &CudaStorage,
    mean: &CudaStorage,
    rstd: &CudaStorage,
    gy: &CudaStorage,
    c: usize,
) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    let op = "conv_module_core backward";
    expect_dtype(op, gy, FLOATS)?;
    check_z(op, z, gy.dtype())?;
    let n = u32_arg(op, "channel count", c)?;
    let r = z.len().checked_div(c).unwrap_or(0);
    for (s, what) in [(mean, "mean"), (rstd, "rstd")] {
        ln_param(op, what, z, s, r)?;
    }
    ln_param(op, "norm weight", z, w, c)?;
    ln_param(op, "norm bias", z, bias, c)?;
    expect_len(op, "the output gradient", gy, z.len())?;
    let (dt, dev) = (gy.dtype(), z.device());
    let pd = z.dtype();
    let dz = dev.alloc(pd, z.len())?;
    let LnSums { chunk, chunks, pw, pb, gw, gb, arrivals } = ln_sums(dev, pd, r, c)?;
    let (warp, _) = row_launch(c, r);
    let f = if warp { k::conv_module_ln_swish_bwd_warp } else { k::conv_module_ln_swish_bwd };
    if !z.is_empty() {
        f(dev, dt, rows(chunks), z, w, bias, mean, rstd, gy, &dz, &pw, &pb, &gw, &gb, &arrivals, r as u64, n, chunk as u32)?;
    }
    Ok((dz, gw, gb))
}

/// The gradients `(da, gw, gbias)` of z = depthwise_conv(mask ? 0 : glu(a)) +
/// bias from dz (B, To, C, a's parameter dtype): da (B, T, 2C) in one
/// launch (which also writes the GLU output h in dz's dtype), gw (C·K) and
/// gbias (C) in a's dtype by conv.cuh's weight-gradient sums over (h, dz).
pub fn dw_glu_backward(
    a: &CudaStorage,
    mask: Option<&CudaStorage>,
    w: &CudaStorage,
    dz: &CudaStorage,
    g: &Dw1d,
) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    let op = "conv_module_core backward";
    check_conv(op, a, w, g)?;
    check_z(op, dz, a.dtype())?;
    expect_len(op, "the gradient of z (B, To, C)", dz, g.b * g.t_out() * g.c)?;
    let (stand_in, has_mask) = mask_arg(op, a, mask, g)?;
    let m = mask.or(stand_in.as_ref()).ok_or_else(|| Error::invalid(op, "no frame mask buffer"))?;
    let [b, c, t, kk, pad, to] = dw_args(op, g)?;
    let (dt, dev) = (a.dtype(), a.device());
    let n = g.b * g.t * g.c;
    let (da, h) = (dev.alloc(dt, a.len())?, dev.alloc(dz.dtype(), n)?);
    if n > 0 {
        k::conv_module_dw_glu_bwd(dev, dt, elems(n), a, m, w, dz, &da, &h, b, c, t, kk, pad, to, has_mask)?;
    }
    let (gw, gb) = (dev.alloc(dt, g.c * g.k)?, dev.alloc(dt, g.c)?);
    let blocks = (g.k + 1) * g.c.div_ceil(32);
    if blocks > 0 {
        k::conv_module_dw_bwd_weight(dev, dt, rows(blocks), &h, dz, &gw, &gb, b, c, t, kk, pad, to)?;
    }
    Ok((da, gw, gb))
}
