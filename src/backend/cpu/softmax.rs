//! Softmax and log-softmax over the last dim, numerically stable (the row
//! max is subtracted first), with their backward passes. Layout `(rows, n)`.
//!
//! softmax backward:     gx = y ⊙ (gy − Σ gy⊙y)
//! log_softmax backward: gx = gy − exp(y) · Σ gy

use super::{par_rows, CpuStorage, Float};
use crate::error::Result;
use crate::float_match;
use crate::tensor::DType;

fn softmax_t<T: Float>(x: &[T], n: usize, log: bool) -> Vec<T> {
    let mut out = super::pool::zeroed(x.len());
    par_rows(&mut out, n, |r, o| {
        let row = &x[r * n..(r + 1) * n];
        let m = row.iter().fold(T::neg_infinity(), |a, &b| a.max(b));
        // A row that is all -inf (fully masked) gives NaN, as in PyTorch.
        let mut s = T::zero();
        for (o, &v) in o.iter_mut().zip(row) {
            *o = (v - m).exp();
            s = s + *o;
        }
        if log {
            let ls = s.ln();
            for (o, &v) in o.iter_mut().zip(row) {
                *o = v - m - ls;
            }
        } else {
            let inv = T::one() / s;
            for o in o.iter_mut() {
                *o = *o * inv;
            }
        }
    });
    out
}

/// Softmax over rows of length `n`.
pub fn softmax(x: &CpuStorage, n: usize) -> Result<CpuStorage> {
    if let Some(h) = half(x) {
        return Ok(softmax(&x.to_dtype(DType::F32), n)?.to_dtype(h));
    }
    Ok(float_match!("softmax", x, |x| Float::store(softmax_t(x, n, false))))
}

/// The half type of a half storage: half inputs (autocast's activations)
/// are computed in f32 from their values and the result rounded once, as
/// the GPU's half kernels read half, accumulate in f32 and write half.
fn half(x: &CpuStorage) -> Option<DType> {
    matches!(x.dtype(), DType::F16 | DType::BF16).then(|| x.dtype())
}

/// Log-softmax over rows of length `n`.
pub fn log_softmax(x: &CpuStorage, n: usize) -> Result<CpuStorage> {
    if let Some(h) = half(x) {
        return Ok(log_softmax(&x.to_dtype(DType::F32), n)?.to_dtype(h));
    }
    Ok(float_match!("log_softmax", x, |x| Float::store(softmax_t(x, n, true))))
}

fn backward_t<T: Float>(y: &[T], g: &[T], n: usize, log: bool) -> Vec<T> {
    let mut out = super::pool::zeroed(y.len());
    par_rows(&mut out, n, |r, o| {
        let (yr, gr) = (&y[r * n..(r + 1) * n], &g[r * n..(r + 1) * n]);
        if log {
            let s = gr.iter().fold(T::zero(), |a, &b| a + b);
            for i in 0..n {
                o[i] = gr[i] - yr[i].exp() * s;
            }
        } else {
            let s = gr.iter().zip(yr).fold(T::zero(), |a, (&gg, &yy)| a + gg * yy);
            for i in 0..n {
                o[i] = yr[i] * (gr[i] - s);
            }
        }
    });
    out
}

/// Softmax's backward from its output `y` and output gradient `g`.
pub fn softmax_backward(y: &CpuStorage, g: &CpuStorage, n: usize) -> Result<CpuStorage> {
    if let (Some(h), true) = (half(y), y.dtype() == g.dtype()) {
        return Ok(softmax_backward(&y.to_dtype(DType::F32), &g.to_dtype(DType::F32), n)?.to_dtype(h));
    }
    Ok(float_match!("softmax_backward", (y, g), |y, g| Float::store(backward_t(y, g, n, false))))
}

/// Log-softmax's backward from its output `y` and output gradient `g`.
pub fn log_softmax_backward(y: &CpuStorage, g: &CpuStorage, n: usize) -> Result<CpuStorage> {
    if let (Some(h), true) = (half(y), y.dtype() == g.dtype()) {
        return Ok(log_softmax_backward(&y.to_dtype(DType::F32), &g.to_dtype(DType::F32), n)?.to_dtype(h));
    }
    Ok(float_match!("log_softmax_backward", (y, g), |y, g| Float::store(backward_t(y, g, n, true))))
}
