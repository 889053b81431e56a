//! Softmax and log-softmax over rows of length `n` on the GPU, forward and
//! backward (`cuda/softmax.cu`); mirrors `backend::cpu::softmax`. f16 and
//! bf16 rows are read and written in half and accumulated in f32.

use super::nn_common::{expect_dtype, expect_len, launch, rows, same, u32_arg, FLOATS};
use super::{Arg, CudaStorage};
use crate::error::Result;

fn forward(op: &'static str, x: &CudaStorage, n: usize) -> Result<CudaStorage> {
    expect_dtype(op, x, FLOATS)?;
    let nn = u32_arg(op, "row length", n)?;
    let r = if n == 0 { 0 } else { x.len() / n };
    let dev = x.device();
    let y = dev.alloc(x.dtype(), x.len())?;
    launch(dev, "softmax", op, x.dtype(), x.len(), rows(r), &[Arg::Ptr(x), Arg::Ptr(&y), Arg::U64(r as u64), Arg::U32(nn)])?;
    Ok(y)
}

fn backward(op: &'static str, y: &CudaStorage, g: &CudaStorage, n: usize) -> Result<CudaStorage> {
    expect_dtype(op, y, FLOATS)?;
    same(op, y, g)?;
    expect_len(op, "the output gradient", g, y.len())?;
    let nn = u32_arg(op, "row length", n)?;
    let r = if n == 0 { 0 } else { y.len() / n };
    let dev = y.device();
    let gx = dev.alloc(y.dtype(), y.len())?;
    launch(dev, "softmax", op, y.dtype(), y.len(), rows(r), &[Arg::Ptr(y), Arg::Ptr(g), Arg::Ptr(&gx), Arg::U64(r as u64), Arg::U32(nn)])?;
    Ok(gx)
}

/// Softmax over rows of length `n`.
pub fn softmax(x: &CudaStorage, n: usize) -> Result<CudaStorage> {
    forward("softmax_fwd", x, n)
}

/// Log-softmax over rows of length `n`.
pub fn log_softmax(x: &CudaStorage, n: usize) -> Result<CudaStorage> {
    forward("log_softmax_fwd", x, n)
}

/// Softmax's backward from its output `y` and output gradient `g`.
pub fn softmax_backward(y: &CudaStorage, g: &CudaStorage, n: usize) -> Result<CudaStorage> {
    backward("softmax_bwd", y, g, n)
}

/// Log-softmax's backward from its output `y` and output gradient `g`.
pub fn log_softmax_backward(y: &CudaStorage, g: &CudaStorage, n: usize) -> Result<CudaStorage> {
    backward("log_softmax_bwd", y, g, n)
}
