//! Convolutions on the GPU (`cuda/conv.cu`); mirrors `backend::cpu::conv`.
//! Depthwise conv1d (channels last) runs in its own kernels; conv2d is im2col here plus a
//! cuBLAS product in the op layer, and col2im for the input gradient.

use super::fastdiv::IndexWidth;
use super::kernels::conv as kc;
use super::nn_common::{elems, expect_dtype, expect_len, rows, same, u32_arg, FLOATS};
use super::CudaStorage;
use crate::backend::cpu::conv::{Conv2d, Dw1d};
use crate::error::Result;

/// A depthwise conv's sizes as the kernels' u32 arguments (batch, channels,
/// frames, kernel size, padding, output frames), each checked to fit.
pub(super) fn dw_args(op: &'static str, g: &Dw1d) -> Result<[u32; 6]> {
    Ok([
        u32_arg(op, "batch", g.b)?,
        u32_arg(op, "channels", g.c)?,
        u32_arg(op, "frames", g.t)?,
        u32_arg(op, "kernel size", g.k)?,
        u32_arg(op, "padding", g.pad)?,
        u32_arg(op, "output frames", g.t_out())?,
    ])
}

/// Depthwise conv1d forward, channels last: x (B, T, C), w (C, 1, K), bias (C) → (B, To, C).
pub fn conv1d_depthwise(x: &CudaStorage, w: &CudaStorage, bias: Option<&CudaStorage>, g: &Dw1d) -> Result<CudaStorage> {
    let op = "conv1d_depthwise";
    expect_dtype(op, x, FLOATS)?;
    same(op, x, w)?;
    expect_len(op, "the input (B, T, C)", x, g.b * g.t * g.c)?;
    expect_len(op, "the weight (C, 1, K)", w, g.c * g.k)?;
    if let Some(b) = bias {
        same(op, x, b)?;
        expect_len(op, "the bias (C)", b, g.c)?;
    }
    let [b, c, t, k, pad, to] = dw_args(op, g)?;
    let dev = x.device();
    let n = g.b * g.t_out() * g.c;
    let y = dev.alloc(x.dtype(), n)?;
    if n > 0 {
        kc::conv1d_depthwise_fwd(dev, x.dtype(), elems(n), x, w, bias.unwrap_or(w), &y, b, c, t, k, pad, to, bias.is_some() as u32)?;
    }
    Ok(y)
}

/// Depthwise conv1d backward, channels last: `(gx, gw, gbias)` in two
/// launches (the input gradient; the weight and bias gradients, a block per
/// tap and 32 channels summing in a fixed order: deterministic).
pub fn conv1d_depthwise_backward(x: &CudaStorage, w: &CudaStorage, gy: &CudaStorage, g: &Dw1d) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    let op = "conv1d_depthwise_backward";
    expect_dtype(op, x, FLOATS)?;
    same(op, x, w)?;
    same(op, x, gy)?;
    expect_len(op, "the input (B, T, C)", x, g.b * g.t * g.c)?;
    expect_len(op, "the weight (C, 1, K)", w, g.c * g.k)?;
    expect_len(op, "the output gradient (B, To, C)", gy, g.b * g.t_out() * g.c)?;
    let [b, c, t, k, pad, to] = dw_args(op, g)?;
    let (dt, dev) = (x.dtype(), x.device());
    let gx = dev.alloc(dt, x.len())?;
    if !x.is_empty() {
        kc::conv1d_depthwise_bwd_input(dev, dt, elems(x.len()), w, gy, &gx, b, c, t, k, pad, to)?;
    }
    let (gw, gb) = (dev.alloc(dt, g.c * g.k)?, dev.alloc(dt, g.c)?);
    // A block per (tap or bias, group of 32 channels).
    let blocks = (g.k + 1) * g.c.div_ceil(32);
    if blocks > 0 {
        kc::conv1d_depthwise_bwd_weight(dev, dt, rows(blocks), x, gy, &gw, &gb, b, c, t, k, pad, to)?;
    }
    Ok((gx, gw, gb))
}

fn geom_args(op: &'static str, g: &Conv2d) -> Result<[u32; 10]> {
    let (ho, wo) = g.out_hw();
    let vals = [
        (g.b, "batch"),
        (g.ci, "input channels"),
        (g.h, "height"),
        (g.w, "width"),
        (g.kh, "kernel height"),
        (g.kw, "kernel width"),
        (g.stride, "stride"),
        (g.pad, "padding"),
        (ho, "output height"),
        (wo, "output width"),
    ];
    let mut out = [0u32; 10];
    for (o, &(v, what)) in out.iter_mut().zip(&vals) {
        *o = u32_arg(op, what, v)?;
    }
    Ok(out)
}

/// The columns of a conv2d: (B, Ci·kh·kw, Ho·Wo), zero where the window leaves the image.
pub fn im2col(x: &CudaStorage, g: &Conv2d) -> Result<CudaStorage> {
    im2col_with(x, g, IndexWidth::Auto)
}

/// [`im2col`] with the index width chosen by the caller (`_u32` kernels
/// when every index fits below 2^31 under `Auto`; tests compare the two).
pub fn im2col_with(x: &CudaStorage, g: &Conv2d, width: IndexWidth) -> Result<CudaStorage> {
    let op = "im2col";
    expect_dtype(op, x, FLOATS)?;
    expect_len(op, "the input (B, Ci, H, W)", x, g.b * g.ci * g.h * g.w)?;
    let (ho, wo) = g.out_hw();
    let n = g.b * g.ci * g.kh * g.kw * ho * wo;
    let dev = x.device();
    let cols = dev.alloc(x.dtype(), n)?;
    let [b, ci, h, w, kh, kw, stride, pad, ho, wo] = geom_args(op, g)?;
    if n > 0 {
        let f = if width.use_u32(&[x.len(), n]) { kc::im2col_u32 } else { kc::im2col };
        f(dev, x.dtype(), elems(n), x, &cols, b, ci, h, w, kh, kw, stride, pad, ho, wo)?;
    }
    Ok(cols)
}

/// The adjoint of [`im2col`]: column gradients (B, Ci·kh·kw, Ho·Wo) summed
/// back into the input image (B, Ci, H, W).
pub fn col2im(cols: &CudaStorage, g: &Conv2d) -> Result<CudaStorage> {
    col2im_with(cols, g, IndexWidth::Auto)
}

/// [`col2im`] with the index width chosen by the caller.
pub fn col2im_with(cols: &CudaStorage, g: &Conv2d, width: IndexWidth) -> Result<CudaStorage> {
    let op = "col2im";
    expect_dtype(op, cols, FLOATS)?;
    let (ho, wo) = g.out_hw();
    expect_len(op, "the columns (B, Ci*kh*kw, Ho*Wo)", cols, g.b * g.ci * g.kh * g.kw * ho * wo)?;
    let n = g.b * g.ci * g.h * g.w;
    let dev = cols.device();
    let gx = dev.alloc(cols.dtype(), n)?;
    let [b, ci, h, w, kh, kw, stride, pad, ho, wo] = geom_args(op, g)?;
    if n > 0 {
        let f = if width.use_u32(&[cols.len(), n]) { kc::col2im_u32 } else { kc::col2im };
        f(dev, cols.dtype(), elems(n), cols, &gx, b, ci, h, w, kh, kw, stride, pad, ho, wo)?;
    }
    Ok(gx)
}

/// `relu(z + bias[c])` of z (B, C, L) in one launch (`bias_relu_fwd`): the
/// sum rounded to the dtype, then relu, as the add and relu kernels give it.
pub fn bias_relu(z: &CudaStorage, bias: &CudaStorage, c: usize, l: usize) -> Result<CudaStorage> {
    let op = "bias_relu";
    expect_dtype(op, z, FLOATS)?;
    same(op, z, bias)?;
    expect_len(op, "the bias (C)", bias, c)?;
    if c * l == 0 || z.len() % (c * l) != 0 {
        return Err(crate::error::Error::ShapeMismatch { op, expected: format!("an input (B, {c}, {l})"), got: format!("{} elements", z.len()) });
    }
    let dev = z.device();
    let y = dev.alloc(z.dtype(), z.len())?;
    kc::bias_relu_fwd(dev, z.dtype(), elems(z.len()), z, bias, &y, z.len() as u64, u32_arg(op, "channels", c)?, l as u64)?;
    Ok(y)
}

/// The backward of [`bias_relu`] from its output y and the output gradient
/// g in one launch (`bias_relu_bwd`): gz = g where y > 0 (else g·0), and
/// gbias[c] = Σ gz over the batch and L, summed in f32 (f64 for f64) and
/// rounded once. Returns (gz, gbias).
pub fn bias_relu_backward(y: &CudaStorage, g: &CudaStorage, c: usize, l: usize) -> Result<(CudaStorage, CudaStorage)> {
    let op = "bias_relu backward";
    expect_dtype(op, y, FLOATS)?;
    same(op, y, g)?;
    expect_len(op, "the output gradient", g, y.len())?;
    if c * l == 0 || y.len() % (c * l) != 0 {
        return Err(crate::error::Error::ShapeMismatch { op, expected: format!("an output (B, {c}, {l})"), got: format!("{} elements", y.len()) });
    }
    let b = y.len() / (c * l);
    let dev = y.device();
    let acc = super::attention::acc_dtype(y.dtype());
    let gz = dev.alloc(y.dtype(), y.len())?;
    if b == 0 {
        return Ok((gz, dev.zeros(y.dtype(), c)?));
    }
    let (part, gb) = (dev.alloc(acc, b * c)?, dev.alloc(y.dtype(), c)?);
    let arrivals = dev.arrivals(1)?;
    kc::bias_relu_bwd(dev, y.dtype(), rows(b * c), y, g, &gz, &part, &gb, &arrivals, b as u64, u32_arg(op, "channels", c)?, l as u64)?;
    Ok((gz, gb))
}
