//! Autocast: mixed precision as a thread-local mode (like `no_grad`), as
//! `torch.autocast`. While it is set to f16 or bf16, matrix products and
//! convolutions of f32 operands run in that half type and give f32 results;
//! everything else (softmax, norms, losses, reductions) stays f32 because
//! those ops never consult the mode. The casts are ordinary `to_dtype` ops on
//! the tape, so gradients flow back to the f32 master weights in f32 after
//! passing through the same half rounding as the forward.
//!
//! Matrix products: on a GPU the half operands go to the half GEMM (f32
//! accumulation) and its result is cast to f32. The CPU has no half GEMM, so
//! it emulates one: operands rounded through the half type, then an f32
//! product — the same inputs a half GEMM with f32 accumulation sees.
//! Convolutions use that emulation on every device (rounded inputs, f32
//! kernel), so their numerics are the half type's wherever they run.

use super::to_dtype;
use crate::error::{Error, Result};
use crate::tensor::{DType, Device, Tensor};
use std::cell::Cell;

thread_local! {
    static AUTOCAST: Cell<Option<DType>> = const { Cell::new(None) };
}

/// The half type matrix products and convolutions run in, if autocast is on.
pub fn autocast_dtype() -> Option<DType> {
    AUTOCAST.with(|a| a.get())
}

/// Restores the previous autocast mode when dropped.
pub struct AutocastGuard(Option<DType>);

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        AUTOCAST.with(|a| a.set(self.0));
    }
}

/// Sets the autocast mode (`None`, f16 or bf16) until the guard drops.
pub fn set_autocast(dtype: Option<DType>) -> Result<AutocastGuard> {
    if let Some(d) = dtype {
        if d != DType::F16 && d != DType::BF16 {
            return Err(Error::invalid("autocast", format!("expected f16 or bf16, got {d:?}")));
        }
    }
    Ok(AutocastGuard(AUTOCAST.with(|a| a.replace(dtype))))
}

/// Runs `f` with autocast set to `dtype` (`None`: full precision).
pub fn autocast<R>(dtype: Option<DType>, f: impl FnOnce() -> Result<R>) -> Result<R> {
    let _g = set_autocast(dtype)?;
    f()
}

/// `x` rounded through `half` and back to f32 (recorded: both casts are on the tape).
fn round_through(x: &Tensor, half: DType) -> Result<Tensor> {
    to_dtype(&to_dtype(x, half)?, DType::F32)
}

/// The half type when autocast applies to these f32 operands.
fn applies(a: &Tensor, b: &Tensor) -> Option<DType> {
    autocast_dtype().filter(|_| a.dtype() == DType::F32 && b.dtype() == DType::F32)
}

/// `op(a)·op(b)` under autocast, or `None` when autocast does not apply
/// (off, or operands not f32). Called first by `matmul_t`.
pub(crate) fn matmul(a: &Tensor, b: &Tensor, trans_a: bool, trans_b: bool) -> Result<Option<Tensor>> {
    let Some(half) = applies(a, b) else { return Ok(None) };
    // The inner product must not autocast again.
    let _off = set_autocast(None)?;
    let y = if a.device() == Device::Cpu {
        super::matmul_t(&round_through(a, half)?, &round_through(b, half)?, trans_a, trans_b)?
    } else {
        super::matmul_t(&to_dtype(a, half)?, &to_dtype(b, half)?, trans_a, trans_b)?
    };
    to_dtype(&y, DType::F32).map(Some)
}

/// A convolution `f(x, w)` under autocast (inputs rounded through the half
/// type), or `None` when autocast does not apply. Called first by the conv ops.
pub(crate) fn conv(x: &Tensor, w: &Tensor, f: impl FnOnce(&Tensor, &Tensor) -> Result<Tensor>) -> Result<Option<Tensor>> {
    let Some(half) = applies(x, w) else { return Ok(None) };
    let _off = set_autocast(None)?;
    f(&round_through(x, half)?, &round_through(w, half)?).map(Some)
}
