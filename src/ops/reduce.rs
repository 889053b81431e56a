//! sum / mean / max over dims. Backward of sum: the gradient repeated along
//! the reduced dims; of max: the gradient sent to the first arg-max.

use super::{cpu, out};
use crate::autograd::record;
use crate::backend::cpu::reduce as k;
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
    let mut cur = cpu("reduce", &g.storage())?.clone();
    let mut dims = g.dims().to_vec();
    for d in 0..full.len() {
        if dims[d] == 1 && full[d] != 1 {
            let (o, _, i) = Shape::from(dims.clone()).split_at_dim(d);
            cur = k::expand_dim(&cur, o, full[d], i)?;
            dims[d] = full[d];
        }
    }
    Ok(out(cur, full.to_vec()))
}

/// Sum over `dims` (negative dims count from the end); `keepdim` keeps them as size 1.
pub fn sum(x: &Tensor, dims: &[isize], keepdim: bool) -> Result<Tensor> {
    let ds = resolve("sum", x, dims)?;
    let mut cur = cpu("reduce", &x.storage())?.clone();
    let mut shape = x.dims().to_vec();
    for &d in ds.iter().rev() {
        let (o, n, i) = Shape::from(shape.clone()).split_at_dim(d);
        cur = k::sum_dim(&cur, o, n, i)?;
        shape[d] = 1;
    }
    let kept = keep_shape(x.dims(), &ds);
    let final_shape: Vec<usize> = if keepdim { kept.clone() } else { x.dims().iter().enumerate().filter(|(i, _)| !ds.contains(i)).map(|(_, &n)| n).collect() };
    let y = out(cur, final_shape);
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
    let (v, arg) = k::max_dim(cpu("reduce", &x.storage())?, o, n, i)?;
    let mut shape = x.dims().to_vec();
    if keepdim {
        shape[d] = 1;
    } else {
        shape.remove(d);
    }
    let y = out(v, shape);
    let full = x.shape().clone();
    Ok(record("max", &[x], y, vec![], move |g, _| {
        Ok(vec![Some(out(k::max_dim_backward(cpu("reduce", &g.storage())?, &arg, o, n, i)?, full.clone()))])
    }))
}
