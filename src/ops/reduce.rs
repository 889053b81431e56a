//! sum / mean / max over dims. Backward of sum: the gradient repeated along
//! the reduced dims; of max: the gradient sent to the first arg-max.

use super::{mixed, out_storage};
use crate::autograd::record;
use crate::backend::cpu::{reduce as k, CpuStorage};
use crate::backend::{cuda, Storage};
use crate::error::{Error, Result};
use crate::tensor::{Shape, Tensor};

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

/// Sum over `dims` (negative dims count from the end); `keepdim` keeps them as size 1.
pub fn sum(x: &Tensor, dims: &[isize], keepdim: bool) -> Result<Tensor> {
    let ds = resolve("sum", x, dims)?;
    let mut cur: Option<Storage> = None;
    let mut shape = x.dims().to_vec();
    for &d in ds.iter().rev() {
        let (o, n, i) = Shape::from(shape.clone()).split_at_dim(d);
        let step = |s: &Storage| -> Result<Storage> {
            Ok(match s {
                Storage::Cpu(c) => Storage::Cpu(k::sum_dim(c, o, n, i)?),
                Storage::Cuda(c) => Storage::Cuda(cuda::reduce::sum_dim(c, o, n, i)?),
            })
        };
        cur = Some(match &cur {
            Some(c) => step(c)?,
            None => step(&x.storage())?,
        });
        shape[d] = 1;
    }
    let cur = match cur {
        Some(c) => c,
        // No dim reduced: a copy.
        None => match &*x.storage() {
            Storage::Cpu(c) => Storage::Cpu(c.clone()),
            Storage::Cuda(c) => Storage::Cuda(c.try_clone()?),
        },
    };
    let kept = keep_shape(x.dims(), &ds);
    let final_shape: Vec<usize> = if keepdim { kept.clone() } else { x.dims().iter().enumerate().filter(|(i, _)| !ds.contains(i)).map(|(_, &n)| n).collect() };
    let y = out_storage(cur, final_shape);
    let full = x.dims().to_vec();
    Ok(record("sum", &[x], y, vec![], move |g, _| {
        let gk = g.reshaped(Shape::from(kept.clone()), false);
        Ok(vec![Some(expand_to(&gk, &full)?)])
    }))
}

/// Mean over `dims`.
pub fn mean(x: &Tensor, dims: &[isize], keepdim: bool) -> Result<Tensor> {
    let ds = resolve("mean", x, dims)?;
    let n: usize = ds.iter().map(|&d| x.dims()[d]).product();
    if n == 0 {
        return Err(Error::invalid("mean", format!("mean over empty dims of shape {}", x.shape())));
    }
    super::mul_scalar(&sum(x, dims, keepdim)?, 1.0 / n as f64)
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
