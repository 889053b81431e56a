//! Copy kernels for the layouts the model needs: permute, narrow, pad, cat.
//! They move elements of any dtype. Layouts are described around one dim as
//! `(outer, n, inner)`.

use super::CpuStorage;
use crate::any_map;
use crate::error::{Error, Result};

/// Permutes `x` into `out` (x.len() elements, overwritten).
fn permute_t<T: Copy + Send + Sync>(x: &[T], dims: &[usize], perm: &[usize], mut out: Vec<T>) -> Vec<T> {
    let rank = dims.len();
    let in_strides = crate::tensor::Shape::from(dims).strides();
    let out_dims: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    let strides: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    if rank == 0 {
        out.copy_from_slice(x);
        return out;
    }
    let row = out_dims[rank - 1];
    let inner = strides[rank - 1];
    let swap_last = rank >= 2 && perm[rank - 2] == rank - 1 && perm[rank - 1] == rank - 2 && perm[..rank - 2].iter().enumerate().all(|(i, &p)| p == i);
    if swap_last {
        transpose_last(x, dims[rank - 2], dims[rank - 1], &mut out);
        return out;
    }
    super::par_rows(&mut out, row, |r, o| {
        let (mut rem, mut off) = (r, 0);
        for d in (0..rank - 1).rev() {
            off += (rem % out_dims[d]) * strides[d];
            rem /= out_dims[d];
        }
        if inner == 1 {
            // The last dim stays last (attention's head split and merge): one copy per row.
            o.copy_from_slice(&x[off..off + row]);
        } else {
            for (o, &v) in o.iter_mut().zip(x[off..].iter().step_by(inner)) {
                *o = v;
            }
        }
    });
    out
}

/// Side of the square tiles [`transpose_last`] copies.
const TILE: usize = 16;

/// `out[o][i][j] = x[o][j][i]` for (a×b) matrices `x[o]`, in TILE×TILE
/// tiles: an element at a time, reading down a column touched a new cache
/// line per element for rows longer than a line (3 ns per element for
/// (8, 124, 512) → (8, 512, 124)); a tile reads and writes TILE lines.
/// The matrices are the parallel tasks.
fn transpose_last<T: Copy + Send + Sync>(x: &[T], a: usize, b: usize, out: &mut [T]) {
    use rayon::prelude::*;
    let per = a * b;
    if per == 0 {
        return;
    }
    let one = |xm: &[T], om: &mut [T]| {
        for i0 in (0..b).step_by(TILE) {
            for j0 in (0..a).step_by(TILE) {
                for i in i0..(i0 + TILE).min(b) {
                    let orow = &mut om[i * a + j0..i * a + (j0 + TILE).min(a)];
                    for (j, o) in orow.iter_mut().enumerate() {
                        *o = xm[(j0 + j) * b + i];
                    }
                }
            }
        }
    };
    if out.len() >= super::PAR_THRESHOLD {
        out.par_chunks_mut(per).zip(x.par_chunks(per)).for_each(|(om, xm)| one(xm, om));
    } else {
        for (om, xm) in out.chunks_mut(per).zip(x.chunks(per)) {
            one(xm, om);
        }
    }
}

/// The copy of `x` (of shape `dims`) with its dims reordered: output dim `i`
/// is input dim `perm[i]`.
pub fn permute(x: &CpuStorage, dims: &[usize], perm: &[usize]) -> Result<CpuStorage> {
    // Float outputs come from the buffer pool.
    Ok(match x {
        CpuStorage::F32(x) => CpuStorage::F32(permute_t(x, dims, perm, super::pool::zeroed(x.len()))),
        CpuStorage::F64(x) => CpuStorage::F64(permute_t(x, dims, perm, super::pool::zeroed(x.len()))),
        _ => any_map!(x, |x| permute_t(x, dims, perm, x.to_vec())),
    })
}

fn narrow_t<T: Copy>(x: &[T], outer: usize, n: usize, inner: usize, start: usize, len: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(outer * len * inner);
    for o in 0..outer {
        let b = (o * n + start) * inner;
        out.extend_from_slice(&x[b..b + len * inner]);
    }
    out
}

/// Rows `start..start+len` of the middle dim of `(outer, n, inner)`.
pub fn narrow(x: &CpuStorage, outer: usize, n: usize, inner: usize, start: usize, len: usize) -> Result<CpuStorage> {
    if start + len > n {
        return Err(Error::invalid("narrow", format!("range {start}..{} is outside a dim of size {n}", start + len)));
    }
    Ok(any_map!(x, |x| narrow_t(x, outer, n, inner, start, len)))
}

fn pad_t<T: Copy>(x: &[T], outer: usize, n: usize, inner: usize, left: usize, right: usize, v: T) -> Vec<T> {
    let m = left + n + right;
    let mut out = vec![v; outer * m * inner];
    for o in 0..outer {
        out[(o * m + left) * inner..(o * m + left + n) * inner].copy_from_slice(&x[o * n * inner..(o + 1) * n * inner]);
    }
    out
}

/// Pads the middle dim of `(outer, n, inner)` with `left` and `right` rows of `value`.
pub fn pad(x: &CpuStorage, outer: usize, n: usize, inner: usize, left: usize, right: usize, value: f64) -> Result<CpuStorage> {
    Ok(match x {
        CpuStorage::F32(x) => CpuStorage::F32(pad_t(x, outer, n, inner, left, right, value as f32)),
        CpuStorage::F64(x) => CpuStorage::F64(pad_t(x, outer, n, inner, left, right, value)),
        CpuStorage::F16(x) => CpuStorage::F16(pad_t(x, outer, n, inner, left, right, crate::tensor::halfconv::f16_from_f64(value))),
        CpuStorage::BF16(x) => CpuStorage::BF16(pad_t(x, outer, n, inner, left, right, crate::tensor::halfconv::bf16_from_f64(value))),
        CpuStorage::I64(x) => CpuStorage::I64(pad_t(x, outer, n, inner, left, right, value as i64)),
        CpuStorage::U8(x) => CpuStorage::U8(pad_t(x, outer, n, inner, left, right, value as u8)),
    })
}

/// Concatenates tensors of layouts `(outer, n_i, inner)` along the middle dim.
pub fn cat(xs: &[&CpuStorage], outer: usize, ns: &[usize], inner: usize) -> Result<CpuStorage> {
    let first = xs.first().ok_or_else(|| Error::invalid("cat", "expected at least one tensor, got none"))?;
    let total: usize = ns.iter().sum();
    macro_rules! go {
        ($v:ident) => {{
            let parts: Vec<&Vec<_>> = xs
                .iter()
                .map(|s| match s {
                    CpuStorage::$v(v) => Ok(v),
                    o => Err(Error::DTypeMismatch { op: "cat", expected: first.dtype(), got: o.dtype() }),
                })
                .collect::<Result<_>>()?;
            let mut out = Vec::with_capacity(outer * total * inner);
            for o in 0..outer {
                for (p, &n) in parts.iter().zip(ns) {
                    out.extend_from_slice(&p[o * n * inner..(o + 1) * n * inner]);
                }
            }
            CpuStorage::$v(out)
        }};
    }
    Ok(match first {
        CpuStorage::F32(_) => go!(F32),
        CpuStorage::F64(_) => go!(F64),
        CpuStorage::F16(_) => go!(F16),
        CpuStorage::BF16(_) => go!(BF16),
        CpuStorage::I64(_) => go!(I64),
        CpuStorage::U8(_) => go!(U8),
    })
}
