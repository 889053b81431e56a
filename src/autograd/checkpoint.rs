//! Activation checkpointing: run a segment without saving its activations,
//! and re-run it during backward to get its gradients.
//!
//! The default RNG state is captured before the forward and restored for the
//! recompute, so dropout inside the segment draws the same mask (as
//! PyTorch's `preserve_rng_state`); the autocast mode is captured the same
//! way, so the recompute runs in the forward's precision.

use super::{backward_with, is_grad_enabled, no_grad, push_node, with_sub_tape};
use crate::error::{Error, Result};
use crate::tensor::{rng, Tensor};
use std::rc::Rc;

/// Runs `f(inputs)` without recording its internals; during backward it is
/// re-run with recording, and gradients flow to `inputs` and to every
/// parameter `f` uses. Gradients equal the non-checkpointed ones.
pub fn checkpoint<F>(f: F, inputs: &[Tensor]) -> Result<Vec<Tensor>>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>> + 'static,
{
    if !is_grad_enabled() {
        return f(inputs);
    }
    let rng_before = rng::get_state();
    let autocast = crate::ops::autocast_dtype();
    let outs = no_grad(|| f(inputs))?;
    let tracked: Vec<Tensor> = outs.iter().map(|o| o.reshaped(o.shape().clone(), true)).collect();
    let ids = tracked.iter().map(|t| t.id()).collect();
    let saved: Vec<Tensor> = inputs.to_vec();
    let held = saved.clone();
    let f = Rc::new(f);
    let refs: Vec<&Tensor> = inputs.iter().collect();
    push_node(
        "checkpoint",
        &refs,
        ids,
        saved,
        Box::new(move |gouts: &[Option<Tensor>], _needs: &[bool]| {
            let rng_now = rng::get_state();
            rng::set_state(rng_before);
            let r = with_sub_tape(|| {
                let _mode = crate::ops::set_autocast(autocast)?;
                let xs: Vec<Tensor> = held.iter().map(|t| if t.requires_grad() { t.requires_grad_() } else { t.detach() }).collect();
                let outs = f(&xs)?;
                if outs.len() != gouts.len() {
                    return Err(Error::Autograd(format!("checkpoint: the recompute gave {} outputs, the forward {}", outs.len(), gouts.len())));
                }
                let seeds: Vec<(Tensor, Tensor)> =
                    outs.into_iter().zip(gouts.iter()).filter_map(|(o, g)| g.clone().filter(|_| o.requires_grad()).map(|g| (o, g))).collect();
                if !seeds.is_empty() {
                    backward_with(&seeds)?;
                }
                Ok(xs.iter().map(|x| x.grad()).collect())
            });
            rng::set_state(rng_now);
            r
        }),
    );
    Ok(tracked)
}
