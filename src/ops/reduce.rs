//! sum / mean / max over dims. Backward of sum: the gradient repeated along
//! the reduced dims; of max: the gradient sent to the first arg-max.

use super::{mixed, out_storage};
use crate::autograd::{self, record};
use crate::backend::cpu::{reduce as k, CpuStorage};
use crate::backend::{cuda, Storage};
use crate::error::{Error, Result};
use crate::tensor::{DType, Shape, Tensor};

fn resolve(op: &'static str, x: &Tensor, dims: &[isize]) -> Result<Vec<usize>> {
    let mut ds = dims.iter().map(|&d| x.shape().dim(op, d)).collect::<Result<Vec<_>>>()?;
    ds.sort_unstable();
    ds.dedup();
    Ok(ds)
}

fn keep_shape(dims: &[usize], reduced: &[usize]) -> Vec<usize> {
    dims.iter().enumerate().map(|(i, &n)| if reduced.contains(&i) { 1 } else { n }).collect()
}

/// Repeats `g` (of `x`'s rank, size 1 on the reduced dims) back to `full`.
fn expand_to(g: &Tensor, full: &[usize]) -> Result<Tensor> {
    let mut cur: Option<Storage> = None;
    let mut dims = g.dims().to_vec();
    for d in 0..full.len() {
        if dims[d] == 1 && full[d] != 1 {
            let (o, _, i) = Shape::from(dims.clone()).split_at_dim(d);
            let step = |s: &Storage| -> Result<Storage> {
                Ok(match s {
                    Storage::Cpu(c) => Storage::Cpu(k::expand_dim(c, o, full[d], i)?),
                    Storage::Cuda(c) => Storage::Cuda(cuda::reduce::expand_dim(c, o, full[d], i)?),
                })
            };
            cur = Some(match &cur {
                Some(c) => step(c)?,
                None => step(&g.storage())?,
            });
            dims[d] = full[d];
        }
    }
    match cur {
        Some(c) => Ok(out_storage(c, full.to_vec())),
        None => Ok(g.reshaped(Shape::from(full.to_vec()), false)),
    }
}

/// `x` repeated along its size-1 dims to `dims` (same rank), as
/// `torch.Tensor.expand` but materialised: one kernel per expanded run of
/// dims. Backward: the gradient summed back over those dims.
pub fn broadcast_to(x: &Tensor, dims: &[usize]) -> Result<Tensor> {
    if x.rank() != dims.len() || x.dims().iter().zip(dims).any(|(&a, &b)| a != b && a != 1) {
        return Err(Error::ShapeMismatch {
            op: "broadcast_to",
            expected: format!("a shape that repeats size-1 dims to {dims:?}"),
            got: format!("{}", x.shape()),
        });
    }
    let y = expand_to(x, dims)?;
    let shape = x.shape().clone();
    Ok(record("broadcast_to", &[x], y, vec![], move |g, _| Ok(vec![Some(super::sum_to_shape(g, &shape)?)])))
}

/// The `(outer, n, inner)` steps that sum `shape` over the sorted dims
/// `ds`: each run of adjacent reduced dims is one step (so a full sum is one
/// pass), the last run first.
pub(crate) fn sum_steps(shape: &[usize], ds: &[usize]) -> Vec<(usize, usize, usize)> {
    let mut shape = shape.to_vec();
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &d in ds {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == d => *end = d,
            _ => runs.push((d, d)),
        }
    }
    let mut steps = Vec::new();
    for &(first, last) in runs.iter().rev() {
        let outer = shape[..first].iter().product();
        let n = shape[first..=last].iter().product();
        let inner = shape[last + 1..].iter().product();
        steps.push((outer, n, inner));
        shape[first..=last].iter_mut().for_each(|s| *s = 1);
    }
    steps
}

/// `s` summed by `steps` in the accumulation type: half storage on the GPU
/// keeps every partial sum in f32 (unrounded), f32/f64 their own dtype.
/// `None` when there is no step.
pub(crate) fn sum_acc(s: &Storage, steps: &[(usize, usize, usize)]) -> Result<Option<Storage>> {
    let mut cur: Option<Storage> = None;
    for &(o, n, i) in steps {
        let src = cur.as_ref().unwrap_or(s);
        cur = Some(match src {
            Storage::Cpu(c) => Storage::Cpu(k::sum_dim(c, o, n, i)?),
            Storage::Cuda(c) => Storage::Cuda(cuda::reduce::sum_dim_acc(c, o, n, i)?),
        });
    }
    Ok(cur)
}

/// `s` converted to `dtype` (the one rounding of an accumulated sum).
pub(crate) fn round_to(s: Storage, dtype: DType) -> Result<Storage> {
    if s.dtype() == dtype {
        return Ok(s);
    }
    Ok(match &s {
        Storage::Cpu(c) => Storage::Cpu(c.to_dtype(dtype)),
        Storage::Cuda(c) => Storage::Cuda(cuda::cast::to_dtype(c, dtype)?),
    })
}

/// Sum (or, with `mean`, mean) over `dims`: every partial sum stays in the
/// accumulation type (f32 for halves) and the result is rounded once.
fn reduce_sum(op: &'static str, x: &Tensor, dims: &[isize], keepdim: bool, mean: bool) -> Result<Tensor> {
    let ds = resolve(op, x, dims)?;
    let count: usize = ds.iter().map(|&d| x.dims()[d]).product();
    if mean && count == 0 {
        return Err(Error::invalid(op, format!("mean over empty dims of shape {}", x.shape())));
    }
    let scale = if mean { 1.0 / count as f64 } else { 1.0 };
    let kept = keep_shape(x.dims(), &ds);
    let final_shape: Vec<usize> = if keepdim { kept.clone() } else { x.dims().iter().enumerate().filter(|(i, _)| !ds.contains(i)).map(|(_, &n)| n).collect() };
    let steps = sum_steps(x.dims(), &ds);
    let dtype = x.dtype();
    // One reduced run of a half tensor on the GPU: the kernel accumulates in
    // f32 and rounds once as it writes, with no cast launch after it.
    let direct = match (&*x.storage(), steps.as_slice()) {
        (Storage::Cuda(c), &[(o, n, i)]) if !mean && matches!(dtype, DType::F16 | DType::BF16) => Some(Storage::Cuda(cuda::reduce::sum_dim(c, o, n, i)?)),
        _ => None,
    };
    let y = match direct {
        Some(y) => out_storage(y, final_shape),
        None => {
            let acc = match sum_acc(&x.storage(), &steps)? {
                Some(a) => a,
                // No dim reduced: a copy.
                None => match &*x.storage() {
                    Storage::Cpu(c) => Storage::Cpu(c.clone()),
                    Storage::Cuda(c) => Storage::Cuda(c.try_clone()?),
                },
            };
            autograd::no_grad(|| -> Result<Tensor> {
                let mut t = out_storage(acc, final_shape);
                if mean {
                    t = super::mul_scalar(&t, scale)?;
                }
                super::to_dtype(&t, dtype)
            })?
        }
    };
    let full = x.dims().to_vec();
    Ok(record(op, &[x], y, vec![], move |g, _| {
        let g = if mean { super::mul_scalar(g, scale)? } else { g.clone() };
        let gk = g.reshaped(Shape::from(kept.clone()), false);
        Ok(vec![Some(expand_to(&gk, &full)?)])
    }))
}

/// Sum over `dims` (negative dims count from the end); `keepdim` keeps them as size 1.
pub fn sum(x: &Tensor, dims: &[isize], keepdim: bool) -> Result<Tensor> {
    reduce_sum("sum", x, dims, keepdim, false)
}

/// Mean over `dims` (summed in the accumulation type, scaled, rounded once).
pub fn mean(x: &Tensor, dims: &[isize], keepdim: bool) -> Result<Tensor> {
    reduce_sum("mean", x, dims, keepdim, true)
}

/// Sum of every element (a 0-dim tensor).
pub fn sum_all(x: &Tensor) -> Result<Tensor> {
    let all: Vec<isize> = (0..x.rank() as isize).collect();
    sum(x, &all, false)
}

/// Mean of every element (a 0-dim tensor).
pub fn mean_all(x: &Tensor) -> Result<Tensor> {
    let all: Vec<isize> = (0..x.rank() as isize).collect();
    mean(x, &all, false)
}

/// Max over one dim (the values; the gradient goes to the first maximum).
pub fn max(x: &Tensor, dim: isize, keepdim: bool) -> Result<Tensor> {
    let d = x.shape().dim("max", dim)?;
    let (o, n, i) = x.shape().split_at_dim(d);
    if n == 0 {
        return Err(Error::invalid("max", format!("max over an empty dim {dim} of shape {}", x.shape())));
    }
    let (v, arg) = match &*x.storage() {
        Storage::Cpu(c) => {
            let (v, a) = k::max_dim(c, o, n, i)?;
            (Storage::Cpu(v), Storage::Cpu(CpuStorage::I64(a)))
        }
        Storage::Cuda(c) => {
            let (v, a) = cuda::reduce::max_dim(c, o, n, i)?;
            (Storage::Cuda(v), Storage::Cuda(a))
        }
    };
    let mut shape = x.dims().to_vec();
    if keepdim {
        shape[d] = 1;
    } else {
        shape.remove(d);
    }
    let y = out_storage(v, shape);
    let arg = out_storage(arg, [o * i]);
    let full = x.shape().clone();
    Ok(record("max", &[x], y, vec![], move |g, _| {
        let gx = match (&*g.storage(), &*arg.storage()) {
            (Storage::Cpu(g), Storage::Cpu(a)) => Storage::Cpu(k::max_dim_backward(g, a.as_i64("max_backward")?, o, n, i)?),
            (Storage::Cuda(g), Storage::Cuda(a)) => Storage::Cuda(cuda::reduce::max_dim_backward(g, a, o, n, i)?),
            _ => return Err(mixed("max_backward")),
        };
        Ok(vec![Some(out_storage(gx, full.clone()))])
    }))
}
