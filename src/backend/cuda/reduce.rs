//! Reductions over one dim on the GPU (`cuda/reduce.cu`), the twin of
//! `cpu/reduce.rs`: layout `(outer, n, inner)`, output `(outer, inner)`.
//! Every result is summed in a fixed order, so it is the same run to run.

use super::{dtype_suffix, Arg, CudaStorage, LaunchConfig};
use crate::error::{Error, Result};
use crate::tensor::DType;

const THREADS: u32 = 256;

fn float_only(op: &'static str, x: &CudaStorage) -> Result<()> {
    if x.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::UnsupportedDType { op, dtype: x.dtype(), supported: "f32, f64, f16, bf16" })
    }
}

fn check_len(op: &'static str, x: &CudaStorage, want: usize) -> Result<()> {
    if x.len() != want {
        return Err(Error::invalid(op, format!("expected {want} elements, got {}", x.len())));
    }
    Ok(())
}

fn i(v: usize) -> Arg<'static> {
    Arg::I64(v as i64)
}

/// Sum over the middle dim of `(outer, n, inner)`, in the input's dtype.
pub fn sum_dim(x: &CudaStorage, outer: usize, n: usize, inner: usize) -> Result<CudaStorage> {
    sum_into(x, outer, n, inner, x.dtype(), "")
}

/// Sum over the middle dim of `(outer, n, inner)` in the accumulation type:
/// f16/bf16 inputs give unrounded f32 sums (for reductions over several
/// dims, rounded to half once at the end), f32/f64 their own dtype.
pub fn sum_dim_acc(x: &CudaStorage, outer: usize, n: usize, inner: usize) -> Result<CudaStorage> {
    match x.dtype() {
        DType::F16 | DType::BF16 => sum_into(x, outer, n, inner, DType::F32, "_to_f32"),
        dt => sum_into(x, outer, n, inner, dt, ""),
    }
}

fn sum_into(x: &CudaStorage, outer: usize, n: usize, inner: usize, out: DType, suffix: &str) -> Result<CudaStorage> {
    float_only("sum", x)?;
    check_len("sum", x, outer * n * inner)?;
    let dev = x.device();
    let y = dev.alloc(out, outer * inner)?;
    if outer * inner == 0 {
        return Ok(y);
    }
    let dt = dtype_suffix(x.dtype());
    if inner == 1 {
        dev.launch("reduce", &format!("sum_rows_{dt}{suffix}"), LaunchConfig::rows(outer, THREADS), &[Arg::Ptr(x), Arg::Ptr(&y), i(outer), i(n)])?;
    } else {
        let args = [Arg::Ptr(x), Arg::Ptr(&y), i(outer), i(n), i(inner)];
        dev.launch("reduce", &format!("sum_cols_{dt}{suffix}"), LaunchConfig::for_elems(outer * inner), &args)?;
    }
    Ok(y)
}

/// Max over the middle dim: values and the (i64) index of the first maximum.
pub fn max_dim(x: &CudaStorage, outer: usize, n: usize, inner: usize) -> Result<(CudaStorage, CudaStorage)> {
    float_only("max", x)?;
    check_len("max", x, outer * n * inner)?;
    if n == 0 {
        return Err(Error::invalid("max", "max over an empty dim"));
    }
    let dev = x.device();
    let val = dev.alloc(x.dtype(), outer * inner)?;
    let arg = dev.alloc(DType::I64, outer * inner)?;
    if outer * inner > 0 {
        let args = [Arg::Ptr(x), Arg::Ptr(&val), Arg::Ptr(&arg), i(outer), i(n), i(inner)];
        dev.launch("reduce", &format!("max_dim_{}", dtype_suffix(x.dtype())), LaunchConfig::for_elems(outer * inner), &args)?;
    }
    Ok((val, arg))
}

/// The gradient of `max_dim`: `g` scattered to the arg-max positions.
pub fn max_dim_backward(g: &CudaStorage, arg: &CudaStorage, outer: usize, n: usize, inner: usize) -> Result<CudaStorage> {
    float_only("max_backward", g)?;
    check_len("max_backward", g, outer * inner)?;
    check_len("max_backward", arg, outer * inner)?;
    let dev = g.device();
    let out = dev.zeros(g.dtype(), outer * n * inner)?;
    if outer * inner > 0 {
        let args = [Arg::Ptr(g), Arg::Ptr(arg), Arg::Ptr(&out), i(outer), i(n), i(inner)];
        dev.launch("reduce", &format!("max_bwd_{}", dtype_suffix(g.dtype())), LaunchConfig::for_elems(outer * inner), &args)?;
    }
    Ok(out)
}

/// Repeats `(outer, inner)` along a new middle dim of size `n`.
pub fn expand_dim(x: &CudaStorage, outer: usize, n: usize, inner: usize) -> Result<CudaStorage> {
    float_only("expand", x)?;
    check_len("expand", x, outer * inner)?;
    let dev = x.device();
    let y = dev.alloc(x.dtype(), outer * n * inner)?;
    if !y.is_empty() {
        let args = [Arg::Ptr(x), Arg::Ptr(&y), i(outer), i(n), i(inner)];
        dev.launch("reduce", &format!("expand_dim_{}", dtype_suffix(x.dtype())), LaunchConfig::for_elems(outer * n * inner), &args)?;
    }
    Ok(y)
}
