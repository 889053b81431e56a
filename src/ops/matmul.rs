//! Matrix products with transposes as flags, batched, and `linear`.
//!
//! C = op(A)·op(B), op(A): (…, M, K), op(B): (…, K, N). Either operand may
//! be 2-D and shared by every batch; otherwise the batch dims must agree.
//! Backward: dop(A) = dC·op(B)ᵀ, dop(B) = op(A)ᵀ·dC, each written as one
//! more product with flags (no transposed copies), summed over the batch for
//! a shared operand.

use super::matmul_scaled::grad_product;
use super::{mixed, out_storage, same_kind};
use crate::autograd::record;
use crate::backend::cpu::matmul::{self as k, MatmulDims};
use crate::backend::{cuda, Storage};
use crate::error::{Error, Result};
use crate::tensor::{Shape, Tensor};

/// A product's GEMM dims and output shape.
pub(super) struct Plan {
    pub(super) d: MatmulDims,
    pub(super) out: Vec<usize>,
}

pub(super) fn plan(a: &Tensor, b: &Tensor, ta: bool, tb: bool) -> Result<Plan> {
    if a.rank() < 2 || b.rank() < 2 {
        return Err(Error::ShapeMismatch { op: "matmul", expected: "operands of rank >= 2".into(), got: format!("{} and {}", a.shape(), b.shape()) });
    }
    let (ad, bd) = (a.dims(), b.dims());
    let (ra, ca) = (ad[ad.len() - 2], ad[ad.len() - 1]);
    let (rb, cb) = (bd[bd.len() - 2], bd[bd.len() - 1]);
    let (m, ka) = if ta { (ca, ra) } else { (ra, ca) };
    let (kb, n) = if tb { (cb, rb) } else { (rb, cb) };
    if ka != kb {
        return Err(Error::ShapeMismatch {
            op: "matmul",
            expected: format!("inner dims to agree (op(a) is {m}x{ka})"),
            got: format!("op(b) is {kb}x{n} (a {}, b {}, trans {ta}/{tb})", a.shape(), b.shape()),
        });
    }
    let (ba, bb) = (&ad[..ad.len() - 2], &bd[..bd.len() - 2]);
    let batch_dims = if bb.is_empty() {
        ba.to_vec()
    } else if ba.is_empty() || ba == bb {
        bb.to_vec()
    } else {
        return Err(Error::ShapeMismatch { op: "matmul", expected: format!("batch dims {ba:?}"), got: format!("{bb:?}") });
    };
    let batch: usize = batch_dims.iter().product();
    let mut out = batch_dims;
    out.extend([m, n]);
    let a_stride = if ba.is_empty() { 0 } else { m * ka };
    let b_stride = if bb.is_empty() { 0 } else { ka * n };
    let mut d = MatmulDims { batch, m, n, k: ka, trans_a: ta, trans_b: tb, a_stride, b_stride };
    // A shared B under a plain A: fold the batch into the rows (one GEMM).
    if b_stride == 0 && !ta && batch > 1 {
        d = MatmulDims { batch: 1, m: batch * m, a_stride: 0, ..d };
    }
    Ok(Plan { d, out })
}

/// `op(a)·op(b)` where `op` transposes the last two dims when its flag is set.
/// Under autocast (f16/bf16) f32 or half operands are multiplied in the
/// half type, giving a half result.
pub fn matmul_t(a: &Tensor, b: &Tensor, trans_a: bool, trans_b: bool) -> Result<Tensor> {
    if let Some(y) = super::autocast::matmul(a, b, trans_a, trans_b)? {
        return Ok(y);
    }
    same_kind("matmul", a, b)?;
    let p = plan(a, b, trans_a, trans_b)?;
    let y = match (&*a.storage(), &*b.storage()) {
        (Storage::Cpu(x), Storage::Cpu(y)) => Storage::Cpu(k::matmul(&p.d, x, y)?),
        (Storage::Cuda(x), Storage::Cuda(y)) => Storage::Cuda(cuda::blas::matmul(&p.d, x, y)?),
        _ => return Err(mixed("matmul")),
    };
    let y = out_storage(y, p.out);
    let (ad, bd) = (a.detach(), b.detach());
    Ok(record("matmul", &[a, b], y, vec![ad.clone(), bd.clone()], move |g, needs| {
        let ga = if needs[0] {
            let (x, y, tx, ty) = if !trans_a { (g, &bd, false, !trans_b) } else { (&bd, g, trans_b, true) };
            Some(grad_product(0, x, y, tx, ty, None, ad.shape())?)
        } else {
            None
        };
        let gb = if needs[1] {
            Some(if bd.rank() == 2 && ad.rank() > 2 && !trans_a {
                // Shared weight: one GEMM over all batch·M rows sums over the
                // batch inside the product: (batch·M, K)ᵀ·(batch·M, N), or
                // for a transposed weight (linear's) its transpose
                // (batch·M, N)ᵀ·(batch·M, K), instead of a product per batch
                // element and a sum of their copies.
                let kk = ad.dims()[ad.rank() - 1];
                let rows = ad.elem_count() / kk.max(1);
                let a2 = ad.reshaped(Shape::from([rows, kk]), false);
                let g2 = g.reshaped(Shape::from([rows, g.dims()[g.rank() - 1]]), false);
                let gb = if trans_b { matmul_t(&g2, &a2, true, false)? } else { matmul_t(&a2, &g2, true, false)? };
                reduce_batch(gb, bd.shape())?
            } else {
                let (x, y, tx, ty) = if !trans_b { (&ad, g, !trans_a, false) } else { (g, &ad, true, trans_a) };
                grad_product(1, x, y, tx, ty, None, bd.shape())?
            })
        } else {
            None
        };
        Ok(vec![ga, gb])
    }))
}

/// Sums a batched gradient over its batch dims when the operand was shared.
pub(super) fn reduce_batch(g: Tensor, shape: &Shape) -> Result<Tensor> {
    if g.shape() == shape {
        return Ok(g);
    }
    let lead = g.rank() - shape.rank();
    let dims: Vec<isize> = (0..lead as isize).collect();
    super::sum(&g, &dims, false)
}

/// `a·b` (no transposes).
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    matmul_t(a, b, false, false)
}

/// `x·wᵀ + bias` with `w` of shape (out, in), as `torch.nn.functional.linear`.
/// On the GPU the bias is added in cuBLASLt's epilogue (one call); on the
/// CPU it is a broadcast add after the product.
pub fn linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    if let Some(b) = bias {
        if w.rank() != 2 || b.dims() != [w.dims()[0]] {
            return Err(Error::ShapeMismatch {
                op: "linear",
                expected: format!("w of rank 2 and bias of shape [{}]", w.dims().first().copied().unwrap_or(0)),
                got: format!("w {}, bias {}", w.shape(), b.shape()),
            });
        }
        if let Some(y) = super::autocast::linear(x, w, b)? {
            return Ok(y);
        }
        same_kind("linear", x, b)?;
        if matches!(x.device(), crate::tensor::Device::Cuda(_)) && x.rank() >= 1 {
            return linear_fused(x, w, b);
        }
        // On the CPU the GEMM accumulates into rows that start as the bias.
        if matches!(x.device(), crate::tensor::Device::Cpu) && x.rank() >= 1 && super::autocast_dtype().is_none() {
            return linear_fused(x, w, b);
        }
    }
    let y = matmul_t(x, w, false, true)?;
    match bias {
        Some(b) => super::add(&y, b),
        None => Ok(y),
    }
}

/// `linear`'s product dims for x (…, k) and w (n, k): rows m, n, k and the
/// output's dims (x's with the last one n).
fn linear_dims(x: &Tensor, w: &Tensor) -> Result<(usize, usize, usize, Vec<usize>)> {
    same_kind("linear", x, w)?;
    let (n, k) = (w.dims()[0], w.dims()[1]);
    if x.dims().last() != Some(&k) {
        return Err(Error::ShapeMismatch { op: "linear", expected: format!("input with last dim {k}"), got: format!("{}", x.shape()) });
    }
    let mut out_dims = x.dims().to_vec();
    if let Some(l) = out_dims.last_mut() {
        *l = n;
    }
    Ok((x.elem_count() / k.max(1), n, k, out_dims))
}

/// `linear` with the bias inside the product: on the GPU in the cuBLASLt
/// epilogue, on the CPU as the rows the GEMM accumulates into (no separate
/// broadcast add). Backward: dx = g·w, dw = gᵀ·x over all rows and db = g
/// summed over the rows, on the GPU the last two in one cuBLASLt call
/// (BGRADB epilogue) when both are needed.
fn linear_fused(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (m, n, k, out_dims) = linear_dims(x, w)?;
    let y = match (&*x.storage(), &*w.storage(), &*b.storage()) {
        (Storage::Cpu(xs), Storage::Cpu(ws), Storage::Cpu(bs)) => Storage::Cpu(k::linear_bias(xs, ws, bs, m, n, k)?),
        (Storage::Cuda(xs), Storage::Cuda(ws), Storage::Cuda(bs)) => Storage::Cuda(cuda::blaslt::linear_bias(xs, ws, bs, m, n, k)?),
        _ => return Err(mixed("linear")),
    };
    let y = out_storage(y, out_dims);
    let (xd, wd, bshape) = (x.detach(), w.detach(), b.shape().clone());
    Ok(record("linear", &[x, w, b], y, vec![xd.clone(), wd.clone()], move |g, needs| {
        let g2 = g.reshaped(Shape::from([m, n]), false);
        // dx adds into what x has gathered when autograd offers it (q, k
        // and v read one activation: two adds fewer).
        let gx = if needs[0] { Some(grad_product(0, g, &wd, false, false, None, xd.shape())?) } else { None };
        if needs[1] && needs[2] && matches!(&*g2.storage(), Storage::Cuda(_)) {
            // dW and db from one GEMM: db comes out of its BGRADB epilogue.
            let (dw, db) = match (&*g2.storage(), &*xd.storage()) {
                (Storage::Cuda(gs), Storage::Cuda(xs)) => cuda::blaslt::linear_grad_weight_bias(gs, xs, m, n, k)?,
                _ => return Err(mixed("linear backward")),
            };
            return Ok(vec![gx, Some(out_storage(Storage::Cuda(dw), [n, k])), Some(out_storage(Storage::Cuda(db), bshape.clone()))]);
        }
        let gw = if needs[1] { Some(matmul_t(&g2, &xd.reshaped(Shape::from([m, k]), false), true, false)?) } else { None };
        let gb = if needs[2] { Some(super::sum_to_shape(&g2, &bshape)?) } else { None };
        Ok(vec![gx, gw, gb])
    }))
}
