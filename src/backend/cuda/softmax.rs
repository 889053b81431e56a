//! Softmax, log-softmax and masked softmax over rows of length `n` on the
//! GPU, forward and backward (`cuda/softmax.cu`); mirrors
//! `backend::cpu::softmax`. f16 and bf16 rows are read and written in half
//! and accumulated in f32. Rows of up to `WARP_ROW_MAX` elements get a warp
//! each (several rows per block), longer rows a block each.

use super::nn_common::{expect_dtype, expect_len, launch, rows, same, strided_words, u32_arg, FLOATS, NN_BLOCK};
use super::{Arg, CudaStorage, LaunchConfig};
use crate::backend::cpu::softmax::MaskRows;
use crate::error::{Error, Result};
use crate::tensor::DType;

/// The longest row given a warp (`NN_WARP_ROW_MAX` in `nn_common.cuh`).
pub(crate) const WARP_ROW_MAX: usize = 1024;

/// Rows per block of the warp-per-row kernels.
const WARPS: usize = NN_BLOCK as usize / 32;

/// The kernel shape for `rows` rows of length `n`: `{op}_warp` with a warp
/// per row for rows up to `WARP_ROW_MAX` (NN_BLOCK / 32 rows per block),
/// else `{op}` with a block per row; both grid-stride over the rows.
pub(crate) fn row_launch(op: &str, n: usize, r: usize) -> (String, LaunchConfig) {
    if n <= WARP_ROW_MAX {
        (format!("{op}_warp"), rows(r.div_ceil(WARPS)))
    } else {
        (op.to_string(), rows(r))
    }
}

fn forward(op: &'static str, x: &CudaStorage, n: usize) -> Result<CudaStorage> {
    expect_dtype(op, x, FLOATS)?;
    let nn = u32_arg(op, "row length", n)?;
    let r = if n == 0 { 0 } else { x.len() / n };
    let dev = x.device();
    let y = dev.alloc(x.dtype(), x.len())?;
    let (name, cfg) = row_launch(op, n, r);
    launch(dev, "softmax", &name, x.dtype(), x.len(), cfg, &[Arg::Ptr(x), Arg::Ptr(&y), Arg::U64(r as u64), Arg::U32(nn)])?;
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
    let (name, cfg) = row_launch(op, n, r);
    launch(dev, "softmax", &name, y.dtype(), y.len(), cfg, &[Arg::Ptr(y), Arg::Ptr(g), Arg::Ptr(&gx), Arg::U64(r as u64), Arg::U32(nn)])?;
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

/// Softmax's backward from its output `y` and output gradient `g` (also
/// masked softmax's: its masked outputs are 0, so their gradient is 0).
pub fn softmax_backward(y: &CudaStorage, g: &CudaStorage, n: usize) -> Result<CudaStorage> {
    backward("softmax_bwd", y, g, n)
}

/// Log-softmax's backward from its output `y` and output gradient `g`.
pub fn log_softmax_backward(y: &CudaStorage, g: &CudaStorage, n: usize) -> Result<CudaStorage> {
    backward("log_softmax_bwd", y, g, n)
}

/// Softmax over rows of length `n` of the elements whose byte of `mask`
/// (u8, on x's GPU, laid out over the rows as `rows` says) is 0; masked
/// elements and fully masked rows give 0.
pub fn masked_softmax(x: &CudaStorage, mask: &CudaStorage, rows: &MaskRows, n: usize) -> Result<CudaStorage> {
    let op = "masked_softmax";
    expect_dtype(op, x, FLOATS)?;
    if mask.dtype() != DType::U8 {
        return Err(Error::DTypeMismatch { op, expected: DType::U8, got: mask.dtype() });
    }
    if mask.ordinal() != x.ordinal() {
        return Err(Error::invalid(op, format!("expected the mask on cuda:{}, got cuda:{}", x.ordinal(), mask.ordinal())));
    }
    let nn = u32_arg(op, "row length", n)?;
    let r = if n == 0 { 0 } else { x.len() / n };
    rows.check(op, r, n, mask.len())?;
    let words = strided_words(op, &rows.dims, &rows.strides)?;
    let dev = x.device();
    let y = dev.alloc(x.dtype(), x.len())?;
    let (name, cfg) = row_launch("masked_softmax_fwd", n, r);
    let args = [Arg::Ptr(x), Arg::Ptr(mask), Arg::Words(&words), Arg::U64(rows.step as u64), Arg::Ptr(&y), Arg::U64(r as u64), Arg::U32(nn)];
    launch(dev, "softmax", &name, x.dtype(), x.len(), cfg, &args)?;
    Ok(y)
}
