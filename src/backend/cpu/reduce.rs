//! Reductions over one dim. Layout `(outer, n, inner)` around the reduced
//! dim; output `(outer, inner)`. Each output is summed in index order, and a
//! long full reduction is split into fixed chunks whose partials are added in
//! order, so results are deterministic whatever the thread count.

use super::{par_chunks, CpuStorage, Float};
use crate::error::Result;
use crate::float_match;
use rayon::prelude::*;

const FULL_CHUNK: usize = 1 << 14;

fn sum_t<T: Float>(x: &[T], outer: usize, n: usize, inner: usize) -> Vec<T> {
    if outer * inner == 1 && n >= super::PAR_THRESHOLD {
        let parts: Vec<T> = x.par_chunks(FULL_CHUNK).map(|c| c.iter().fold(T::zero(), |a, &v| a + v)).collect();
        return vec![parts.into_iter().fold(T::zero(), |a, v| a + v)];
    }
    let mut out = super::pool::zeroed(outer * inner);
    if inner == 1 {
        par_chunks(&mut out, 256, |s, o| {
            for (i, o) in o.iter_mut().enumerate() {
                let r = &x[(s + i) * n..(s + i + 1) * n];
                *o = r.iter().fold(T::zero(), |a, &v| a + v);
            }
        });
    } else {
        super::par_rows(&mut out, inner, |oi, o| {
            let base = oi * n * inner;
            for k in 0..n {
                let r = &x[base + k * inner..base + (k + 1) * inner];
                for (o, &v) in o.iter_mut().zip(r) {
                    *o = *o + v;
                }
            }
        });
    }
    out
}

/// Sum over the middle dim of `(outer, n, inner)`.
pub fn sum_dim(x: &CpuStorage, outer: usize, n: usize, inner: usize) -> Result<CpuStorage> {
    Ok(float_match!("sum", x, |x| Float::store(sum_t(x, outer, n, inner))))
}

fn max_t<T: Float>(x: &[T], outer: usize, n: usize, inner: usize) -> (Vec<T>, Vec<i64>) {
    let mut val = vec![T::zero(); outer * inner];
    let mut arg = vec![0i64; outer * inner];
    val.par_iter_mut().zip(arg.par_iter_mut()).enumerate().with_min_len(1024).for_each(|(i, (v, a))| {
        let (o, j) = (i / inner, i % inner);
        let base = o * n * inner + j;
        let (mut best, mut bi) = (x[base], 0usize);
        for k in 1..n {
            let c = x[base + k * inner];
            // NaN propagates, as in PyTorch.
            if c > best || (c.is_nan() && !best.is_nan()) {
                best = c;
                bi = k;
            }
        }
        *v = best;
        *a = bi as i64;
    });
    (val, arg)
}

/// Max over the middle dim of `(outer, n, inner)`: values and the index of
/// the first maximum.
pub fn max_dim(x: &CpuStorage, outer: usize, n: usize, inner: usize) -> Result<(CpuStorage, Vec<i64>)> {
    Ok(float_match!("max", x, |x| {
        let (v, a) = max_t(x, outer, n, inner);
        (Float::store(v), a)
    }))
}

/// The gradient of `max_dim`: `g` scattered to the arg-max positions of an
/// `(outer, n, inner)` tensor.
pub fn max_dim_backward(g: &CpuStorage, arg: &[i64], outer: usize, n: usize, inner: usize) -> Result<CpuStorage> {
    Ok(float_match!("max_backward", g, |g| {
        let mut out = super::zeros_as(g, outer * n * inner);
        for i in 0..outer * inner {
            let (o, j) = (i / inner, i % inner);
            out[o * n * inner + arg[i] as usize * inner + j] = g[i];
        }
        Float::store(out)
    }))
}

/// Repeats `(outer, inner)` along a new middle dim of size `n` (the gradient
/// of a sum, and the broadcast of a reduced tensor).
pub fn expand_dim(x: &CpuStorage, outer: usize, n: usize, inner: usize) -> Result<CpuStorage> {
    Ok(float_match!("expand", x, |x| {
        let mut out = super::zeros_as(x, outer * n * inner);
        super::par_rows(&mut out, n * inner, |o, row| {
            let src = &x[o * inner..(o + 1) * inner];
            for k in 0..n {
                row[k * inner..(k + 1) * inner].copy_from_slice(src);
            }
        });
        Float::store(out)
    }))
}

/// Σx² in f64, element by element in index order (the order, and so the
/// bits, of summing a widened f64 copy), without making that copy: the
/// gradient-norm clip reads every gradient once per step.
pub fn sum_squares_f64(x: &CpuStorage) -> f64 {
    fn sq<T: Copy>(v: &[T], f: impl Fn(T) -> f64) -> f64 {
        v.iter().map(|&x| f(x) * f(x)).sum()
    }
    match x {
        CpuStorage::F32(v) => sq(v, |x| x as f64),
        CpuStorage::F64(v) => sq(v, |x| x),
        CpuStorage::F16(v) => sq(v, |x| x.to_f64()),
        CpuStorage::BF16(v) => sq(v, |x| x.to_f64()),
        CpuStorage::I64(v) => sq(v, |x| x as f64),
        CpuStorage::U8(v) => sq(v, |x| x as f64),
    }
}
