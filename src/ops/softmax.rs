//! softmax and log_softmax over the last dim, with their backward kernels,
//! on the CPU or the GPU (the tensor's storage decides).

use crate::autograd::record;
use crate::backend::cpu::softmax as cpu;
use crate::backend::cuda::softmax as gpu;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

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
