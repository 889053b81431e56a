//! WeNet's LabelSmoothingLoss: KL(q‖softmax(x)) over tokens whose target is
//! not `ignore_index`, divided by the token count (`normalize_length`) or by
//! the batch size.
//!
//! Two implementations, chosen by the fusion switch's `loss` family
//! (src/ops/fusion.rs): the reference writes the gradient p − q in the
//! forward and scales it in the backward; the fused one keeps only each
//! row's log-sum-exp and computes the gradient in its backward kernel
//! (one read of the logits forward, one read and one write backward).

use super::out_storage;
use crate::autograd::record;
use crate::backend::cpu::loss as k;
use crate::backend::{cuda, Storage};
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

/// `x` (B, L, V) logits, `target` (B, L) i64 with `ignore_index` (WeNet: −1)
/// for padding: the fused kernels when the fusion switch has `loss` on,
/// the reference otherwise.
pub fn label_smoothing_loss(x: &Tensor, target: &Tensor, smoothing: f64, ignore_index: i64, normalize_length: bool) -> Result<Tensor> {
    if super::fusion::enabled(super::fusion::Fusion::Loss) {
        label_smoothing_loss_fused(x, target, smoothing, ignore_index, normalize_length)
    } else {
        label_smoothing_loss_reference(x, target, smoothing, ignore_index, normalize_length)
    }
}

/// The arguments' checks; returns (B, V) and the targets on the host.
fn check(x: &Tensor, target: &Tensor, smoothing: f64) -> Result<(usize, usize, Vec<i64>)> {
    super::expect_rank("label_smoothing_loss", "logits (B, L, V)", x, &[3])?;
    let (b, l, v) = (x.dims()[0], x.dims()[1], x.dims()[2]);
    super::expect_shape("label_smoothing_loss", "target", target, &[b, l])?;
    if target.dtype() != DType::I64 {
        return Err(Error::DTypeMismatch { op: "label_smoothing_loss", expected: DType::I64, got: target.dtype() });
    }
    if !(0.0..1.0).contains(&smoothing) {
        return Err(Error::invalid("label_smoothing_loss", format!("expected 0 <= smoothing < 1, got {smoothing}")));
    }
    Ok((b, v, target.to_vec::<i64>()?))
}

/// The reference label-smoothing loss: the gradient written by the forward.
pub fn label_smoothing_loss_reference(x: &Tensor, target: &Tensor, smoothing: f64, ignore_index: i64, normalize_length: bool) -> Result<Tensor> {
    if is_half(x) {
        // The composition works in f32 (autocast's loss over half logits).
        return label_smoothing_loss_reference(&super::widen_half(x)?, target, smoothing, ignore_index, normalize_length);
    }
    let (b, v, tg) = check(x, target, smoothing)?;
    let want = crate::autograd::needs_grad(&[x]);
    // The loss: the rows' KL summed in row order over the denominator, in
    // x's dtype; on a GPU the sum runs there and nothing is read back.
    let (y, denom, grad) = match &*x.storage() {
        Storage::Cpu(c) => {
            let (t, n, g) = k::label_smoothing(c, &tg, v, smoothing, ignore_index, want)?;
            let denom = denominator(normalize_length, n, b);
            (Tensor::scalar(t / denom, x.dtype(), &x.device())?, denom, g.map(Storage::Cpu))
        }
        Storage::Cuda(c) => {
            let (rows, n, g) = cuda::loss::label_smoothing(c, &tg, v, smoothing, ignore_index, want)?;
            let denom = denominator(normalize_length, n, b);
            (out_storage(Storage::Cuda(cuda::loss::rows_total(&rows, x.dtype(), denom)?), ()), denom, g.map(Storage::Cuda))
        }
    };
    let grad = grad.map(|g| out_storage(g, x.shape().clone()));
    let saved: Vec<Tensor> = grad.iter().cloned().collect();
    Ok(record("label_smoothing_loss", &[x], y, saved, move |g, _| {
        let grad = grad.ok_or_else(|| Error::Autograd("label_smoothing_loss: no gradient was computed in the forward".into()))?;
        Ok(vec![Some(super::mul(&grad, &super::mul_scalar(g, 1.0 / denom)?)?)])
    }))
}

/// WeNet's denominator: the valid tokens (`normalize_length`) or the batch size, at least 1.
fn denominator(normalize_length: bool, valid: usize, batch: usize) -> f64 {
    (if normalize_length { valid.max(1) } else { batch.max(1) }) as f64
}

/// The fused label-smoothing loss: the forward keeps each row's
/// log-sum-exp, the backward writes (p − q)·g/denom in one kernel.
pub fn label_smoothing_loss_fused(x: &Tensor, target: &Tensor, smoothing: f64, ignore_index: i64, normalize_length: bool) -> Result<Tensor> {
    if is_half(x) && x.device() == crate::tensor::Device::Cpu {
        // The CPU has no half arithmetic: its f32 copy.
        return label_smoothing_loss_fused(&super::widen_half(x)?, target, smoothing, ignore_index, normalize_length);
    }
    let (b, v, tg) = check(x, target, smoothing)?;
    enum Saved {
        Cpu(Vec<f64>),
        Cuda(cuda::loss::LabelSmoothingSaved),
    }
    let (y, denom, saved) = match &*x.storage() {
        Storage::Cpu(c) => {
            let (t, n, lse) = k::label_smoothing_fused_fwd(c, &tg, v, smoothing, ignore_index)?;
            let denom = denominator(normalize_length, n, b);
            (Tensor::scalar(t / denom, x.dtype(), &x.device())?, denom, Saved::Cpu(lse))
        }
        Storage::Cuda(c) => {
            let (rows, n, saved) = cuda::loss::label_smoothing_fused_fwd(c, &tg, v, smoothing, ignore_index)?;
            let denom = denominator(normalize_length, n, b);
            // Half logits give an f32 loss (their gradient comes back in their dtype).
            (out_storage(Storage::Cuda(cuda::loss::rows_total(&rows, cuda::loss::loss_dtype(x.dtype()), denom)?), ()), denom, Saved::Cuda(saved))
        }
    };
    let xs = x.clone();
    Ok(record("label_smoothing_loss_fused", &[x], y, vec![x.clone()], move |g, _| {
        let x = &xs;
        let dx = match (&*x.storage(), &*g.storage(), &saved) {
            (Storage::Cpu(xc), Storage::Cpu(_), Saved::Cpu(lse)) => {
                let scale = g.to_scalar()? / denom;
                Storage::Cpu(k::label_smoothing_fused_bwd(xc, &tg, lse, v, smoothing, ignore_index, scale)?)
            }
            (Storage::Cuda(xc), Storage::Cuda(gc), Saved::Cuda(s)) => {
                Storage::Cuda(cuda::loss::label_smoothing_fused_bwd(xc, s, gc, v, smoothing, ignore_index, 1.0 / denom)?)
            }
            _ => return Err(super::mixed("label_smoothing_loss_fused backward")),
        };
        Ok(vec![Some(out_storage(dx, x.shape().clone()))])
    }))
}

/// Whether `x` holds f16/bf16 logits.
fn is_half(x: &Tensor) -> bool {
    matches!(x.dtype(), DType::F16 | DType::BF16)
}
