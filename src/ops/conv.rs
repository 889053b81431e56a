//! Depthwise conv1d (channels last), conv2d and pointwise conv1d (a
//! product, channels first or last), with PyTorch's
//! weight layouts: (C, 1, K) depthwise, (Co, Ci, kh, kw), (Co, Ci, 1).
//! On the GPU, depthwise conv1d has its own kernels and conv2d is im2col (a
//! recorded op whose backward is col2im) followed by a cuBLAS product, so
//! the weight gradient is the product's (a GEMM summed over the batch).

use super::out_storage;
use super::placement::{as_cpu, as_gpu};
use super::{expect_rank, expect_shape, same_kind};
use crate::autograd::record;
use crate::backend::cpu::conv::{self as k, Conv2d, Dw1d};
use crate::backend::cuda::conv as gpu;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::tensor::{Device, Tensor};

fn dw_forward(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, g: &Dw1d) -> Result<Storage> {
    let op = "conv1d_depthwise";
    let (xg, wg, bg) = (x.storage(), w.storage(), bias.map(|t| t.storage()));
    Ok(match &*xg {
        Storage::Cpu(c) => Storage::Cpu(k::conv1d_depthwise(c, as_cpu(op, &wg)?, bg.as_deref().map(|s| as_cpu(op, s)).transpose()?, g)?),
        Storage::Cuda(c) => Storage::Cuda(gpu::conv1d_depthwise(c, as_gpu(op, &wg, c)?, bg.as_deref().map(|s| as_gpu(op, s, c)).transpose()?, g)?),
    })
}

fn dw_backward(x: &Tensor, w: &Tensor, gy: &Tensor, g: &Dw1d) -> Result<(Storage, Storage, Storage)> {
    let op = "conv1d_depthwise_backward";
    let (xg, wg, gg) = (x.storage(), w.storage(), gy.storage());
    Ok(match &*xg {
        Storage::Cpu(c) => {
            let (gx, gw, gb) = k::conv1d_depthwise_backward(c, as_cpu(op, &wg)?, as_cpu(op, &gg)?, g)?;
            (Storage::Cpu(gx), Storage::Cpu(gw), Storage::Cpu(gb))
        }
        Storage::Cuda(c) => {
            let (gx, gw, gb) = gpu::conv1d_depthwise_backward(c, as_gpu(op, &wg, c)?, as_gpu(op, &gg, c)?, g)?;
            (Storage::Cuda(gx), Storage::Cuda(gw), Storage::Cuda(gb))
        }
    })
}

fn inputs<'a>(x: &'a Tensor, w: &'a Tensor, b: Option<&'a Tensor>) -> Vec<&'a Tensor> {
    let mut v = vec![x, w];
    v.extend(b);
    v
}

/// Depthwise conv1d, channels last: x (B, T, C), w (C, 1, K) (PyTorch's
/// layout), bias (C), zero padding on both sides, stride 1 → (B, To, C).
/// Under autocast it runs in the half type and gives a half result.
pub fn conv1d_depthwise(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, padding: usize) -> Result<Tensor> {
    if let Some(y) = super::autocast::conv(x, w, bias, |x, w, b| conv1d_depthwise(x, w, b, padding))? {
        return Ok(y);
    }
    expect_rank("conv1d_depthwise", "input (B, T, C)", x, &[3])?;
    let (b, t, c) = (x.dims()[0], x.dims()[1], x.dims()[2]);
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
    if let Some(bb) = bias {
        same_kind("conv1d_depthwise", x, bb)?;
    }
    let y = out_storage(dw_forward(x, w, bias, &g)?, [b, g.t_out(), c]);
    let (xs, ws) = (x.detach(), w.detach());
    let has_b = bias.is_some();
    Ok(record("conv1d_depthwise", &inputs(x, w, bias), y, vec![xs.clone(), ws.clone()], move |gy, _| {
        let (gx, gw, gb) = dw_backward(&xs, &ws, gy, &g)?;
        let mut v = vec![Some(out_storage(gx, xs.shape().clone())), Some(out_storage(gw, ws.shape().clone()))];
        if has_b {
            v.push(Some(out_storage(gb, [g.c])));
        }
        Ok(v)
    }))
}

/// Conv2d: x (B, Ci, H, W), w (Co, Ci, kh, kw), bias (Co); square stride and zero padding.
/// Under autocast it runs in the half type and gives a half result.
pub fn conv2d(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, stride: usize, padding: usize) -> Result<Tensor> {
    if let Some(y) = super::autocast::conv(x, w, bias, |x, w, b| conv2d(x, w, b, stride, padding))? {
        return Ok(y);
    }
    let g = conv2d_geometry(x, w, bias, stride, padding)?;
    let (ho, wo) = g.out_hw();
    if let Device::Cuda(_) = x.device() {
        return conv2d_gpu(x, w, bias, &g, false);
    }
    let op = "conv2d";
    let y = {
        let (xg, wg, bg) = (x.storage(), w.storage(), bias.map(|t| t.storage()));
        let bc = bg.as_deref().map(|s| as_cpu(op, s)).transpose()?;
        out_storage(Storage::Cpu(k::conv2d(as_cpu(op, &xg)?, as_cpu(op, &wg)?, bc, &g)?), [g.b, g.co, ho, wo])
    };
    let (xs, ws) = (x.detach(), w.detach());
    let has_b = bias.is_some();
    Ok(record("conv2d", &inputs(x, w, bias), y, vec![xs.clone(), ws.clone()], move |gy, needs| {
        let (gx, gw, gb) = {
            let (xg, wg, gg) = (xs.storage(), ws.storage(), gy.storage());
            k::conv2d_backward(as_cpu(op, &xg)?, as_cpu(op, &wg)?, as_cpu(op, &gg)?, &g, needs[0])?
        };
        let gx = needs[0].then(|| out_storage(Storage::Cpu(gx), xs.shape().clone()));
        let mut v = vec![gx, Some(out_storage(Storage::Cpu(gw), ws.shape().clone()))];
        if has_b {
            v.push(Some(out_storage(Storage::Cpu(gb), [g.co])));
        }
        Ok(v)
    }))
}

/// `relu(conv2d(x, w, bias))`, the conv2d subsampling's convolution and
/// its ReLU (fusion family `subsampling`). On a GPU with a bias, the bias
/// and the ReLU after the product are one launch each way (`cuda/conv.cu`
/// `bias_relu_fwd/_bwd`, whose backward also sums the bias's gradient)
/// where the composition's add, relu and their backwards took six; the
/// same output and input gradient bits, the bias's gradient summed in
/// another order (without a bias: the product, then `relu`). On the CPU,
/// the composition. Under autocast it runs in the half type and gives a
/// half result.
pub fn conv2d_relu(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, stride: usize, padding: usize) -> Result<Tensor> {
    if let Some(y) = super::autocast::conv(x, w, bias, |x, w, b| conv2d_relu(x, w, b, stride, padding))? {
        return Ok(y);
    }
    match x.device() {
        Device::Cuda(_) => conv2d_gpu(x, w, bias, &conv2d_geometry(x, w, bias, stride, padding)?, true),
        Device::Cpu => super::relu(&conv2d(x, w, bias, stride, padding)?),
    }
}

/// The checks of a conv2d's operands and its geometry.
fn conv2d_geometry(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, stride: usize, padding: usize) -> Result<Conv2d> {
    expect_rank("conv2d", "input (B, Ci, H, W)", x, &[4])?;
    expect_rank("conv2d", "weight (Co, Ci, kh, kw)", w, &[4])?;
    same_kind("conv2d", x, w)?;
    let (xd, wd) = (x.dims(), w.dims());
    if xd[1] != wd[1] {
        return Err(Error::ShapeMismatch {
            op: "conv2d",
            expected: format!("{} input channels as the weight {}", wd[1], w.shape()),
            got: format!("input {}", x.shape()),
        });
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
    if let Some(bb) = bias {
        same_kind("conv2d", x, bb)?;
    }
    Ok(g)
}

/// The columns (B, Ci·kh·kw, Ho·Wo) of a GPU conv2d, recorded so that the
/// input gradient is col2im of the columns' gradient.
fn im2col_gpu(x: &Tensor, g: &Conv2d) -> Result<Tensor> {
    let op = "im2col";
    let (ho, wo) = g.out_hw();
    let cols = match &*x.storage() {
        Storage::Cuda(c) => Storage::Cuda(gpu::im2col(c, g)?),
        Storage::Cpu(_) => return Err(Error::DeviceMismatch { op, lhs: Device::Cuda(0), rhs: x.device() }),
    };
    let cols = out_storage(cols, [g.b, g.ci * g.kh * g.kw, ho * wo]);
    let (g, from) = (*g, x.shape().clone());
    Ok(record(op, &[x], cols, vec![], move |gc, _| {
        let gx = match &*gc.storage() {
            Storage::Cuda(c) => Storage::Cuda(gpu::col2im(c, &g)?),
            Storage::Cpu(_) => return Err(Error::DeviceMismatch { op: "col2im", lhs: Device::Cuda(0), rhs: gc.device() }),
        };
        Ok(vec![Some(out_storage(gx, from.clone()))])
    }))
}

/// Conv2d on the GPU: y_b = W (Co, Ci·kh·kw) · cols_b, plus the bias per
/// output channel; with `relu`, the bias and the ReLU in [`bias_relu_gpu`].
fn conv2d_gpu(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, g: &Conv2d, relu: bool) -> Result<Tensor> {
    let (ho, wo) = g.out_hw();
    let cols = im2col_gpu(x, g)?;
    let w2 = super::reshape(w, [g.co, g.ci * g.kh * g.kw])?;
    let mut y = super::matmul(&w2, &cols)?;
    match bias {
        Some(b) if relu => y = bias_relu_gpu(&y, b)?,
        Some(b) => y = super::add(&y, &super::reshape(b, [g.co, 1])?)?,
        None if relu => y = super::relu(&y)?,
        None => {}
    }
    super::reshape(&y, [g.b, g.co, ho, wo])
}

/// `relu(z + bias[c])` of z (B, C, L) on the GPU, one launch each way; the
/// backward gives z's gradient and the bias's (see [`conv2d_relu`]).
fn bias_relu_gpu(z: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let op = "bias_relu";
    let (c, l) = (z.dims()[1], z.dims()[2]);
    let y = match (&*z.storage(), &*bias.storage()) {
        (Storage::Cuda(zc), Storage::Cuda(bc)) => gpu::bias_relu(zc, bc, c, l)?,
        _ => return Err(super::mixed(op)),
    };
    let y = out_storage(Storage::Cuda(y), z.shape().clone());
    let ys = y.detach();
    let bshape = bias.shape().clone();
    Ok(record(op, &[z, bias], y, vec![ys.clone()], move |g, needs| {
        let (gz, gb) = match (&*ys.storage(), &*g.storage()) {
            (Storage::Cuda(yc), Storage::Cuda(gc)) => gpu::bias_relu_backward(yc, gc, c, l)?,
            _ => return Err(super::mixed("bias_relu backward")),
        };
        Ok(vec![Some(out_storage(Storage::Cuda(gz), ys.shape().clone())), needs[1].then(|| out_storage(Storage::Cuda(gb), bshape.clone()))])
    }))
}

/// Pointwise conv1d as a product: x (B, Ci, T), w (Co, Ci, 1), bias (Co) → (B, Co, T).
pub fn conv1d_pointwise(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    // Under autocast: the half copies of the weight and bias (made once per
    // step, before the reshapes below would hide the parameters), a half result.
    if let Some(y) = super::autocast::conv(x, w, bias, conv1d_pointwise)? {
        return Ok(y);
    }
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

/// Pointwise conv1d on channels-last x (B, T, Ci) with PyTorch's weight
/// (Co, Ci, 1) and bias (Co) → (B, T, Co): `linear` on the weight viewed as
/// (Co, Ci), so on the GPU the bias is cuBLASLt's epilogue and its gradient
/// the BGRADB epilogue (no broadcast add, no column sum).
pub fn conv1d_pointwise_channels_last(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    // Under autocast: the half copies of the weight and bias (made once per
    // step, before the reshape below would hide the parameter), a half result.
    if let Some(y) = super::autocast::conv(x, w, bias, conv1d_pointwise_channels_last)? {
        return Ok(y);
    }
    expect_rank("conv1d_pointwise", "weight (Co, Ci, 1)", w, &[3])?;
    let (co, ci) = (w.dims()[0], w.dims()[1]);
    expect_shape("conv1d_pointwise", "weight", w, &[co, ci, 1])?;
    super::linear(x, &super::reshape(w, [co, ci])?, bias)
}
