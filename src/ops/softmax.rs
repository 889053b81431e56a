//! softmax, log_softmax and masked_softmax over the last dim, with their
//! backward kernels, on the CPU or the GPU (the tensor's storage decides).

use super::placement::to_gpu;
use crate::autograd::record;
use crate::backend::cpu::softmax::{self as cpu, MaskRows};
use crate::backend::cuda::softmax as gpu;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::tensor::{DType, Shape, Tensor};

fn last(op: &'static str, x: &Tensor) -> Result<usize> {
    match x.dims().last() {
        Some(&n) if n > 0 => Ok(n),
        _ => Err(Error::ShapeMismatch { op, expected: "a non-empty last dim".into(), got: format!("shape {}", x.shape()) }),
    }
}

fn forward(x: &Tensor, n: usize, log: bool) -> Result<Tensor> {
    let y = match &*x.storage() {
        Storage::Cpu(c) => Storage::Cpu(if log { cpu::log_softmax(c, n)? } else { cpu::softmax(c, n)? }),
        Storage::Cuda(g) => Storage::Cuda(if log { gpu::log_softmax(g, n)? } else { gpu::softmax(g, n)? }),
    };
    Ok(Tensor::from_storage(y, x.shape().clone()))
}

fn backward(y: &Tensor, g: &Tensor, n: usize, log: bool) -> Result<Tensor> {
    super::same_kind(if log { "log_softmax_backward" } else { "softmax_backward" }, y, g)?;
    let gx = match (&*y.storage(), &*g.storage()) {
        (Storage::Cpu(y), Storage::Cpu(g)) => Storage::Cpu(if log { cpu::log_softmax_backward(y, g, n)? } else { cpu::softmax_backward(y, g, n)? }),
        (Storage::Cuda(y), Storage::Cuda(g)) => Storage::Cuda(if log { gpu::log_softmax_backward(y, g, n)? } else { gpu::softmax_backward(y, g, n)? }),
        _ => return Err(Error::DeviceMismatch { op: "softmax_backward", lhs: y.device(), rhs: g.device() }),
    };
    Ok(Tensor::from_storage(gx, y.shape().clone()))
}

/// Softmax over the last dim.
pub fn softmax(x: &Tensor) -> Result<Tensor> {
    let n = last("softmax", x)?;
    let y = forward(x, n, false)?;
    let ys = y.detach();
    Ok(record("softmax", &[x], y, vec![ys.clone()], move |g, _| Ok(vec![Some(backward(&ys, g, n, false)?)])))
}

/// Log-softmax over the last dim.
pub fn log_softmax(x: &Tensor) -> Result<Tensor> {
    let n = last("log_softmax", x)?;
    let y = forward(x, n, true)?;
    let ys = y.detach();
    Ok(record("log_softmax", &[x], y, vec![ys.clone()], move |g, _| Ok(vec![Some(backward(&ys, g, n, true)?)])))
}

/// The layout of `mask` (u8, broadcastable to `target`) over target's rows.
fn mask_rows(op: &'static str, mask: &Tensor, target: &Shape) -> Result<MaskRows> {
    if mask.dtype() != DType::U8 {
        return Err(Error::DTypeMismatch { op, expected: DType::U8, got: mask.dtype() });
    }
    if &Shape::broadcast(op, target, mask.shape())? != target {
        return Err(Error::Broadcast { op, lhs: target.clone(), rhs: mask.shape().clone() });
    }
    let mut strides = mask.shape().broadcast_strides(target);
    let step = strides.pop().unwrap_or(0);
    Ok(MaskRows { dims: target.dims()[..target.rank() - 1].to_vec(), strides, step })
}

/// Softmax over the last dim of the scores whose `mask` byte (u8,
/// broadcastable to x, as attention's (B, 1, T1 or 1, T2) over
/// (B, H, T1, T2)) is 0: masked elements are exactly 0 and a row with every
/// element masked is all zeros, never NaN. One kernel forward and one
/// backward (softmax's: masked outputs are 0, so their gradient is 0), in
/// x's dtype (half read and written in half, accumulated in f32). The mask
/// is copied to x's GPU if it is on the host.
pub fn masked_softmax(x: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let op = "masked_softmax";
    let n = last(op, x)?;
    let rows = mask_rows(op, mask, x.shape())?;
    let y = match &*x.storage() {
        Storage::Cpu(c) => Storage::Cpu(cpu::masked_softmax(c, n, &mask.to_vec::<u8>()?, &rows)?),
        Storage::Cuda(g) => Storage::Cuda(gpu::masked_softmax(g, &*to_gpu(op, &mask.storage(), g)?, &rows, n)?),
    };
    let y = Tensor::from_storage(y, x.shape().clone());
    let ys = y.detach();
    Ok(record(op, &[x], y, vec![ys.clone()], move |g, _| Ok(vec![Some(backward(&ys, g, n, false)?)])))
}
