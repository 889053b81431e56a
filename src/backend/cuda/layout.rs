//! Copy kernels for the layouts the model needs on the GPU (`cuda/layout.cu`):
//! permute, narrow, pad, cat, for every dtype; mirrors `backend::cpu::layout`.
//! Launches whose indices all fit below 2^31 take the `_u32` kernels (u32
//! indices, divisions by dims through host-computed multipliers, see
//! `fastdiv.rs`); larger ones the 64-bit kernels.

use super::fastdiv::{coalesce, fast_div_words, strided32_words, IndexWidth};
use super::kernels::layout as k;
use super::nn_common::{elems, expect_len, same, strided_words, value_bits};
use super::CudaStorage;
use crate::error::{Error, Result};

/// A size argument of a `_u32` kernel (the caller checked `fits_u32`).
fn u32a(v: usize) -> u32 {
    v as u32
}

/// The copy of `x` (of shape `dims`) with its dims reordered: output dim `i`
/// is input dim `perm[i]`.
pub fn permute(x: &CudaStorage, dims: &[usize], perm: &[usize]) -> Result<CudaStorage> {
    permute_with(x, dims, perm, IndexWidth::Auto)
}

/// [`permute`] with the index width chosen by the caller.
pub fn permute_with(x: &CudaStorage, dims: &[usize], perm: &[usize], width: IndexWidth) -> Result<CudaStorage> {
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
    if x.is_empty() {
        return Ok(y);
    }
    if width.use_u32(&[x.len()]) {
        let shape = strided32_words(op, &odims, &[&pstrides])?;
        k::permute_u32(dev, x.dtype(), elems(x.len()), x, &shape, &y, u32a(x.len()))?;
    } else {
        let (odims, ps) = coalesce(&odims, &[&pstrides]);
        let shape = strided_words(op, &odims, &ps[0])?;
        k::permute(dev, x.dtype(), elems(x.len()), x, &shape, &y, x.len() as u64)?;
    }
    Ok(y)
}

/// Rows `start..start+len` of the middle dim of `(outer, n, inner)`.
pub fn narrow(x: &CudaStorage, outer: usize, n: usize, inner: usize, start: usize, len: usize) -> Result<CudaStorage> {
    narrow_with(x, outer, n, inner, start, len, IndexWidth::Auto)
}

/// [`narrow`] with the index width chosen by the caller.
pub fn narrow_with(x: &CudaStorage, outer: usize, n: usize, inner: usize, start: usize, len: usize, width: IndexWidth) -> Result<CudaStorage> {
    let op = "narrow";
    if start + len > n {
        return Err(Error::invalid(op, format!("range {start}..{} is outside a dim of size {n}", start + len)));
    }
    expect_len(op, "the input (outer, n, inner)", x, outer * n * inner)?;
    let m = outer * len * inner;
    let dev = x.device();
    let y = dev.alloc(x.dtype(), m)?;
    if m == 0 {
        return Ok(y);
    }
    if width.use_u32(&[x.len(), m]) {
        let (fi, fl) = (fast_div_words(op, inner)?, fast_div_words(op, len)?);
        k::narrow_u32(dev, x.dtype(), elems(m), x, &y, &fi, &fl, u32a(n), u32a(start), u32a(m))?;
    } else {
        k::narrow(dev, x.dtype(), elems(m), x, &y, outer as u64, n as u64, inner as u64, start as u64, len as u64)?;
    }
    Ok(y)
}

/// Pads the middle dim of `(outer, n, inner)` with `left` and `right` rows of `value`.
pub fn pad(x: &CudaStorage, outer: usize, n: usize, inner: usize, left: usize, right: usize, value: f64) -> Result<CudaStorage> {
    pad_with(x, outer, n, inner, left, right, value, IndexWidth::Auto)
}

/// [`pad`] with the index width chosen by the caller.
#[allow(clippy::too_many_arguments)]
pub fn pad_with(x: &CudaStorage, outer: usize, n: usize, inner: usize, left: usize, right: usize, value: f64, width: IndexWidth) -> Result<CudaStorage> {
    let op = "pad";
    expect_len(op, "the input (outer, n, inner)", x, outer * n * inner)?;
    let m = outer * (left + n + right) * inner;
    let dev = x.device();
    let y = dev.alloc(x.dtype(), m)?;
    if m == 0 {
        return Ok(y);
    }
    if width.use_u32(&[x.len(), m]) {
        let (fi, fm) = (fast_div_words(op, inner)?, fast_div_words(op, left + n + right)?);
        k::pad_u32(dev, x.dtype(), elems(m), x, &y, &fi, &fm, u32a(n), u32a(left), value_bits(x.dtype(), value), u32a(m))?;
        return Ok(y);
    }
    k::pad(dev, x.dtype(), elems(m), x, &y, outer as u64, n as u64, inner as u64, left as u64, right as u64, value_bits(x.dtype(), value))?;
    Ok(y)
}

/// Concatenates tensors of layouts `(outer, n_i, inner)` along the middle dim.
pub fn cat(xs: &[&CudaStorage], outer: usize, ns: &[usize], inner: usize) -> Result<CudaStorage> {
    cat_with(xs, outer, ns, inner, IndexWidth::Auto)
}

/// [`cat`] with the index width chosen by the caller.
pub fn cat_with(xs: &[&CudaStorage], outer: usize, ns: &[usize], inner: usize, width: IndexWidth) -> Result<CudaStorage> {
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
    let small = width.use_u32(&[y.len()]);
    for (x, &n) in xs.iter().zip(ns) {
        if small && !x.is_empty() {
            let (fi, fnn) = (fast_div_words(op, inner)?, fast_div_words(op, n)?);
            k::cat_part_u32(dev, first.dtype(), elems(x.len()), x, &y, &fi, &fnn, u32a(total), u32a(start), u32a(x.len()))?;
        } else if !x.is_empty() {
            k::cat_part(dev, first.dtype(), elems(x.len()), x, &y, outer as u64, n as u64, inner as u64, total as u64, start as u64)?;
        }
        start += n;
    }
    Ok(y)
}
