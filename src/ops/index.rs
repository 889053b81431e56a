//! index_select, gather, embedding lookups, masked_fill and where.
//! Backward: gradients scattered back (index_add / scatter_add) or masked.

use super::{cpu, out, same_kind};
use crate::autograd::record;
use crate::backend::cpu::elementwise::Bcast;
use crate::backend::cpu::index as k;
use crate::error::{Error, Result};
use crate::tensor::{DType, Shape, Tensor};

fn i64s(op: &'static str, t: &Tensor) -> Result<Vec<i64>> {
    if t.dtype() != DType::I64 {
        return Err(Error::DTypeMismatch { op, expected: DType::I64, got: t.dtype() });
    }
    t.to_vec::<i64>()
}

/// Rows `idx` (1-D i64) of `x` along `dim`.
pub fn index_select(x: &Tensor, dim: isize, idx: &Tensor) -> Result<Tensor> {
    super::expect_rank("index_select", "indices", idx, &[1])?;
    let d = x.shape().dim("index_select", dim)?;
    let ids = i64s("index_select", idx)?;
    let (o, n, i) = x.shape().split_at_dim(d);
    let mut dims = x.dims().to_vec();
    dims[d] = ids.len();
    let y = out(k::index_select(cpu("index", &x.storage())?, o, n, i, &ids)?, dims);
    let from = x.shape().clone();
    Ok(record("index_select", &[x], y, vec![], move |g, _| Ok(vec![Some(out(k::index_add(cpu("index", &g.storage())?, o, n, i, &ids)?, from.clone()))])))
}

/// `torch.gather(x, dim, index)`: `index` (i64) has `x`'s rank and no larger size on any other dim.
pub fn gather(x: &Tensor, dim: isize, index: &Tensor) -> Result<Tensor> {
    let d = x.shape().dim("gather", dim)?;
    if index.rank() != x.rank() || index.dims().iter().zip(x.dims()).enumerate().any(|(j, (a, b))| j != d && a > b) {
        return Err(Error::ShapeMismatch { op: "gather", expected: format!("an index of rank {} no larger than {} off dim {dim}", x.rank(), x.shape()), got: format!("{}", index.shape()) });
    }
    let ids = i64s("gather", index)?;
    let (xd, id) = (x.dims().to_vec(), index.dims().to_vec());
    let y = out(k::gather(cpu("index", &x.storage())?, &xd, &id, d, &ids)?, id.clone());
    Ok(record("gather", &[x], y, vec![], move |g, _| Ok(vec![Some(out(k::scatter_add(cpu("index", &g.storage())?, &xd, &id, d, &ids)?, xd.clone()))])))
}

/// Embedding lookup: `weight` (V, D), `ids` (i64, any shape) → ids.shape + [D].
/// The backward scatters (adds) the gradient rows into the looked-up rows.
pub fn embedding(weight: &Tensor, ids: &Tensor) -> Result<Tensor> {
    super::expect_rank("embedding", "weight", weight, &[2])?;
    let flat = super::reshape(ids, [ids.elem_count()])?;
    let rows = index_select(weight, 0, &flat)?;
    let mut dims = ids.dims().to_vec();
    dims.push(weight.dims()[1]);
    super::reshape(&rows, dims)
}

fn mask_bcast(op: &'static str, mask: &Tensor, target: &Shape) -> Result<(Vec<u8>, Bcast)> {
    if mask.dtype() != DType::U8 {
        return Err(Error::DTypeMismatch { op, expected: DType::U8, got: mask.dtype() });
    }
    let b = Shape::broadcast(op, target, mask.shape())?;
    if &b != target {
        return Err(Error::Broadcast { op, lhs: target.clone(), rhs: mask.shape().clone() });
    }
    let bc = Bcast { out_dims: target.dims().to_vec(), sa: target.strides(), sb: mask.shape().broadcast_strides(target) };
    Ok((mask.to_vec::<u8>()?, bc))
}

/// `x` with `value` where `mask` (u8, broadcast to x) is non-zero.
pub fn masked_fill(x: &Tensor, mask: &Tensor, value: f64) -> Result<Tensor> {
    let (m, bc) = mask_bcast("masked_fill", mask, x.shape())?;
    let y = out(k::masked_fill(cpu("index", &x.storage())?, &m, &bc, value)?, x.shape().clone());
    Ok(record("masked_fill", &[x], y, vec![], move |g, _| Ok(vec![Some(out(k::masked_fill(cpu("index", &g.storage())?, &m, &bc, 0.0)?, g.shape().clone()))])))
}

/// `mask ? a : b` elementwise; `a` and `b` of one shape, the mask broadcast to it.
pub fn where_cond(mask: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    same_kind("where", a, b)?;
    if a.shape() != b.shape() {
        return Err(Error::ShapeMismatch { op: "where", expected: format!("b of shape {}", a.shape()), got: format!("{}", b.shape()) });
    }
    let (m, bc) = mask_bcast("where", mask, a.shape())?;
    let y = out(k::where_cond(&m, &bc, cpu("index", &a.storage())?, cpu("index", &b.storage())?)?, a.shape().clone());
    Ok(record("where", &[a, b], y, vec![], move |g, needs| {
        let gs = cpu("index", &g.storage())?.clone();
        let ga = if needs[0] { Some(out(k::where_cond(&m, &bc, &gs, &crate::backend::cpu::CpuStorage::full(g.dtype(), gs.len(), 0.0))?, g.shape().clone())) } else { None };
        let gb = if needs[1] { Some(out(k::masked_fill(&gs, &m, &bc, 0.0)?, g.shape().clone())) } else { None };
        Ok(vec![ga, gb])
    }))
}
