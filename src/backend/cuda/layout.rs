//! Copy kernels for the layouts the model needs on the GPU (`cuda/layout.cu`):
//! permute, narrow, pad, cat, for every dtype; mirrors `backend::cpu::layout`.

use super::nn_common::{elems, expect_len, launch, same, strided_words, value_bits};
use super::{Arg, CudaStorage};
use crate::error::{Error, Result};

/// The copy of `x` (of shape `dims`) with its dims reordered: output dim `i`
/// is input dim `perm[i]`.
pub fn permute(x: &CudaStorage, dims: &[usize], perm: &[usize]) -> Result<CudaStorage> {
    let op = "permute";
    expect_len(op, "the input", x, dims.iter().product())?;
    let rank = dims.len();
    if perm.len() != rank || perm.iter().any(|&p| p >= rank) {
        return Err(Error::invalid(op, format!("{perm:?} is not a permutation of {rank} dims")));
    }
    let strides = crate::tensor::Shape::from(dims).strides();
    let odims: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    let pstrides: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
    let dev = x.device();
    let y = dev.alloc(x.dtype(), x.len())?;
    let shape = strided_words(op, &odims, &pstrides)?;
    let args = [Arg::Ptr(x), Arg::Words(&shape), Arg::Ptr(&y), Arg::U64(x.len() as u64)];
    launch(dev, "layout", op, x.dtype(), x.len(), elems(x.len()), &args)?;
    Ok(y)
}

/// Rows `start..start+len` of the middle dim of `(outer, n, inner)`.
pub fn narrow(x: &CudaStorage, outer: usize, n: usize, inner: usize, start: usize, len: usize) -> Result<CudaStorage> {
    let op = "narrow";
    if start + len > n {
        return Err(Error::invalid(op, format!("range {start}..{} is outside a dim of size {n}", start + len)));
    }
    expect_len(op, "the input (outer, n, inner)", x, outer * n * inner)?;
    let m = outer * len * inner;
    let dev = x.device();
    let y = dev.alloc(x.dtype(), m)?;
    let args = [Arg::Ptr(x), Arg::Ptr(&y), Arg::U64(outer as u64), Arg::U64(n as u64), Arg::U64(inner as u64), Arg::U64(start as u64), Arg::U64(len as u64)];
    launch(dev, "layout", op, x.dtype(), m, elems(m), &args)?;
    Ok(y)
}

/// Pads the middle dim of `(outer, n, inner)` with `left` and `right` rows of `value`.
pub fn pad(x: &CudaStorage, outer: usize, n: usize, inner: usize, left: usize, right: usize, value: f64) -> Result<CudaStorage> {
    let op = "pad";
    expect_len(op, "the input (outer, n, inner)", x, outer * n * inner)?;
    let m = outer * (left + n + right) * inner;
    let dev = x.device();
    let y = dev.alloc(x.dtype(), m)?;
    let args = [
        Arg::Ptr(x),
        Arg::Ptr(&y),
        Arg::U64(outer as u64),
        Arg::U64(n as u64),
        Arg::U64(inner as u64),
        Arg::U64(left as u64),
        Arg::U64(right as u64),
        Arg::U64(value_bits(x.dtype(), value)),
    ];
    launch(dev, "layout", op, x.dtype(), m, elems(m), &args)?;
    Ok(y)
}

/// Concatenates tensors of layouts `(outer, n_i, inner)` along the middle dim.
pub fn cat(xs: &[&CudaStorage], outer: usize, ns: &[usize], inner: usize) -> Result<CudaStorage> {
    let op = "cat";
    let first = xs.first().ok_or_else(|| Error::invalid(op, "expected at least one tensor, got none"))?;
    if ns.len() != xs.len() {
        return Err(Error::invalid(op, format!("expected one size per tensor ({}), got {}", xs.len(), ns.len())));
    }
    for (x, &n) in xs.iter().zip(ns) {
        same(op, first, x)?;
        expect_len(op, "each input (outer, n_i, inner)", x, outer * n * inner)?;
    }
    let total: usize = ns.iter().sum();
    let dev = first.device();
    let y = dev.alloc(first.dtype(), outer * total * inner)?;
    // Each input writes its own slab; together they cover y exactly once.
    let mut start = 0;
    for (x, &n) in xs.iter().zip(ns) {
        let args =
            [Arg::Ptr(x), Arg::Ptr(&y), Arg::U64(outer as u64), Arg::U64(n as u64), Arg::U64(inner as u64), Arg::U64(total as u64), Arg::U64(start as u64)];
        launch(dev, "layout", "cat_part", first.dtype(), x.len(), elems(x.len()), &args)?;
        start += n;
    }
    Ok(y)
}
