//! WeNet's LabelSmoothingLoss: KL(q‖softmax(x)) over tokens whose target is
//! not `ignore_index`, divided by the token count (`normalize_length`) or by
//! the batch size.

use super::{cpu, out};
use crate::autograd::record;
use crate::backend::cpu::loss as k;
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

/// `x` (B, L, V) logits, `target` (B, L) i64 with `ignore_index` (WeNet: −1) for padding.
pub fn label_smoothing_loss(x: &Tensor, target: &Tensor, smoothing: f64, ignore_index: i64, normalize_length: bool) -> Result<Tensor> {
    super::expect_rank("label_smoothing_loss", "logits (B, L, V)", x, &[3])?;
    let (b, l, v) = (x.dims()[0], x.dims()[1], x.dims()[2]);
    super::expect_shape("label_smoothing_loss", "target", target, &[b, l])?;
    if target.dtype() != DType::I64 {
        return Err(Error::DTypeMismatch { op: "label_smoothing_loss", expected: DType::I64, got: target.dtype() });
    }
    if !(0.0..1.0).contains(&smoothing) {
        return Err(Error::invalid("label_smoothing_loss", format!("expected 0 <= smoothing < 1, got {smoothing}")));
    }
    let tg = target.to_vec::<i64>()?;
    let want = crate::autograd::needs_grad(&[x]);
    let (total, valid, grad) = k::label_smoothing(cpu("label_smoothing", &x.storage())?, &tg, v, smoothing, ignore_index, want)?;
    let denom = if normalize_length { valid.max(1) } else { b.max(1) } as f64;
    let y = Tensor::scalar(total / denom, x.dtype(), &x.device())?;
    let grad = grad.map(|g| out(g, x.shape().clone()));
    let saved: Vec<Tensor> = grad.iter().cloned().collect();
    Ok(record("label_smoothing_loss", &[x], y, saved, move |g, _| {
        let grad = grad.ok_or_else(|| Error::Autograd("label_smoothing_loss: no gradient was computed in the forward".into()))?;
        Ok(vec![Some(super::mul(&grad, &super::mul_scalar(g, 1.0 / denom)?)?)])
    }))
}
