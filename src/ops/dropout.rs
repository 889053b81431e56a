//! Inverted dropout: `y = x·m/(1−p)` with `m ~ Bernoulli(1−p)` drawn from the
//! thread's default counter-based generator (so a recompute after restoring
//! its state draws the same mask). The scaled mask is saved for backward.

use super::out;
use crate::autograd::record;
use crate::backend::cpu::CpuStorage;
use crate::error::{Error, Result};
use crate::tensor::{rng, Tensor};

/// Dropout with probability `p`; the identity when not `training` or p = 0.
pub fn dropout(x: &Tensor, p: f64, training: bool) -> Result<Tensor> {
    if !(0.0..=1.0).contains(&p) {
        return Err(Error::invalid("dropout", format!("expected 0 <= p <= 1, got {p}")));
    }
    if !training || p == 0.0 {
        return Ok(x.clone());
    }
    let keep = rng::with_default(|r| r.bernoulli(x.elem_count(), 1.0 - p));
    let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
    let m: Vec<f64> = keep.iter().map(|&k| if k { scale } else { 0.0 }).collect();
    let mask = out(CpuStorage::F64(m).to_dtype(x.dtype()), x.shape().clone());
    let y = crate::autograd::no_grad(|| super::mul(x, &mask))?;
    Ok(record("dropout", &[x], y, vec![mask.clone()], move |g, _| Ok(vec![Some(super::mul(g, &mask)?)])))
}
