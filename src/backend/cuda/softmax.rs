//! Softmax, log-softmax and masked softmax over rows of length `n` on the
//! GPU, forward and backward (`cuda/softmax.cu`); mirrors
//! `backend::cpu::softmax`. f16 and bf16 rows are read and written in half
//! and accumulated in f32. Rows of up to `WARP_ROW_MAX` elements get a warp
//! each (several rows per block), longer rows a block each.

use super::kernels::softmax as k;
use super::nn_common::{expect_dtype, expect_len, rows, same, strided_words, u32_arg, FLOATS, NN_BLOCK};
use super::{CudaDevice, CudaStorage, LaunchConfig};
use crate::backend::cpu::softmax::MaskRows;
use crate::error::{Error, Result};
use crate::tensor::DType;

/// The longest row given a warp (`NN_WARP_ROW_MAX` in `nn_common.cuh`).
pub(crate) const WARP_ROW_MAX: usize = 1024;

/// Rows per block of the warp-per-row kernels.
const WARPS: usize = NN_BLOCK as usize / 32;

/// The kernel shape for `rows` rows of length `n`: (true, ..) for the
/// `{op}_warp` kernel with a warp per row for rows up to `WARP_ROW_MAX`
/// (NN_BLOCK / 32 rows per block), else (false, ..) for `{op}` with a block
/// per row; both grid-stride over the rows.
pub(crate) fn row_launch(n: usize, r: usize) -> (bool, LaunchConfig) {
    if n <= WARP_ROW_MAX {
        (true, rows(r.div_ceil(WARPS)))
    } else {
        (false, rows(r))
    }
}

/// A row kernel's launch function: (rows, n) → y.
type RowFn = fn(&CudaDevice, DType, LaunchConfig, &CudaStorage, &CudaStorage, u64, u32) -> Result<()>;
/// A row backward's launch function: (y, g) → gx.
type RowBwdFn = fn(&CudaDevice, DType, LaunchConfig, &CudaStorage, &CudaStorage, &CudaStorage, u64, u32) -> Result<()>;

fn forward(op: &'static str, kernels: (RowFn, RowFn), x: &CudaStorage, n: usize) -> Result<CudaStorage> {
    expect_dtype(op, x, FLOATS)?;
    let nn = u32_arg(op, "row length", n)?;
    let r = if n == 0 { 0 } else { x.len() / n };
    let dev = x.device();
    let y = dev.alloc(x.dtype(), x.len())?;
    let (warp, cfg) = row_launch(n, r);
    if !x.is_empty() {
        (if warp { kernels.1 } else { kernels.0 })(dev, x.dtype(), cfg, x, &y, r as u64, nn)?;
    }
    Ok(y)
}

fn backward(op: &'static str, kernels: (RowBwdFn, RowBwdFn), y: &CudaStorage, g: &CudaStorage, n: usize) -> Result<CudaStorage> {
    expect_dtype(op, y, FLOATS)?;
    same(op, y, g)?;
    expect_len(op, "the output gradient", g, y.len())?;
    let nn = u32_arg(op, "row length", n)?;
    let r = if n == 0 { 0 } else { y.len() / n };
    let dev = y.device();
    let gx = dev.alloc(y.dtype(), y.len())?;
    let (warp, cfg) = row_launch(n, r);
    if !y.is_empty() {
        (if warp { kernels.1 } else { kernels.0 })(dev, y.dtype(), cfg, y, g, &gx, r as u64, nn)?;
    }
    Ok(gx)
}

/// Softmax over rows of length `n`.
pub fn softmax(x: &CudaStorage, n: usize) -> Result<CudaStorage> {
    forward("softmax_fwd", (k::softmax_fwd, k::softmax_fwd_warp), x, n)
}

/// Log-softmax over rows of length `n`.
pub fn log_softmax(x: &CudaStorage, n: usize) -> Result<CudaStorage> {
    forward("log_softmax_fwd", (k::log_softmax_fwd, k::log_softmax_fwd_warp), x, n)
}

/// Softmax's backward from its output `y` and output gradient `g` (also
/// masked softmax's: its masked outputs are 0, so their gradient is 0).
pub fn softmax_backward(y: &CudaStorage, g: &CudaStorage, n: usize) -> Result<CudaStorage> {
    backward("softmax_bwd", (k::softmax_bwd, k::softmax_bwd_warp), y, g, n)
}

/// Log-softmax's backward from its output `y` and output gradient `g`.
pub fn log_softmax_backward(y: &CudaStorage, g: &CudaStorage, n: usize) -> Result<CudaStorage> {
    backward("log_softmax_bwd", (k::log_softmax_bwd, k::log_softmax_bwd_warp), y, g, n)
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
    let (warp, cfg) = row_launch(n, r);
    let f = if warp { k::masked_softmax_fwd_warp } else { k::masked_softmax_fwd };
    if !x.is_empty() {
        f(dev, x.dtype(), cfg, x, mask, &words, rows.step as u64, &y, r as u64, nn)?;
    }
    Ok(y)
}
