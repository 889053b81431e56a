//! reshape (shares storage), permute / transpose (explicit copies), narrow,
//! pad, cat and stack, each with its backward: the inverse layout change.
//! The copies run on the CPU or the GPU, where the input's storage is.

use super::placement::{as_cpu, as_gpu};
use crate::autograd::record;
use crate::backend::cpu::layout as k;
use crate::backend::cuda::layout as gpu;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::tensor::{Shape, Tensor};

/// The copy kernel's output on the input's device, as a fresh tensor.
fn copy(
    x: &Tensor,
    shape: Vec<usize>,
    c: impl FnOnce(&crate::backend::cpu::CpuStorage) -> Result<crate::backend::cpu::CpuStorage>,
    g: impl FnOnce(&crate::backend::cuda::CudaStorage) -> Result<crate::backend::cuda::CudaStorage>,
) -> Result<Tensor> {
    let s = match &*x.storage() {
        Storage::Cpu(s) => Storage::Cpu(c(s)?),
        Storage::Cuda(s) => Storage::Cuda(g(s)?),
    };
    Ok(Tensor::from_storage(s, Shape::from(shape)))
}

/// The same elements under `shape` (shares the storage; no copy).
pub fn reshape(x: &Tensor, shape: impl Into<Shape>) -> Result<Tensor> {
    let shape = shape.into();
    if shape.elem_count() != x.elem_count() {
        return Err(Error::ShapeMismatch {
            op: "reshape",
            expected: format!("a shape of {} elements like {}", x.elem_count(), x.shape()),
            got: format!("{shape}"),
        });
    }
    let y = x.reshaped(shape, false);
    let from = x.shape().clone();
    Ok(record("reshape", &[x], y, vec![], move |g, _| Ok(vec![Some(g.reshaped(from.clone(), false))])))
}

/// Inserts a dim of size 1 at `dim` (`-1` appends).
pub fn unsqueeze(x: &Tensor, dim: isize) -> Result<Tensor> {
    let r = x.rank() as isize + 1;
    let d = if dim < 0 { dim + r } else { dim };
    if d < 0 || d >= r {
        return Err(Error::DimOutOfRange { op: "unsqueeze", dim, rank: x.rank() });
    }
    let mut dims = x.dims().to_vec();
    dims.insert(d as usize, 1);
    reshape(x, dims)
}

/// Removes dim `dim`, which must have size 1.
pub fn squeeze(x: &Tensor, dim: isize) -> Result<Tensor> {
    let d = x.shape().dim("squeeze", dim)?;
    if x.dims()[d] != 1 {
        return Err(Error::ShapeMismatch { op: "squeeze", expected: format!("size 1 at dim {dim}"), got: format!("shape {}", x.shape()) });
    }
    let mut dims = x.dims().to_vec();
    dims.remove(d);
    reshape(x, dims)
}

/// Merges dims `start..=end` into one.
pub fn flatten(x: &Tensor, start: isize, end: isize) -> Result<Tensor> {
    let (s, e) = (x.shape().dim("flatten", start)?, x.shape().dim("flatten", end)?);
    if s > e {
        return Err(Error::invalid("flatten", format!("start dim {start} is after end dim {end}")));
    }
    let d = x.dims();
    let mut dims = d[..s].to_vec();
    dims.push(d[s..=e].iter().product());
    dims.extend_from_slice(&d[e + 1..]);
    reshape(x, dims)
}

/// Reorders dims: output dim `i` is input dim `perm[i]` (a copy).
pub fn permute(x: &Tensor, perm: &[usize]) -> Result<Tensor> {
    let r = x.rank();
    let mut seen = vec![false; r];
    if perm.len() != r || perm.iter().any(|&p| p >= r || std::mem::replace(&mut seen[p], true)) {
        return Err(Error::invalid("permute", format!("{perm:?} is not a permutation of the {r} dims of {}", x.shape())));
    }
    let dims: Vec<usize> = perm.iter().map(|&p| x.dims()[p]).collect();
    let xd = x.dims().to_vec();
    let y = copy(x, dims, |s| k::permute(s, &xd, perm), |s| gpu::permute(s, &xd, perm))?;
    let mut inv = vec![0; r];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    Ok(record("permute", &[x], y, vec![], move |g, _| Ok(vec![Some(permute(g, &inv)?)])))
}

/// Swaps two dims (a copy).
pub fn transpose(x: &Tensor, d0: isize, d1: isize) -> Result<Tensor> {
    let (a, b) = (x.shape().dim("transpose", d0)?, x.shape().dim("transpose", d1)?);
    let mut perm: Vec<usize> = (0..x.rank()).collect();
    perm.swap(a, b);
    permute(x, &perm)
}

/// Elements `start..start+len` along `dim` (a copy).
pub fn narrow(x: &Tensor, dim: isize, start: usize, len: usize) -> Result<Tensor> {
    let d = x.shape().dim("narrow", dim)?;
    let (o, n, i) = x.shape().split_at_dim(d);
    if start + len > n {
        return Err(Error::invalid("narrow", format!("range {start}..{} is outside dim {dim} of size {n} (shape {})", start + len, x.shape())));
    }
    let mut dims = x.dims().to_vec();
    dims[d] = len;
    let y = copy(x, dims, |s| k::narrow(s, o, n, i, start, len), |s| gpu::narrow(s, o, n, i, start, len))?;
    Ok(record("narrow", &[x], y, vec![], move |g, _| Ok(vec![Some(pad(g, d as isize, start, n - start - len, 0.0)?)])))
}

/// Pads `dim` with `left` and `right` elements of `value`.
pub fn pad(x: &Tensor, dim: isize, left: usize, right: usize, value: f64) -> Result<Tensor> {
    let d = x.shape().dim("pad", dim)?;
    let (o, n, i) = x.shape().split_at_dim(d);
    let mut dims = x.dims().to_vec();
    dims[d] = left + n + right;
    let y = copy(x, dims, |s| k::pad(s, o, n, i, left, right, value), |s| gpu::pad(s, o, n, i, left, right, value))?;
    Ok(record("pad", &[x], y, vec![], move |g, _| Ok(vec![Some(narrow(g, d as isize, left, n)?)])))
}

/// Concatenates along `dim`; every other dim must agree.
pub fn cat(xs: &[&Tensor], dim: isize) -> Result<Tensor> {
    let first = xs.first().ok_or_else(|| Error::invalid("cat", "expected at least one tensor, got none"))?;
    let d = first.shape().dim("cat", dim)?;
    for t in xs {
        super::same_kind("cat", first, t)?;
        let ok = t.rank() == first.rank() && t.dims().iter().zip(first.dims()).enumerate().all(|(j, (a, b))| j == d || a == b);
        if !ok {
            return Err(Error::ShapeMismatch {
                op: "cat",
                expected: format!("shapes like {} except at dim {dim}", first.shape()),
                got: format!("{}", t.shape()),
            });
        }
    }
    let (o, _, i) = first.shape().split_at_dim(d);
    let ns: Vec<usize> = xs.iter().map(|t| t.dims()[d]).collect();
    let mut dims = first.dims().to_vec();
    dims[d] = ns.iter().sum();
    let y = {
        let guards: Vec<_> = xs.iter().map(|t| t.storage()).collect();
        let s = match &*guards[0] {
            Storage::Cpu(_) => Storage::Cpu(k::cat(&guards.iter().map(|g| as_cpu("cat", g)).collect::<Result<Vec<_>>>()?, o, &ns, i)?),
            Storage::Cuda(f) => Storage::Cuda(gpu::cat(&guards.iter().map(|g| as_gpu("cat", g, f)).collect::<Result<Vec<_>>>()?, o, &ns, i)?),
        };
        Tensor::from_storage(s, Shape::from(dims))
    };
    Ok(record("cat", xs, y, vec![], move |g, needs| {
        let mut start = 0;
        let mut gs = Vec::with_capacity(ns.len());
        for (&n, &need) in ns.iter().zip(needs) {
            gs.push(if need { Some(narrow(g, d as isize, start, n)?) } else { None });
            start += n;
        }
        Ok(gs)
    }))
}

/// Stacks equal-shaped tensors along a new dim.
pub fn stack(xs: &[&Tensor], dim: isize) -> Result<Tensor> {
    let us = xs.iter().map(|t| unsqueeze(t, dim)).collect::<Result<Vec<_>>>()?;
    let refs: Vec<&Tensor> = us.iter().collect();
    cat(&refs, dim)
}
