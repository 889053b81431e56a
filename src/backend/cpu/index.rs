//! Indexing kernels: index_select and its scatter-add backward (embedding
//! lookups use them), gather / scatter_add (torch.gather semantics),
//! masked_fill and where. Masks are u8 (0 or 1) and broadcast to the data.

use super::elementwise::Bcast;
use super::{CpuStorage, Float};
use crate::any_map;
use crate::error::{Error, Result};
use crate::float_match;

pub(crate) fn check_indices(op: &'static str, idx: &[i64], n: usize) -> Result<()> {
    match idx.iter().find(|&&i| i < 0 || i as usize >= n) {
        Some(&i) => Err(Error::IndexOutOfRange { op, index: i, size: n }),
        None => Ok(()),
    }
}

/// `out[o, j, i] = x[o, idx[j], i]` for `x` of layout `(outer, n, inner)`.
pub fn index_select(x: &CpuStorage, outer: usize, n: usize, inner: usize, idx: &[i64]) -> Result<CpuStorage> {
    check_indices("index_select", idx, n)?;
    Ok(any_map!(x, |x| {
        let mut out = Vec::with_capacity(outer * idx.len() * inner);
        for o in 0..outer {
            for &j in idx {
                let b = (o * n + j as usize) * inner;
                out.extend_from_slice(&x[b..b + inner]);
            }
        }
        out
    }))
}

/// The backward of index_select: `out[o, idx[j], i] += g[o, j, i]` into zeros
/// of layout `(outer, n, inner)`. Rows are added in index order (deterministic).
pub fn index_add(g: &CpuStorage, outer: usize, n: usize, inner: usize, idx: &[i64]) -> Result<CpuStorage> {
    check_indices("index_add", idx, n)?;
    Ok(float_match!("index_add", g, |g| {
        let mut out = super::zeros_as(g, outer * n * inner);
        for o in 0..outer {
            for (j, &t) in idx.iter().enumerate() {
                let src = &g[(o * idx.len() + j) * inner..(o * idx.len() + j + 1) * inner];
                let dst = &mut out[(o * n + t as usize) * inner..(o * n + t as usize + 1) * inner];
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d = *d + s;
                }
            }
        }
        Float::store(out)
    }))
}

/// Offsets for gather/scatter: for every element of `index` (shape `idims`),
/// the offset in a tensor of shape `xdims` with dim `dim` replaced by the index value.
pub(crate) fn gather_offsets(xdims: &[usize], idims: &[usize], dim: usize, index: &[i64]) -> Result<Vec<usize>> {
    check_indices("gather", index, xdims[dim])?;
    let xs = crate::tensor::Shape::from(xdims).strides();
    let rank = idims.len();
    let mut offs = Vec::with_capacity(index.len());
    let mut pos = vec![0usize; rank];
    for &iv in index {
        let mut off = 0;
        for d in 0..rank {
            off += if d == dim { iv as usize } else { pos[d] } * xs[d];
        }
        offs.push(off);
        for d in (0..rank).rev() {
            pos[d] += 1;
            if pos[d] < idims[d] {
                break;
            }
            pos[d] = 0;
        }
    }
    Ok(offs)
}

/// `out[..., j, ...] = x[..., index[..., j, ...], ...]` along `dim` (torch.gather).
pub fn gather(x: &CpuStorage, xdims: &[usize], idims: &[usize], dim: usize, index: &[i64]) -> Result<CpuStorage> {
    let offs = gather_offsets(xdims, idims, dim, index)?;
    Ok(any_map!(x, |x| offs.iter().map(|&o| x[o]).collect()))
}

/// The backward of gather: `g` added into zeros of shape `xdims` at the gathered positions.
pub fn scatter_add(g: &CpuStorage, xdims: &[usize], idims: &[usize], dim: usize, index: &[i64]) -> Result<CpuStorage> {
    let offs = gather_offsets(xdims, idims, dim, index)?;
    Ok(float_match!("scatter_add", g, |g| {
        let mut out = super::zeros_as(g, xdims.iter().product());
        for (&o, &v) in offs.iter().zip(g.iter()) {
            out[o] = out[o] + v;
        }
        Float::store(out)
    }))
}

/// `out = mask ? value : x`, the mask broadcast to `x` through `bc` (a: x, b: mask).
pub(crate) fn masked_fill(x: &CpuStorage, mask: &[u8], bc: &Bcast, value: f64) -> Result<CpuStorage> {
    Ok(float_match!("masked_fill", x, |x| {
        let v = super::of_as(x, value);
        let mut out = x.to_vec();
        let row = bc.row();
        let (_, im) = bc.inner();
        super::par_rows(&mut out, row, |r, o| {
            let (_, om) = bc.offsets(r);
            for (j, o) in o.iter_mut().enumerate() {
                if mask[om + j * im] != 0 {
                    *o = v;
                }
            }
        });
        Float::store(out)
    }))
}

/// `out = mask ? a : b` with `a`, `b` of the output shape and the mask
/// broadcast through `bc` (a: output, b: mask).
pub(crate) fn where_cond(mask: &[u8], bc: &Bcast, a: &CpuStorage, b: &CpuStorage) -> Result<CpuStorage> {
    Ok(float_match!("where", (a, b), |a, b| {
        let mut out = b.to_vec();
        let row = bc.row();
        let (_, im) = bc.inner();
        super::par_rows(&mut out, row, |r, o| {
            let (_, om) = bc.offsets(r);
            for (j, o) in o.iter_mut().enumerate() {
                if mask[om + j * im] != 0 {
                    *o = a[r * row + j];
                }
            }
        });
        Float::store(out)
    }))
}
