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

/// Where each row's mask bytes are in a u8 mask broadcast to `(rows, n)`:
/// row `r` (row-major over `dims`, the leading dims of the scores) starts
/// at Σ coord_d(r)·`strides[d]` (0 along a broadcast dim), and its bytes
/// step by `step` (0 or 1) along the row. The GPU kernel gets the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MaskRows {
    /// The leading (row) dims of the scores.
    pub dims: Vec<usize>,
    /// The mask's stride along each of `dims`.
    pub strides: Vec<usize>,
    /// The mask's stride along the row (0 when broadcast).
    pub step: usize,
}

impl MaskRows {
    /// The offset of row `r`'s first mask byte.
    pub fn offset(&self, mut r: usize) -> usize {
        let mut off = 0;
        for (&d, &s) in self.dims.iter().zip(&self.strides).rev() {
            off += (r % d) * s;
            r /= d;
        }
        off
    }

    /// Checks that the layout covers `rows` rows of length `n` inside a mask of `len` bytes.
    pub fn check(&self, op: &'static str, rows: usize, n: usize, len: usize) -> Result<()> {
        let covered: usize = self.dims.iter().product();
        if covered != rows || self.strides.len() != self.dims.len() {
            return Err(crate::error::Error::ShapeMismatch {
                op,
                expected: format!("a mask layout over {rows} rows"),
                got: format!("one over dims {:?} with strides {:?}", self.dims, self.strides),
            });
        }
        if rows > 0 && n > 0 {
            // The last row has every coordinate at its largest: the largest offset.
            let last = self.offset(rows - 1) + (n - 1) * self.step;
            if last >= len {
                return Err(crate::error::Error::ShapeMismatch { op, expected: format!("a mask of more than {last} bytes"), got: format!("{len} bytes") });
            }
        }
        Ok(())
    }
}

fn masked_t<T: Float>(x: &[T], n: usize, mask: &[u8], rows: &MaskRows) -> Vec<T> {
    let mut out = super::pool::zeroed(x.len());
    par_rows(&mut out, n, |r, o| {
        let row = &x[r * n..(r + 1) * n];
        let m0 = rows.offset(r);
        let on = |i: usize| mask[m0 + i * rows.step] == 0;
        let m = (0..n).filter(|&i| on(i)).fold(T::neg_infinity(), |a, i| a.max(row[i]));
        // Every element masked: the row is zeros (never NaN).
        if m == T::neg_infinity() {
            o.iter_mut().for_each(|v| *v = T::zero());
            return;
        }
        let mut s = T::zero();
        for i in 0..n {
            o[i] = if on(i) { (row[i] - m).exp() } else { T::zero() };
            s = s + o[i];
        }
        let inv = T::one() / s;
        for v in o.iter_mut() {
            *v = *v * inv;
        }
    });
    out
}

/// Softmax over rows of length `n` of the elements whose mask byte is 0
/// (the mask laid out over the rows as `rows` says); masked elements are
/// 0 and a fully masked row is all zeros. Its backward is
/// [`softmax_backward`] (masked outputs are 0, so their gradient is 0).
pub fn masked_softmax(x: &CpuStorage, n: usize, mask: &[u8], rows: &MaskRows) -> Result<CpuStorage> {
    rows.check("masked_softmax", if n == 0 { 0 } else { x.len() / n }, n, mask.len())?;
    if let Some(h) = half(x) {
        return Ok(masked_softmax(&x.to_dtype(DType::F32), n, mask, rows)?.to_dtype(h));
    }
    Ok(float_match!("masked_softmax", x, |x| Float::store(masked_t(x, n, mask, rows))))
}
