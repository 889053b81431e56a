//! Elementwise ops on the GPU (`cuda/elementwise.cu`), the twin of
//! `cpu/elementwise.rs`: unary maps and their backward, affine, pow, and
//! binary ops with broadcasting. Float dtypes: f32, f64, f16, bf16.

use super::{dtype_suffix, launch::scalar_arg, Arg, CudaStorage, LaunchConfig};
use crate::backend::cpu::elementwise::{Bcast, Binary, Unary};
use crate::error::{Error, Result};

use super::nn_common::MAX_DIMS;

/// The error for a dtype an elementwise kernel does not take.
fn float_only(op: &'static str, x: &CudaStorage) -> Result<()> {
    if x.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::UnsupportedDType { op, dtype: x.dtype(), supported: "f32, f64, f16, bf16" })
    }
}

fn same(op: &'static str, a: &CudaStorage, b: &CudaStorage) -> Result<()> {
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch { op, expected: a.dtype(), got: b.dtype() });
    }
    if a.len() != b.len() {
        return Err(Error::invalid(op, format!("operands of {} and {} elements", a.len(), b.len())));
    }
    Ok(())
}

/// `y = f(x)`.
pub fn unary(op: Unary, x: &CudaStorage) -> Result<CudaStorage> {
    float_only(op.name(), x)?;
    let dev = x.device();
    let y = dev.alloc(x.dtype(), x.len())?;
    let k = format!("{}_fwd_{}", op.name(), dtype_suffix(x.dtype()));
    dev.launch("elementwise", &k, LaunchConfig::for_elems(x.len()), &[Arg::Ptr(x), Arg::Ptr(&y), Arg::I64(x.len() as i64)])?;
    Ok(y)
}

/// `gx = gy · f'(x)` from the forward's input and output.
pub fn unary_backward(op: Unary, x: &CudaStorage, y: &CudaStorage, gy: &CudaStorage) -> Result<CudaStorage> {
    float_only(op.name(), x)?;
    same(op.name(), x, y)?;
    same(op.name(), x, gy)?;
    let dev = x.device();
    let gx = dev.alloc(x.dtype(), x.len())?;
    let k = format!("{}_bwd_{}", op.name(), dtype_suffix(x.dtype()));
    let args = [Arg::Ptr(x), Arg::Ptr(y), Arg::Ptr(gy), Arg::Ptr(&gx), Arg::I64(x.len() as i64)];
    dev.launch("elementwise", &k, LaunchConfig::for_elems(x.len()), &args)?;
    Ok(gx)
}

/// `y = x·mul + add`.
pub fn affine(x: &CudaStorage, mul: f64, add: f64) -> Result<CudaStorage> {
    float_only("affine", x)?;
    let dev = x.device();
    let y = dev.alloc(x.dtype(), x.len())?;
    let k = format!("affine_{}", dtype_suffix(x.dtype()));
    let args = [Arg::Ptr(x), Arg::Ptr(&y), scalar_arg(x.dtype(), mul), scalar_arg(x.dtype(), add), Arg::I64(x.len() as i64)];
    dev.launch("elementwise", &k, LaunchConfig::for_elems(x.len()), &args)?;
    Ok(y)
}

/// `y = x^p`.
pub fn powf(x: &CudaStorage, p: f64) -> Result<CudaStorage> {
    float_only("pow", x)?;
    let dev = x.device();
    let y = dev.alloc(x.dtype(), x.len())?;
    let k = format!("pow_{}", dtype_suffix(x.dtype()));
    dev.launch("elementwise", &k, LaunchConfig::for_elems(x.len()), &[Arg::Ptr(x), Arg::Ptr(&y), scalar_arg(x.dtype(), p), Arg::I64(x.len() as i64)])?;
    Ok(y)
}

/// The `Bcast` struct of `cuda/common.cuh` as 64-bit words:
/// rank, out[8], sa[8], sb[8].
fn bcast_words(op: &'static str, bc: &Bcast) -> Result<Vec<u64>> {
    let r = bc.out_dims.len();
    if r > MAX_DIMS {
        return Err(Error::invalid(op, format!("broadcast over {r} dims; the CUDA kernel takes at most {MAX_DIMS}")));
    }
    let mut w = vec![0u64; 1 + 3 * MAX_DIMS];
    w[0] = r as u64;
    for d in 0..r {
        w[1 + d] = bc.out_dims[d] as u64;
        w[1 + MAX_DIMS + d] = bc.sa[d] as u64;
        w[1 + 2 * MAX_DIMS + d] = bc.sb[d] as u64;
    }
    Ok(w)
}

/// `op(a, b)` broadcast to `bc.out_dims` (strides as the CPU's).
pub(crate) fn binary(op: Binary, a: &CudaStorage, b: &CudaStorage, bc: &Bcast) -> Result<CudaStorage> {
    float_only(op.name(), a)?;
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch { op: op.name(), expected: a.dtype(), got: b.dtype() });
    }
    let n: usize = bc.out_dims.iter().product();
    let dev = a.device();
    let y = dev.alloc(a.dtype(), n)?;
    let dt = dtype_suffix(a.dtype());
    let aligned = [a.ptr(), b.ptr(), y.ptr()].iter().all(|p| p % 16 == 0);
    if a.len() == n && b.len() == n && aligned {
        let k = format!("{}_{dt}", op.name());
        dev.launch("elementwise", &k, LaunchConfig::for_elems(n), &[Arg::Ptr(a), Arg::Ptr(b), Arg::Ptr(&y), Arg::I64(n as i64)])?;
    } else {
        let words = bcast_words(op.name(), bc)?;
        let k = format!("{}_bcast_{dt}", op.name());
        let args = [Arg::Ptr(a), Arg::Ptr(b), Arg::Ptr(&y), Arg::Words(&words), Arg::I64(n as i64)];
        dev.launch("elementwise", &k, LaunchConfig::for_elems(n), &args)?;
    }
    Ok(y)
}
