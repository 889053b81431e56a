//! Inverted dropout: `y = x·m/(1−p)` with `m ~ Bernoulli(1−p)` drawn from the
//! thread's default counter-based generator (so a recompute after restoring
//! its state draws the same mask). The scaled mask is saved for backward.
//! On the GPU the mask is drawn by a kernel from the same (seed, offset,
//! element) Philox words, so it equals the CPU's mask bit for bit.

use crate::autograd::record;
use crate::backend::cpu::CpuStorage;
use crate::backend::cuda::dropout as gpu;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::tensor::{rng, Tensor};

/// The scaled keep mask for `x` on its device, advancing the default generator.
fn mask_like(x: &Tensor, p: f64) -> Result<Tensor> {
    let n = x.elem_count();
    let s = match &*x.storage() {
        Storage::Cpu(_) => {
            let keep = rng::with_default(|r| r.bernoulli(n, 1.0 - p));
            let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
            let m: Vec<f64> = keep.iter().map(|&k| if k { scale } else { 0.0 }).collect();
            Storage::Cpu(CpuStorage::F64(m).to_dtype(x.dtype()))
        }
        Storage::Cuda(g) => {
            let (seed, offset) = rng::with_default(|r| (r.seed, r.advance(n)));
            Storage::Cuda(gpu::dropout_mask(g.device(), x.dtype(), n, seed, offset, p)?)
        }
    };
    Ok(Tensor::from_storage(s, x.shape().clone()))
}

/// Dropout with probability `p`; the identity when not `training` or p = 0.
pub fn dropout(x: &Tensor, p: f64, training: bool) -> Result<Tensor> {
    if !(0.0..=1.0).contains(&p) {
        return Err(Error::invalid("dropout", format!("expected 0 <= p <= 1, got {p}")));
    }
    if !training || p == 0.0 {
        return Ok(x.clone());
    }
    let mask = mask_like(x, p)?;
    let y = crate::autograd::no_grad(|| super::mul(x, &mask))?;
    Ok(record("dropout", &[x], y, vec![mask.clone()], move |g, _| Ok(vec![Some(super::mul(g, &mask)?)])))
}
