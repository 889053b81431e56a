//! Inverted dropout: `y = x·m/(1−p)` with `m ~ Bernoulli(1−p)` drawn from the
//! thread's default counter-based generator (so a recompute after restoring
//! its state draws the same mask). The scaled mask is saved for backward.
//! On the GPU the mask is drawn by a kernel from the same (seed, offset,
//! element) Philox words, so it equals the CPU's mask bit for bit.

use crate::autograd::record;
use crate::backend::cpu::{pool, CpuStorage};
use crate::backend::cuda::dropout as gpu;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::tensor::{rng, DType, Tensor};

/// The scaled keep mask for `x` on its device, advancing the default generator.
fn mask_like(x: &Tensor, p: f64) -> Result<Tensor> {
    let n = x.elem_count();
    let s = match &*x.storage() {
        Storage::Cpu(_) => {
            let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
            // The mask in the input's float type directly (f32: the f64 scale rounded once, as a conversion would).
            match x.dtype() {
                DType::F32 => {
                    let mut m = pool::zeroed::<f32>(n);
                    rng::with_default(|r| r.bernoulli_into(&mut m, 1.0 - p, scale as f32, 0.0));
                    Storage::Cpu(CpuStorage::F32(m))
                }
                dt => Storage::Cpu(CpuStorage::F64(rng::with_default(|r| r.bernoulli_map(n, 1.0 - p, scale, 0.0))).to_dtype(dt)),
            }
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
