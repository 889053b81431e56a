//! Indexing on the GPU (`cuda/index.cu`): index_select and its backward
//! index_add, gather / scatter_add, masked_fill and where; mirrors
//! `backend::cpu::index`. Indices are checked on the host before a launch
//! (an out-of-range index is `Error::IndexOutOfRange`, as on the CPU), and
//! the backward sums are deterministic (a host-built inverse index, no atomics).

use super::kernels::index as k;
use super::nn_common::{elems, expect_dtype, expect_len, same, strided_words, upload_i64, value_bits, FLOATS};
use super::CudaStorage;
use crate::backend::cpu::elementwise::Bcast;
use crate::backend::cpu::index::{check_indices, gather_offsets};
use crate::error::{Error, Result};
use crate::tensor::DType;

/// The inverse of `idx` (values in `0..n`) in CSR form: for target `t`, the
/// positions `j` with `idx[j] == t`, ascending, are `pos[offs[t]..offs[t+1]]`.
fn inverse(idx: &[i64], n: usize) -> (Vec<i64>, Vec<i64>) {
    let mut offs = vec![0i64; n + 1];
    for &i in idx {
        offs[i as usize + 1] += 1;
    }
    for t in 0..n {
        offs[t + 1] += offs[t];
    }
    let mut fill: Vec<i64> = offs[..n].to_vec();
    let mut pos = vec![0i64; idx.len()];
    for (j, &i) in idx.iter().enumerate() {
        pos[fill[i as usize] as usize] = j as i64;
        fill[i as usize] += 1;
    }
    (offs, pos)
}

fn select(op: &'static str, x: &CudaStorage, outer: usize, n: usize, inner: usize, idx: &[i64]) -> Result<CudaStorage> {
    expect_len(op, "the input (outer, n, inner)", x, outer * n * inner)?;
    let dev = x.device();
    let m = outer * idx.len() * inner;
    let y = dev.alloc(x.dtype(), m)?;
    let ids = upload_i64(dev, idx)?;
    if m > 0 {
        k::index_select(dev, x.dtype(), elems(m), x, &ids, &y, outer as u64, n as u64, inner as u64, idx.len() as u64)?;
    }
    Ok(y)
}

fn add_back(op: &'static str, g: &CudaStorage, outer: usize, n: usize, inner: usize, idx: &[i64]) -> Result<CudaStorage> {
    expect_dtype(op, g, FLOATS)?;
    expect_len(op, "the gradient (outer, indices, inner)", g, outer * idx.len() * inner)?;
    let (offs, pos) = inverse(idx, n);
    let dev = g.device();
    let m = outer * n * inner;
    let out = dev.alloc(g.dtype(), m)?;
    let (offs, pos) = (upload_i64(dev, &offs)?, upload_i64(dev, &pos)?);
    if m > 0 {
        k::index_add(dev, g.dtype(), elems(m), g, &offs, &pos, &out, outer as u64, n as u64, inner as u64, idx.len() as u64)?;
    }
    Ok(out)
}

/// `out[o, j, i] = x[o, idx[j], i]` for `x` of layout `(outer, n, inner)`.
pub fn index_select(x: &CudaStorage, outer: usize, n: usize, inner: usize, idx: &[i64]) -> Result<CudaStorage> {
    check_indices("index_select", idx, n)?;
    select("index_select", x, outer, n, inner, idx)
}

/// The backward of index_select: `out[o, idx[j], i] += g[o, j, i]` into zeros
/// of layout `(outer, n, inner)`, each row's terms added in index order.
pub fn index_add(g: &CudaStorage, outer: usize, n: usize, inner: usize, idx: &[i64]) -> Result<CudaStorage> {
    check_indices("index_add", idx, n)?;
    add_back("index_add", g, outer, n, inner, idx)
}

fn flat_offsets(xdims: &[usize], idims: &[usize], dim: usize, index: &[i64]) -> Result<Vec<i64>> {
    if xdims.len() != idims.len() || dim >= xdims.len() || index.len() != idims.iter().product::<usize>() {
        return Err(Error::invalid(
            "gather",
            format!(
                "expected an index of rank {} with {} values, got dims {idims:?} with {} values along dim {dim}",
                xdims.len(),
                idims.iter().product::<usize>(),
                index.len()
            ),
        ));
    }
    Ok(gather_offsets(xdims, idims, dim, index)?.into_iter().map(|o| o as i64).collect())
}

/// `out[..., j, ...] = x[..., index[..., j, ...], ...]` along `dim` (torch.gather).
pub fn gather(x: &CudaStorage, xdims: &[usize], idims: &[usize], dim: usize, index: &[i64]) -> Result<CudaStorage> {
    let offs = flat_offsets(xdims, idims, dim, index)?;
    select("gather", x, 1, x.len(), 1, &offs)
}

/// The backward of gather: `g` added into zeros of shape `xdims` at the gathered positions.
pub fn scatter_add(g: &CudaStorage, xdims: &[usize], idims: &[usize], dim: usize, index: &[i64]) -> Result<CudaStorage> {
    let offs = flat_offsets(xdims, idims, dim, index)?;
    add_back("scatter_add", g, 1, xdims.iter().product(), 1, &offs)
}

fn mask_args(op: &'static str, mask: &CudaStorage, bc: &Bcast, out_len: usize) -> Result<[u64; 1 + 2 * super::nn_common::MAX_DIMS]> {
    if mask.dtype() != DType::U8 {
        return Err(Error::DTypeMismatch { op, expected: DType::U8, got: mask.dtype() });
    }
    if bc.out_dims.iter().product::<usize>() != out_len || bc.sb.len() != bc.out_dims.len() {
        return Err(Error::ShapeMismatch { op, expected: format!("{out_len} elements"), got: format!("a broadcast to {:?}", bc.out_dims) });
    }
    // The largest mask offset must be inside the mask.
    let last: usize = bc.out_dims.iter().zip(&bc.sb).map(|(&d, &s)| d.saturating_sub(1) * s).sum();
    if out_len > 0 && last >= mask.len() {
        return Err(Error::ShapeMismatch { op, expected: format!("a mask of more than {last} elements"), got: format!("{} elements", mask.len()) });
    }
    strided_words(op, &bc.out_dims, &bc.sb)
}

/// `out = mask ? value : x`, the mask (u8) broadcast to `x` through `bc` (a: x, b: mask).
pub(crate) fn masked_fill(x: &CudaStorage, mask: &CudaStorage, bc: &Bcast, value: f64) -> Result<CudaStorage> {
    let op = "masked_fill";
    let shape = mask_args(op, mask, bc, x.len())?;
    if mask.ordinal() != x.ordinal() {
        return Err(Error::invalid(op, format!("expected the mask on cuda:{}, got cuda:{}", x.ordinal(), mask.ordinal())));
    }
    let dev = x.device();
    let y = dev.alloc(x.dtype(), x.len())?;
    if !x.is_empty() {
        k::masked_fill(dev, x.dtype(), elems(x.len()), x, mask, &shape, &y, x.len() as u64, value_bits(x.dtype(), value))?;
    }
    Ok(y)
}

/// `out = mask ? a : b` with `a`, `b` of the output shape and the mask
/// broadcast through `bc` (a: output, b: mask).
pub(crate) fn where_cond(mask: &CudaStorage, bc: &Bcast, a: &CudaStorage, b: &CudaStorage) -> Result<CudaStorage> {
    let op = "where";
    same(op, a, b)?;
    expect_len(op, "b", b, a.len())?;
    let shape = mask_args(op, mask, bc, a.len())?;
    if mask.ordinal() != a.ordinal() {
        return Err(Error::invalid(op, format!("expected the mask on cuda:{}, got cuda:{}", a.ordinal(), mask.ordinal())));
    }
    let dev = a.device();
    let y = dev.alloc(a.dtype(), a.len())?;
    if !a.is_empty() {
        k::where_cond(dev, a.dtype(), elems(a.len()), mask, &shape, a, b, &y, a.len() as u64)?;
    }
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::inverse;

    #[test]
    fn inverse_lists_every_position_of_each_target_in_order() {
        let idx = [3i64, 0, 3, 1, 3, 0];
        let (offs, pos) = inverse(&idx, 5);
        assert_eq!(offs, vec![0, 2, 3, 3, 6, 6]);
        // Brute force: for each target, the positions that hold it, ascending.
        for t in 0..5 {
            let want: Vec<i64> = (0..idx.len() as i64).filter(|&j| idx[j as usize] == t as i64).collect();
            assert_eq!(pos[offs[t] as usize..offs[t + 1] as usize].to_vec(), want, "target {t}");
        }
    }

    #[test]
    fn inverse_of_no_indices_is_empty() {
        let (offs, pos) = inverse(&[], 3);
        assert_eq!(offs, vec![0; 4]);
        assert!(pos.is_empty());
    }
}
