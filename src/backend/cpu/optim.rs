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

/// One chunk of the update as a [`super::SimdLoop`]: the parameter,
/// gradient and moments zipped (no bounds checks), so the loop vectorises
/// (√ and ÷ are IEEE-exact in every width: the same results as one element
/// at a time).
struct AdamChunk<'a, T> {
    p: &'a mut [T],
    g: &'a [T],
    m: &'a mut [T],
    v: &'a mut [T],
    k: AdamConsts<T>,
}

#[derive(Clone, Copy)]
struct AdamConsts<T> {
    b1: T,
    b2: T,
    eps: T,
    lr: T,
    wd: T,
    ibc1: T,
    isbc2: T,
    decoupled: bool,
    l2: bool,
}

impl<T: Float> super::SimdLoop for AdamChunk<'_, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let k = self.k;
        let one = T::one();
        for (((p, &g), m), v) in self.p.iter_mut().zip(self.g).zip(self.m.iter_mut()).zip(self.v.iter_mut()) {
            let mut gi = g;
            if k.decoupled {
                *p = *p - k.lr * k.wd * *p;
            } else if k.l2 {
                gi = gi + k.wd * *p;
            }
            *m = k.b1 * *m + (one - k.b1) * gi;
            *v = k.b2 * *v + (one - k.b2) * gi * gi;
            *p = *p - k.lr * (*m * k.ibc1) / (v.sqrt() * k.isbc2 + k.eps);
        }
    }
}

/// Elements per parallel task of the update.
const ADAM_CHUNK: usize = 1 << 14;

fn adam_t<T: Float>(p: &mut [T], g: &[T], m: &mut [T], v: &mut [T], h: &AdamStep) {
    use rayon::prelude::*;
    let bc1 = 1.0 - h.beta1.powi(h.t as i32);
    let bc2 = 1.0 - h.beta2.powi(h.t as i32);
    let k = AdamConsts {
        b1: T::of(h.beta1),
        b2: T::of(h.beta2),
        eps: T::of(h.eps),
        lr: T::of(h.lr),
        wd: T::of(h.weight_decay),
        ibc1: T::of(1.0 / bc1),
        isbc2: T::of(1.0 / bc2.sqrt()),
        decoupled: h.decoupled,
        l2: h.weight_decay != 0.0,
    };
    if p.len() < super::PAR_THRESHOLD {
        super::simd(AdamChunk { p, g, m, v, k });
        return;
    }
    // The serial update over every parameter was a step's longest single-threaded stretch.
    p.par_chunks_mut(ADAM_CHUNK)
        .zip(g.par_chunks(ADAM_CHUNK))
        .zip(m.par_chunks_mut(ADAM_CHUNK))
        .zip(v.par_chunks_mut(ADAM_CHUNK))
        .for_each(|(((p, g), m), v)| super::simd(AdamChunk { p, g, m, v, k }));
}

/// One Adam(W) step in place on the parameter `p` and moments `m`, `v`.
pub fn adam(p: &mut CpuStorage, g: &CpuStorage, m: &mut CpuStorage, v: &mut CpuStorage, h: &AdamStep) -> Result<()> {
    if g.len() != p.len() || m.len() != p.len() || v.len() != p.len() {
        return Err(Error::invalid(
            "adam",
            format!("expected gradient and moments of the parameter's {} elements, got {}, {} and {}", p.len(), g.len(), m.len(), v.len()),
        ));
    }
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
