//! Scaled matrix products: `alpha·op(a)·op(b)` and the scaled sum of two
//! products `alpha·(op(a1)·op(b1) + op(a2)·op(b2))`, with the scale inside
//! the GEMM (cuBLAS's alpha) and the second product accumulated into the
//! first (beta = 1): attention's `q·kᵀ/√d_k` and the relative-position
//! scores take one GEMM per product and no scale or add launches.
//!
//! Backward: each product's operands get `alpha·dC·op(B)ᵀ` and
//! `alpha·op(A)ᵀ·dC` as in `matmul_t`, the alpha again inside the GEMM.
//! Under autocast the operands are made half as `matmul_t`'s are
//! (`autocast::half_of`, a half result; the CPU's emulation widens them,
//! multiplies in f32 and rounds the result through half once). On a GPU a
//! half pair rounds the first product to half before the second is added
//! (C is stored in half between the two GEMMs).

use super::matmul::{plan, reduce_batch};
use super::{mixed, out_storage, same_kind, to_dtype};
use crate::autograd::record;
use crate::backend::cpu::matmul as k;
use crate::backend::{cuda, Storage};
use crate::error::{Error, Result};
use crate::tensor::{DType, Device, Shape, Tensor};

/// `alpha·op(a)·op(b)`, `op` transposing the last two dims when its flag is
/// set, with the scale in the GEMM (as `matmul_t` otherwise, autocast too).
pub fn matmul_scaled(a: &Tensor, b: &Tensor, trans_a: bool, trans_b: bool, alpha: f64) -> Result<Tensor> {
    scaled_sum(&[(a, b)], trans_a, trans_b, alpha)
}

/// `alpha·(op(a1)·op(b1) + op(a2)·op(b2))`: two products of one output
/// shape, the second accumulated into the first by its GEMM (beta = 1).
pub fn matmul_pair_scaled(a1: &Tensor, b1: &Tensor, a2: &Tensor, b2: &Tensor, trans_a: bool, trans_b: bool, alpha: f64) -> Result<Tensor> {
    scaled_sum(&[(a1, b1), (a2, b2)], trans_a, trans_b, alpha)
}

/// The gradient of input `input` of the running backward, of shape
/// `shape`: the product `alpha·op(a)·op(b)` (`matmul_t` for `alpha` None,
/// `matmul_scaled` else), summed over its batch when the operand was shared.
/// Where the product has the input's shape and autograd offers what the
/// input has gathered so far ([`crate::autograd::take_accumulator`]), the
/// product is added into it by the GEMM (beta 1: one launch where a product
/// and an add took two). Records nothing: backward only.
pub(super) fn grad_product(input: usize, a: &Tensor, b: &Tensor, ta: bool, tb: bool, alpha: Option<f64>, shape: &Shape) -> Result<Tensor> {
    let p = plan(a, b, ta, tb)?;
    if p.out == shape.dims() && super::autocast_dtype().is_none() && a.dtype() == b.dtype() && a.device() == b.device() {
        // The CPU multiplies f32 and f64; a GPU's GEMMs take the half types too.
        let dtype_ok = |d: DType| matches!(d, DType::F32 | DType::F64) || (a.device() != Device::Cpu && matches!(d, DType::F16 | DType::BF16));
        let fits = |t: &Tensor| t.dims() == p.out.as_slice() && t.dtype() == a.dtype() && t.device() == a.device() && dtype_ok(t.dtype());
        if let Some(acc) = crate::autograd::take_accumulator(input, fits) {
            let shape = acc.shape().clone();
            let c = acc.into_sole_storage().map_err(|_| Error::Autograd("an offered gradient is shared with another handle".into()))?;
            let alpha = alpha.unwrap_or(1.0);
            let y = match (&*a.storage(), &*b.storage(), c) {
                (Storage::Cpu(x), Storage::Cpu(y), Storage::Cpu(c)) => Storage::Cpu(k::matmul_scaled(&p.d, x, y, alpha, Some(&c))?),
                (Storage::Cuda(x), Storage::Cuda(y), Storage::Cuda(c)) => Storage::Cuda(cuda::blas::matmul_scaled(&p.d, x, y, alpha, Some(c))?),
                _ => return Err(mixed("matmul (gradient accumulation)")),
            };
            return Ok(out_storage(y, shape));
        }
    }
    let y = match alpha {
        None => super::matmul_t(a, b, ta, tb)?,
        Some(alpha) => matmul_scaled(a, b, ta, tb, alpha)?,
    };
    reduce_batch(y, shape)
}

/// The half type when autocast applies to all these operands, by the rule
/// `matmul_t` follows: autocast is on, every operand is f32 or of its half
/// type, and (on a GPU) at least one is f32.
fn autocast_half(xs: &[&Tensor]) -> Option<DType> {
    let half = super::autocast_dtype()?;
    let ok = xs.iter().all(|t| t.dtype() == DType::F32 || t.dtype() == half);
    let some_f32 = xs.iter().any(|t| t.dtype() == DType::F32);
    (ok && (some_f32 || xs.iter().all(|t| t.device() == Device::Cpu))).then_some(half)
}

fn scaled_sum(terms: &[(&Tensor, &Tensor)], ta: bool, tb: bool, alpha: f64) -> Result<Tensor> {
    let all: Vec<&Tensor> = terms.iter().flat_map(|(a, b)| [*a, *b]).collect();
    if let Some(half) = autocast_half(&all) {
        // The inner product must not autocast again.
        let _off = super::set_autocast(None)?;
        let halves = all.iter().map(|t| super::autocast::half_of(t, half)).collect::<Result<Vec<_>>>()?;
        if halves[0].device() == Device::Cpu {
            let wide = halves.iter().map(|t| to_dtype(t, DType::F32)).collect::<Result<Vec<_>>>()?;
            let pairs: Vec<(&Tensor, &Tensor)> = wide.chunks(2).map(|p| (&p[0], &p[1])).collect();
            let y = scaled_sum(&pairs, ta, tb, alpha)?;
            return to_dtype(&to_dtype(&y, half)?, DType::F32);
        }
        let pairs: Vec<(&Tensor, &Tensor)> = halves.chunks(2).map(|p| (&p[0], &p[1])).collect();
        return scaled_sum(&pairs, ta, tb, alpha);
    }
    for w in all.windows(2) {
        same_kind("matmul_scaled", w[0], w[1])?;
    }
    let plans = terms.iter().map(|(a, b)| plan(a, b, ta, tb)).collect::<Result<Vec<_>>>()?;
    let out = plans[0].out.clone();
    if let Some(p) = plans.iter().find(|p| p.out != out) {
        return Err(Error::ShapeMismatch { op: "matmul_pair_scaled", expected: format!("both products of shape {out:?}"), got: format!("{:?}", p.out) });
    }
    let mut acc: Option<Storage> = None;
    for ((a, b), p) in terms.iter().zip(&plans) {
        let y = match (&*a.storage(), &*b.storage(), acc.take()) {
            (Storage::Cpu(x), Storage::Cpu(y), None) => Storage::Cpu(k::matmul_scaled(&p.d, x, y, alpha, None)?),
            (Storage::Cpu(x), Storage::Cpu(y), Some(Storage::Cpu(c))) => Storage::Cpu(k::matmul_scaled(&p.d, x, y, alpha, Some(&c))?),
            (Storage::Cuda(x), Storage::Cuda(y), None) => Storage::Cuda(cuda::blas::matmul_scaled(&p.d, x, y, alpha, None)?),
            (Storage::Cuda(x), Storage::Cuda(y), Some(Storage::Cuda(c))) => Storage::Cuda(cuda::blas::matmul_scaled(&p.d, x, y, alpha, Some(c))?),
            _ => return Err(mixed("matmul_scaled")),
        };
        acc = Some(y);
    }
    let y = acc.ok_or_else(|| Error::invalid("matmul_scaled", "no product given"))?;
    let y = out_storage(y, out);
    let inputs: Vec<&Tensor> = all.clone();
    let saved: Vec<Tensor> = all.iter().map(|t| t.detach()).collect();
    let keep = saved.clone();
    Ok(record("matmul_scaled", &inputs, y, saved, move |g, needs| {
        let mut grads = Vec::with_capacity(keep.len());
        for (i, pair) in keep.chunks(2).enumerate() {
            let (ga, gb) = product_grads(g, &pair[0], &pair[1], ta, tb, alpha, needs[2 * i], needs[2 * i + 1], 2 * i)?;
            grads.push(ga);
            grads.push(gb);
        }
        Ok(grads)
    }))
}

/// The gradients of `alpha·op(a)·op(b)` from the output gradient `g`, as
/// `matmul_t`'s backward with the alpha inside each GEMM; `a` and `b` are
/// the node's inputs `input` and `input + 1` (for [`grad_product`]).
#[allow(clippy::too_many_arguments)]
fn product_grads(
    g: &Tensor,
    ad: &Tensor,
    bd: &Tensor,
    ta: bool,
    tb: bool,
    alpha: f64,
    need_a: bool,
    need_b: bool,
    input: usize,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let ga = if need_a {
        let (x, y, tx, ty) = if !ta { (g, bd, false, !tb) } else { (bd, g, tb, true) };
        Some(grad_product(input, x, y, tx, ty, Some(alpha), ad.shape())?)
    } else {
        None
    };
    let gb = if need_b {
        Some(if bd.rank() == 2 && ad.rank() > 2 && !ta {
            // A shared 2-D operand: one GEMM over all batch·M rows sums over
            // the batch inside the product (as `matmul_t`).
            let kk = ad.dims()[ad.rank() - 1];
            let rows = ad.elem_count() / kk.max(1);
            let a2 = ad.reshaped(Shape::from([rows, kk]), false);
            let g2 = g.reshaped(Shape::from([rows, g.dims()[g.rank() - 1]]), false);
            let gb = if tb { matmul_scaled(&g2, &a2, true, false, alpha)? } else { matmul_scaled(&a2, &g2, true, false, alpha)? };
            reduce_batch(gb, bd.shape())?
        } else {
            let (x, y, tx, ty) = if !tb { (ad, g, !ta, false) } else { (g, ad, true, ta) };
            grad_product(input + 1, x, y, tx, ty, Some(alpha), bd.shape())?
        })
    } else {
        None
    };
    Ok((ga, gb))
}
