//! The optimizer step every replicated engine shares once its gradients are
//! global: unscale (AMP), clip the global norm, Adam unless a gradient is
//! inf/NaN, clear the gradients; and Adam's state as an [`OptimizerState`].
//! On one GPU the whole sequence is Adam's fused multi-tensor step (a few
//! launches, one read-back); on the CPU it runs tensor by tensor.

use super::{OptimizerState, StepOutcome};
use crate::error::{Error, Result};
use crate::optim::{clip_grad_norm, grad_norm, Adam, FusedOptions, GradScaler};
use crate::tensor::Tensor;

/// Unscale → clip → step unless inf/NaN → zero grads, over gradients that
/// are already the same on every rank (so every rank decides the same).
pub fn replicated_step(params: &[(String, Tensor)], adam: &mut Adam, lr: f64, grad_clip: f64, scaler: Option<&mut GradScaler>) -> Result<StepOutcome> {
    // `params` are Adam's own (every replicated engine builds both from one list).
    let fused = FusedOptions { inv_scale: scaler.as_ref().map(|s| 1.0 / s.scale), max_norm: (grad_clip > 0.0).then_some(grad_clip), ..Default::default() };
    if let Some(out) = adam.fused_step(lr, &fused)? {
        if let Some(s) = scaler {
            s.set_found_inf(out.found_inf);
        }
        adam.zero_grad();
        return Ok(StepOutcome { grad_norm: out.grad_norm, skipped: out.skipped });
    }
    let found_inf = match scaler {
        Some(s) => s.unscale(params)?,
        None => false,
    };
    let norm = if grad_clip > 0.0 { clip_grad_norm(params, grad_clip)? } else { grad_norm(params)? };
    let skipped = found_inf || !norm.is_finite();
    if !skipped {
        adam.step(lr)?;
    }
    adam.zero_grad();
    Ok(StepOutcome { grad_norm: norm, skipped })
}

/// Adam's moments and step count, unsharded.
pub fn adam_state(adam: &Adam) -> OptimizerState {
    OptimizerState { step: adam.step, tensors: adam.state(), meta: Default::default() }
}

/// Restores an unsharded Adam from the one state its job saved.
pub fn load_adam_state(adam: &mut Adam, saved: &[OptimizerState]) -> Result<()> {
    match saved {
        [one] => adam.load_state(&one.tensors, one.step),
        other => Err(Error::Checkpoint {
            path: "optimizer state".into(),
            msg: format!(
                "expected the one optimizer state a replicated engine saves, found {} (sharded states from a ZeRO run cannot resume torch_ddp)",
                other.len()
            ),
        }),
    }
}
