//! index_select, gather, embedding lookups, masked_fill and where, on the
//! CPU or the GPU (the data's storage decides; index and mask tensors may
//! live on the host and are copied to the GPU when the data is there).
//! Backward: gradients scattered back (index_add / scatter_add) or masked.

use super::out_storage;
use super::placement::{as_cpu, as_gpu, to_gpu};
use super::same_kind;
use crate::autograd::record;
use crate::backend::cpu::elementwise::Bcast;
use crate::backend::cpu::index as cpu;
use crate::backend::cuda::index as gpu;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::tensor::{DType, Shape, Tensor};

fn i64s(op: &'static str, t: &Tensor) -> Result<Vec<i64>> {
    if t.dtype() != DType::I64 {
        return Err(Error::DTypeMismatch { op, expected: DType::I64, got: t.dtype() });
    }
    t.to_vec::<i64>()
}

/// Runs the CPU or the GPU form of a one-operand kernel on `x`'s storage.
fn on(
    x: &Tensor,
    c: impl FnOnce(&crate::backend::cpu::CpuStorage) -> Result<crate::backend::cpu::CpuStorage>,
    g: impl FnOnce(&crate::backend::cuda::CudaStorage) -> Result<crate::backend::cuda::CudaStorage>,
) -> Result<Storage> {
    Ok(match &*x.storage() {
        Storage::Cpu(s) => Storage::Cpu(c(s)?),
        Storage::Cuda(s) => Storage::Cuda(g(s)?),
    })
}

/// Rows `idx` (1-D i64) of `x` along `dim`.
pub fn index_select(x: &Tensor, dim: isize, idx: &Tensor) -> Result<Tensor> {
    super::expect_rank("index_select", "indices", idx, &[1])?;
    let d = x.shape().dim("index_select", dim)?;
    let ids = i64s("index_select", idx)?;
    let (o, n, i) = x.shape().split_at_dim(d);
    let mut dims = x.dims().to_vec();
    dims[d] = ids.len();
    let y = out_storage(on(x, |s| cpu::index_select(s, o, n, i, &ids), |s| gpu::index_select(s, o, n, i, &ids))?, dims);
    let from = x.shape().clone();
    Ok(record("index_select", &[x], y, vec![], move |g, _| {
        Ok(vec![Some(out_storage(on(g, |s| cpu::index_add(s, o, n, i, &ids), |s| gpu::index_add(s, o, n, i, &ids))?, from.clone()))])
    }))
}

/// `torch.gather(x, dim, index)`: `index` (i64) has `x`'s rank and no larger size on any other dim.
pub fn gather(x: &Tensor, dim: isize, index: &Tensor) -> Result<Tensor> {
    let d = x.shape().dim("gather", dim)?;
    if index.rank() != x.rank() || index.dims().iter().zip(x.dims()).enumerate().any(|(j, (a, b))| j != d && a > b) {
        return Err(Error::ShapeMismatch {
            op: "gather",
            expected: format!("an index of rank {} no larger than {} off dim {dim}", x.rank(), x.shape()),
            got: format!("{}", index.shape()),
        });
    }
    let ids = i64s("gather", index)?;
    let (xd, id) = (x.dims().to_vec(), index.dims().to_vec());
    let y = out_storage(on(x, |s| cpu::gather(s, &xd, &id, d, &ids), |s| gpu::gather(s, &xd, &id, d, &ids))?, id.clone());
    Ok(record("gather", &[x], y, vec![], move |g, _| {
        Ok(vec![Some(out_storage(on(g, |s| cpu::scatter_add(s, &xd, &id, d, &ids), |s| gpu::scatter_add(s, &xd, &id, d, &ids))?, xd.clone()))])
    }))
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

/// A u8 mask that broadcasts to `target`, and the broadcast (a: target, b: mask).
fn mask_bcast(op: &'static str, mask: &Tensor, target: &Shape) -> Result<Bcast> {
    if mask.dtype() != DType::U8 {
        return Err(Error::DTypeMismatch { op, expected: DType::U8, got: mask.dtype() });
    }
    let b = Shape::broadcast(op, target, mask.shape())?;
    if &b != target {
        return Err(Error::Broadcast { op, lhs: target.clone(), rhs: mask.shape().clone() });
    }
    Ok(Bcast { out_dims: target.dims().to_vec(), sa: target.strides(), sb: mask.shape().broadcast_strides(target) })
}

/// `masked_fill` of `x` on its device; the mask is copied to the GPU if needed.
fn fill(op: &'static str, x: &Tensor, mask: &Tensor, bc: &Bcast, value: f64) -> Result<Tensor> {
    let y = match &*x.storage() {
        Storage::Cpu(s) => Storage::Cpu(cpu::masked_fill(s, &mask.to_vec::<u8>()?, bc, value)?),
        Storage::Cuda(s) => Storage::Cuda(gpu::masked_fill(s, &*to_gpu(op, &mask.storage(), s)?, bc, value)?),
    };
    Ok(out_storage(y, x.shape().clone()))
}

/// `x` with `value` where `mask` (u8, broadcast to x) is non-zero.
pub fn masked_fill(x: &Tensor, mask: &Tensor, value: f64) -> Result<Tensor> {
    let bc = mask_bcast("masked_fill", mask, x.shape())?;
    let y = fill("masked_fill", x, mask, &bc, value)?;
    let m = mask.detach();
    Ok(record("masked_fill", &[x], y, vec![], move |g, _| Ok(vec![Some(fill("masked_fill", g, &m, &bc, 0.0)?)])))
}

/// `mask ? a : b` on `a`'s device; the mask is copied to the GPU if needed.
fn select_where(mask: &Tensor, bc: &Bcast, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let op = "where";
    let (ag, bg) = (a.storage(), b.storage());
    let y = match &*ag {
        Storage::Cpu(s) => Storage::Cpu(cpu::where_cond(&mask.to_vec::<u8>()?, bc, s, as_cpu(op, &bg)?)?),
        Storage::Cuda(s) => Storage::Cuda(gpu::where_cond(&*to_gpu(op, &mask.storage(), s)?, bc, s, as_gpu(op, &bg, s)?)?),
    };
    Ok(out_storage(y, a.shape().clone()))
}

/// `mask ? a : b` elementwise; `a` and `b` of one shape, the mask broadcast to it.
pub fn where_cond(mask: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    same_kind("where", a, b)?;
    if a.shape() != b.shape() {
        return Err(Error::ShapeMismatch { op: "where", expected: format!("b of shape {}", a.shape()), got: format!("{}", b.shape()) });
    }
    let bc = mask_bcast("where", mask, a.shape())?;
    let y = select_where(mask, &bc, a, b)?;
    let m = mask.detach();
    Ok(record("where", &[a, b], y, vec![], move |g, needs| {
        let ga = if needs[0] { Some(select_where(&m, &bc, g, &g.zeros_like()?)?) } else { None };
        let gb = if needs[1] { Some(fill("where", g, &m, &bc, 0.0)?) } else { None };
        Ok(vec![ga, gb])
    }))
}
