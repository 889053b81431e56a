//! Optimizer kernels: the Adam/AdamW update (Kingma & Ba 2015; decoupled
//! weight decay from Loshchilov & Hutter 2019), in f32 master precision:
//!   g' = g + wd·p                     (Adam's L2 form, when not decoupled)
//!   m = β1·m + (1−β1)·g',  v = β2·v + (1−β2)·g'²
//!   p −= lr·(m/(1−β1ᵗ)) / (√(v/(1−β2ᵗ)) + ε)   (+ lr·wd·p first, when decoupled)
//! and the fused unscale-and-check-for-inf of the loss scaler.

use super::{par_chunks, CpuStorage, Float};
use crate::error::{Error, Result};

/// Adam hyper-parameters for one step.
#[derive(Clone, Copy, Debug)]
pub struct AdamStep {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// AdamW (decoupled decay) rather than Adam's L2 term.
    pub decoupled: bool,
    /// The 1-based step count, for bias correction.
    pub t: u64,
}

fn adam_t<T: Float>(p: &mut [T], g: &[T], m: &mut [T], v: &mut [T], h: &AdamStep) {
    let bc1 = 1.0 - h.beta1.powi(h.t as i32);
    let bc2 = 1.0 - h.beta2.powi(h.t as i32);
    let (b1, b2, eps, lr, wd) = (T::of(h.beta1), T::of(h.beta2), T::of(h.eps), T::of(h.lr), T::of(h.weight_decay));
    let (one, ibc1, isbc2) = (T::one(), T::of(1.0 / bc1), T::of(1.0 / bc2.sqrt()));
    for i in 0..p.len() {
        let mut gi = g[i];
        if h.decoupled {
            p[i] = p[i] - lr * wd * p[i];
        } else if h.weight_decay != 0.0 {
            gi = gi + wd * p[i];
        }
        m[i] = b1 * m[i] + (one - b1) * gi;
        v[i] = b2 * v[i] + (one - b2) * gi * gi;
        p[i] = p[i] - lr * (m[i] * ibc1) / (v[i].sqrt() * isbc2 + eps);
    }
}

/// One Adam(W) step in place on the parameter `p` and moments `m`, `v`.
pub fn adam(p: &mut CpuStorage, g: &CpuStorage, m: &mut CpuStorage, v: &mut CpuStorage, h: &AdamStep) -> Result<()> {
    match (p, g, m, v) {
        (CpuStorage::F32(p), CpuStorage::F32(g), CpuStorage::F32(m), CpuStorage::F32(v)) => adam_t(p, g, m, v, h),
        (CpuStorage::F64(p), CpuStorage::F64(g), CpuStorage::F64(m), CpuStorage::F64(v)) => adam_t(p, g, m, v, h),
        (p, g, _, _) => {
            return Err(Error::invalid(
                "adam",
                format!("expected f32 or f64 parameter, gradient and moments of one dtype, got {:?} and {:?}", p.dtype(), g.dtype()),
            ))
        }
    }
    Ok(())
}

/// Multiplies `g` by `inv_scale` and reports whether any element was inf or NaN.
pub fn unscale_and_check(g: &CpuStorage, inv_scale: f64) -> Result<(CpuStorage, bool)> {
    Ok(crate::float_match!("unscale", g, |g| {
        let s = super::of_as(g, inv_scale);
        let mut out = super::zeros_as(g, g.len());
        par_chunks(&mut out, 1 << 14, |st, o| {
            for (i, o) in o.iter_mut().enumerate() {
                *o = g[st + i] * s;
            }
        });
        let bad = out.iter().any(|x| !x.is_finite());
        (Float::store(out), bad)
    }))
}
