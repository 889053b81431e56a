//! Depthwise conv1d, conv2d and pointwise conv1d (a product), with PyTorch's
//! weight layouts: (C, 1, K) depthwise, (Co, Ci, kh, kw), (Co, Ci, 1).

use super::{cpu, expect_rank, expect_shape, out, same_kind};
use crate::autograd::record;
use crate::backend::cpu::conv::{self as k, Conv2d, Dw1d};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

fn inputs<'a>(x: &'a Tensor, w: &'a Tensor, b: Option<&'a Tensor>) -> Vec<&'a Tensor> {
    let mut v = vec![x, w];
    v.extend(b);
    v
}

/// Depthwise conv1d: x (B, C, T), w (C, 1, K), bias (C), zero padding on both sides, stride 1.
/// Under autocast the input and weight are rounded through the half type.
pub fn conv1d_depthwise(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, padding: usize) -> Result<Tensor> {
    if let Some(y) = super::autocast::conv(x, w, |x, w| conv1d_depthwise(x, w, bias, padding))? {
        return Ok(y);
    }
    expect_rank("conv1d_depthwise", "input (B, C, T)", x, &[3])?;
    let (b, c, t) = (x.dims()[0], x.dims()[1], x.dims()[2]);
    expect_rank("conv1d_depthwise", "weight (C, 1, K)", w, &[3])?;
    let kk = w.dims()[2];
    expect_shape("conv1d_depthwise", "weight", w, &[c, 1, kk])?;
    same_kind("conv1d_depthwise", x, w)?;
    if let Some(bb) = bias {
        expect_shape("conv1d_depthwise", "bias", bb, &[c])?;
    }
    let g = Dw1d { b, c, t, k: kk, pad: padding };
    if t + 2 * padding < kk {
        return Err(Error::invalid("conv1d_depthwise", format!("input of {t} frames with padding {padding} is shorter than the kernel {kk}")));
    }
    let bg = bias.map(|t| t.storage());
    let y = out(k::depthwise_conv1d(cpu("conv", &x.storage())?, cpu("conv", &w.storage())?, bg.as_deref().map(|s| cpu("conv", s)).transpose()?, &g)?, [b, c, g.t_out()]);
    drop(bg);
    let (xs, ws) = (x.detach(), w.detach());
    let has_b = bias.is_some();
    Ok(record("conv1d_depthwise", &inputs(x, w, bias), y, vec![xs.clone(), ws.clone()], move |gy, _| {
        let (gx, gw, gb) = k::depthwise_conv1d_backward(cpu("conv", &xs.storage())?, cpu("conv", &ws.storage())?, cpu("conv", &gy.storage())?, &g)?;
        let mut v = vec![Some(out(gx, xs.shape().clone())), Some(out(gw, ws.shape().clone()))];
        if has_b {
            v.push(Some(out(gb, [g.c])));
        }
        Ok(v)
    }))
}

/// Conv2d: x (B, Ci, H, W), w (Co, Ci, kh, kw), bias (Co); square stride and zero padding.
/// Under autocast the input and weight are rounded through the half type.
pub fn conv2d(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, stride: usize, padding: usize) -> Result<Tensor> {
    if let Some(y) = super::autocast::conv(x, w, |x, w| conv2d(x, w, bias, stride, padding))? {
        return Ok(y);
    }
    expect_rank("conv2d", "input (B, Ci, H, W)", x, &[4])?;
    expect_rank("conv2d", "weight (Co, Ci, kh, kw)", w, &[4])?;
    same_kind("conv2d", x, w)?;
    let (xd, wd) = (x.dims(), w.dims());
    if xd[1] != wd[1] {
        return Err(Error::ShapeMismatch { op: "conv2d", expected: format!("{} input channels as the weight {}", wd[1], w.shape()), got: format!("input {}", x.shape()) });
    }
    if stride == 0 {
        return Err(Error::invalid("conv2d", "stride must be at least 1, got 0"));
    }
    if let Some(bb) = bias {
        expect_shape("conv2d", "bias", bb, &[wd[0]])?;
    }
    let g = Conv2d { b: xd[0], ci: xd[1], h: xd[2], w: xd[3], co: wd[0], kh: wd[2], kw: wd[3], stride, pad: padding };
    let (ho, wo) = g.out_hw();
    if ho == 0 || wo == 0 {
        return Err(Error::invalid("conv2d", format!("input {} is smaller than the kernel {}x{} (padding {padding})", x.shape(), g.kh, g.kw)));
    }
    let bg = bias.map(|t| t.storage());
    let y = out(k::conv2d(cpu("conv", &x.storage())?, cpu("conv", &w.storage())?, bg.as_deref().map(|s| cpu("conv", s)).transpose()?, &g)?, [g.b, g.co, ho, wo]);
    drop(bg);
    let (xs, ws) = (x.detach(), w.detach());
    let has_b = bias.is_some();
    Ok(record("conv2d", &inputs(x, w, bias), y, vec![xs.clone(), ws.clone()], move |gy, _| {
        let (gx, gw, gb) = k::conv2d_backward(cpu("conv", &xs.storage())?, cpu("conv", &ws.storage())?, cpu("conv", &gy.storage())?, &g)?;
        let mut v = vec![Some(out(gx, xs.shape().clone())), Some(out(gw, ws.shape().clone()))];
        if has_b {
            v.push(Some(out(gb, [g.co])));
        }
        Ok(v)
    }))
}

/// Pointwise conv1d as a product: x (B, Ci, T), w (Co, Ci, 1), bias (Co) → (B, Co, T).
pub fn conv1d_pointwise(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    expect_rank("conv1d_pointwise", "input (B, Ci, T)", x, &[3])?;
    expect_rank("conv1d_pointwise", "weight (Co, Ci, 1)", w, &[3])?;
    let (co, ci) = (w.dims()[0], w.dims()[1]);
    expect_shape("conv1d_pointwise", "weight", w, &[co, x.dims()[1], 1])?;
    let w2 = super::reshape(w, [co, ci])?;
    let y = super::matmul(&w2, x)?;
    match bias {
        Some(b) => {
            expect_shape("conv1d_pointwise", "bias", b, &[co])?;
            super::add(&y, &super::reshape(b, [co, 1])?)
        }
        None => Ok(y),
    }
}
