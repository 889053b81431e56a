//! Elementwise work on the byte buffers the TCP communicator moves: views of
//! a tensor's storage as bytes, the reduction `dst = dst ⊕ src` per dtype, and
//! the division that turns a sum into an average. f16 and bf16 are reduced
//! in f32 and rounded back once per combine.

use super::ReduceOp;
use crate::error::{Error, Result};
use crate::tensor::DType;
use bytemuck::Pod;
use half::{bf16, f16};

/// The dtypes a reduction accepts, for messages.
const REDUCIBLE: &str = "f32, f64, f16, bf16, i64";

/// A small integer naming a dtype on the wire.
pub(crate) fn dtype_code(d: DType) -> u8 {
    match d {
        DType::F32 => 1,
        DType::F64 => 2,
        DType::F16 => 3,
        DType::BF16 => 4,
        DType::I64 => 5,
        DType::U8 => 6,
    }
}

/// The name of a dtype code received from a peer.
pub(crate) fn dtype_name(code: u8) -> String {
    [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::U8]
        .into_iter()
        .find(|d| dtype_code(*d) == code)
        .map(|d| d.as_str().to_string())
        .unwrap_or_else(|| format!("unknown dtype #{code}"))
}

/// A small integer naming a reduce op on the wire (0 where none applies).
pub(crate) fn rop_code(op: Option<ReduceOp>) -> u8 {
    match op {
        None => 0,
        Some(ReduceOp::Sum) => 1,
        Some(ReduceOp::Avg) => 2,
        Some(ReduceOp::Max) => 3,
        Some(ReduceOp::Min) => 4,
    }
}

/// The name of a reduce-op code received from a peer.
pub(crate) fn rop_name(code: u8) -> &'static str {
    match code {
        0 => "none",
        1 => "sum",
        2 => "avg",
        3 => "max",
        4 => "min",
        _ => "unknown",
    }
}

/// Checks that `op` can reduce tensors of `dtype`.
pub(crate) fn check_reducible(name: &'static str, dtype: DType, op: ReduceOp) -> Result<()> {
    match dtype {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => Ok(()),
        DType::I64 if op == ReduceOp::Avg => {
            Err(Error::invalid(name, "ReduceOp::Avg on an i64 tensor would truncate; reduce with Sum and divide in a float dtype"))
        }
        DType::I64 => Ok(()),
        DType::U8 => Err(Error::UnsupportedDType { op: name, dtype, supported: REDUCIBLE }),
    }
}

/// A zeroed byte buffer of `len` bytes, aligned for every dtype (it lives in
/// `u64` words), so it can be viewed as any element type.
pub(crate) struct Aligned(Vec<u64>, usize);

impl Aligned {
    /// A zeroed buffer of `len` bytes.
    pub fn new(len: usize) -> Self {
        Aligned(vec![0u64; len.div_ceil(8)], len)
    }
    /// An aligned copy of `src` (a `Vec<u8>` copy would only be
    /// byte-aligned, and could not be viewed as wider elements).
    pub fn copy_of(src: &[u8]) -> Self {
        let mut a = Aligned::new(src.len());
        a.bytes_mut().copy_from_slice(src);
        a
    }
    /// The first `len` bytes.
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.0)[..self.1]
    }
    /// The first `len` bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.0)[..self.1]
    }
}

fn misaligned(e: bytemuck::PodCastError) -> Error {
    Error::Msg(format!("TCP communicator: internal buffer cannot be viewed as elements ({e:?})"))
}

fn zip<T: Pod>(dst: &mut [u8], src: &[u8], f: impl Fn(T, T) -> T) -> Result<()> {
    let d: &mut [T] = bytemuck::try_cast_slice_mut(dst).map_err(misaligned)?;
    let s: &[T] = bytemuck::try_cast_slice(src).map_err(misaligned)?;
    if d.len() != s.len() {
        return Err(Error::Msg(format!("TCP communicator: combining {} elements with {}", d.len(), s.len())));
    }
    for (a, b) in d.iter_mut().zip(s) {
        *a = f(*a, *b);
    }
    Ok(())
}

/// Maximum that lets NaN through (a NaN on any rank shows in the result).
fn fmax(a: f64, b: f64) -> f64 {
    if a > b {
        a
    } else if b >= a {
        b
    } else {
        a + b
    }
}

/// Minimum that lets NaN through.
fn fmin(a: f64, b: f64) -> f64 {
    if a < b {
        a
    } else if b <= a {
        b
    } else {
        a + b
    }
}

fn combine(op: ReduceOp, a: f64, b: f64) -> f64 {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => a + b,
        ReduceOp::Max => fmax(a, b),
        ReduceOp::Min => fmin(a, b),
    }
}

/// `dst[i] = dst[i] ⊕ src[i]` for every element (Avg combines as Sum; the
/// division comes once, at the end, from [`divide`]).
pub(crate) fn reduce_into(dtype: DType, op: ReduceOp, dst: &mut [u8], src: &[u8]) -> Result<()> {
    match dtype {
        DType::F32 => zip::<f32>(dst, src, |a, b| match op {
            ReduceOp::Sum | ReduceOp::Avg => a + b,
            _ => combine(op, a as f64, b as f64) as f32,
        }),
        DType::F64 => zip::<f64>(dst, src, |a, b| combine(op, a, b)),
        DType::F16 => zip::<f16>(dst, src, |a, b| f16::from_f32(combine(op, a.to_f32() as f64, b.to_f32() as f64) as f32)),
        DType::BF16 => zip::<bf16>(dst, src, |a, b| bf16::from_f32(combine(op, a.to_f32() as f64, b.to_f32() as f64) as f32)),
        DType::I64 => zip::<i64>(dst, src, |a, b| match op {
            ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
            ReduceOp::Max => a.max(b),
            ReduceOp::Min => a.min(b),
        }),
        DType::U8 => Err(Error::UnsupportedDType { op: "reduce", dtype, supported: REDUCIBLE }),
    }
}

fn map<T: Pod>(buf: &mut [u8], f: impl Fn(T) -> T) -> Result<()> {
    let v: &mut [T] = bytemuck::try_cast_slice_mut(buf).map_err(misaligned)?;
    v.iter_mut().for_each(|x| *x = f(*x));
    Ok(())
}

/// Divides every element by `n` (the world size: a sum becomes an average).
pub(crate) fn divide(dtype: DType, buf: &mut [u8], n: usize) -> Result<()> {
    match dtype {
        DType::F32 => map::<f32>(buf, |x| x / n as f32),
        DType::F64 => map::<f64>(buf, |x| x / n as f64),
        DType::F16 => map::<f16>(buf, |x| f16::from_f32(x.to_f32() / n as f32)),
        DType::BF16 => map::<bf16>(buf, |x| bf16::from_f32(x.to_f32() / n as f32)),
        DType::I64 | DType::U8 => Err(Error::UnsupportedDType { op: "average", dtype, supported: "f32, f64, f16, bf16" }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_and_min_let_nan_through() {
        assert!(fmax(f64::NAN, 1.0).is_nan() && fmax(1.0, f64::NAN).is_nan());
        assert!(fmin(f64::NAN, 1.0).is_nan() && fmin(1.0, f64::NAN).is_nan());
        assert_eq!(fmax(-3.0, 2.0), 2.0);
        assert_eq!(fmin(-3.0, 2.0), -3.0);
    }

    #[test]
    fn f16_sums_in_f32() {
        let mut a = Aligned::new(4);
        let mut b = Aligned::new(4);
        let av: &mut [f16] = bytemuck::cast_slice_mut(a.bytes_mut());
        av.copy_from_slice(&[f16::from_f32(1.5), f16::from_f32(-2.0)]);
        let bv: &mut [f16] = bytemuck::cast_slice_mut(b.bytes_mut());
        bv.copy_from_slice(&[f16::from_f32(0.25), f16::from_f32(8.0)]);
        reduce_into(DType::F16, ReduceOp::Sum, a.bytes_mut(), b.bytes()).unwrap();
        let got: &[f16] = bytemuck::cast_slice(a.bytes());
        assert_eq!([got[0].to_f32(), got[1].to_f32()], [1.75, 6.0]);
    }
}
