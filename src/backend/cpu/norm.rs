//! Normalisation kernels.
//!
//! layer_norm over the last dim, layout (rows, n):
//!   y = (x − μ)·r·w + b,  r = 1/√(σ² + eps),  σ² biased
//!   backward: x̂ = (x − μ)·r, ĝ = g·w,
//!   gx = r·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂)),  gw = Σ g·x̂,  gb = Σ g
//!
//! batch_norm over the channel dim of (B, C, T): the same algebra with the
//! statistics per channel over B·T; in eval mode the statistics are the
//! running ones and constant, so gx = g·w·r.

use super::{CpuStorage, Float};
use crate::error::Result;
use crate::float_match;
use crate::tensor::DType;
use rayon::prelude::*;

fn ln_fwd<T: Float>(x: &[T], w: Option<&[T]>, b: Option<&[T]>, n: usize, eps: f64) -> (Vec<T>, Vec<T>, Vec<T>) {
    let rows = x.len() / n.max(1);
    let mut y = super::pool::zeroed(x.len());
    let mut mean = vec![T::zero(); rows];
    let mut rstd = vec![T::zero(); rows];
    y.par_chunks_mut(n.max(1)).zip(mean.par_iter_mut()).zip(rstd.par_iter_mut()).enumerate().with_min_len(64).for_each(|(r, ((yr, m), rs))| {
        let xr = &x[r * n..(r + 1) * n];
        let nn = T::of(n as f64);
        let mu = xr.iter().fold(T::zero(), |a, &v| a + v) / nn;
        let var = xr.iter().fold(T::zero(), |a, &v| a + (v - mu) * (v - mu)) / nn;
        let inv = T::one() / (var + T::of(eps)).sqrt();
        for i in 0..n {
            let mut v = (xr[i] - mu) * inv;
            if let Some(w) = w {
                v = v * w[i];
            }
            if let Some(b) = b {
                v = v + b[i];
            }
            yr[i] = v;
        }
        *m = mu;
        *rs = inv;
    });
    (y, mean, rstd)
}

/// The dtype of layer norm's weight, bias, their gradients and per-row
/// statistics for an input of dtype `x`: f32 for the half types (autocast's
/// half activations are normalised with f32 parameters, in f32), else `x`.
pub fn ln_param_dtype(x: DType) -> DType {
    match x {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

/// Layer norm forward: `(y, mean, rstd)`, the last two per row.
pub fn layer_norm(x: &CpuStorage, w: Option<&CpuStorage>, b: Option<&CpuStorage>, n: usize, eps: f64) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
    if ln_param_dtype(x.dtype()) != x.dtype() {
        // A half input with f32 parameters: computed in f32 from the half
        // values, the output rounded once to the half type (what the GPU's
        // half kernel does, up to the order of its sums).
        let (y, m, r) = layer_norm(&x.to_dtype(DType::F32), w, b, n, eps)?;
        return Ok((y.to_dtype(x.dtype()), m, r));
    }
    let wb = (w.unwrap_or(x), b.unwrap_or(x));
    Ok(float_match!("layer_norm", (x, wb.0, wb.1), |x, wv, bv| {
        let (y, m, r) = ln_fwd(x, w.map(|_| &wv[..]), b.map(|_| &bv[..]), n, eps);
        (Float::store(y), Float::store(m), Float::store(r))
    }))
}

fn ln_bwd<T: Float>(x: &[T], w: Option<&[T]>, mean: &[T], rstd: &[T], g: &[T], n: usize) -> (Vec<T>, Vec<T>, Vec<T>) {
    let mut gx = super::pool::zeroed(x.len());
    gx.par_chunks_mut(n.max(1)).enumerate().with_min_len(64).for_each(|(r, gr)| {
        let (xr, go) = (&x[r * n..(r + 1) * n], &g[r * n..(r + 1) * n]);
        let (mu, inv) = (mean[r], rstd[r]);
        let nn = T::of(n as f64);
        let (mut s1, mut s2) = (T::zero(), T::zero());
        for i in 0..n {
            let gh = go[i] * w.map_or(T::one(), |w| w[i]);
            s1 = s1 + gh;
            s2 = s2 + gh * (xr[i] - mu) * inv;
        }
        let (m1, m2) = (s1 / nn, s2 / nn);
        for i in 0..n {
            let gh = go[i] * w.map_or(T::one(), |w| w[i]);
            let xh = (xr[i] - mu) * inv;
            gr[i] = inv * (gh - m1 - xh * m2);
        }
    });
    let rows = x.len() / n.max(1);
    let (gw, gb) = (0..n)
        .into_par_iter()
        .with_min_len(32)
        .map(|i| {
            let (mut sw, mut sb) = (T::zero(), T::zero());
            for r in 0..rows {
                let xh = (x[r * n + i] - mean[r]) * rstd[r];
                sw = sw + g[r * n + i] * xh;
                sb = sb + g[r * n + i];
            }
            (sw, sb)
        })
        .unzip();
    (gx, gw, gb)
}

/// Layer norm backward: `(gx, gw, gb)` (gw, gb over all rows).
pub fn layer_norm_backward(
    x: &CpuStorage,
    w: Option<&CpuStorage>,
    mean: &CpuStorage,
    rstd: &CpuStorage,
    g: &CpuStorage,
    n: usize,
) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
    if ln_param_dtype(x.dtype()) != x.dtype() {
        let (gx, gw, gb) = layer_norm_backward(&x.to_dtype(DType::F32), w, mean, rstd, &g.to_dtype(DType::F32), n)?;
        return Ok((gx.to_dtype(x.dtype()), gw, gb));
    }
    let wv = w.unwrap_or(x);
    Ok(float_match!("layer_norm_backward", (x, wv, g), |x, wv, g| {
        let (m, r) = (super::slice_as(mean, x)?, super::slice_as(rstd, x)?);
        let (gx, gw, gb) = ln_bwd(x, w.map(|_| &wv[..]), m, r, g, n);
        (Float::store(gx), Float::store(gw), Float::store(gb))
    }))
}

fn bn_stats<T: Float>(x: &[T], b: usize, c: usize, t: usize) -> (Vec<T>, Vec<T>) {
    (0..c)
        .into_par_iter()
        .map(|ch| {
            let cnt = T::of((b * t) as f64);
            let mut s = T::zero();
            for bi in 0..b {
                for &v in &x[(bi * c + ch) * t..(bi * c + ch + 1) * t] {
                    s = s + v;
                }
            }
            let mu = s / cnt;
            let mut q = T::zero();
            for bi in 0..b {
                for &v in &x[(bi * c + ch) * t..(bi * c + ch + 1) * t] {
                    q = q + (v - mu) * (v - mu);
                }
            }
            (mu, q / cnt)
        })
        .unzip()
}

#[allow(clippy::too_many_arguments)]
fn bn_stats_update<T: Float>(x: &[T], rm: &mut [T], rv: &mut [T], b: usize, c: usize, t: usize, eps: f64, momentum: f64, train: bool) -> (Vec<T>, Vec<T>) {
    let inv = |v: T| T::one() / (v + T::of(eps)).sqrt();
    if !train {
        return (rm.to_vec(), rv.iter().map(|&v| inv(v)).collect());
    }
    let (m, v) = bn_stats(x, b, c, t);
    let cnt = (b * t) as f64;
    let (mom, keep, unbias) = (T::of(momentum), T::one() - T::of(momentum), T::of(cnt) / T::of(cnt - 1.0));
    for ch in 0..c {
        rm[ch] = rm[ch] * keep + m[ch] * mom;
        rv[ch] = rv[ch] * keep + v[ch] * unbias * mom;
    }
    let r = v.iter().map(|&v| inv(v)).collect();
    (m, r)
}

/// Batch norm's statistics `(mean, rstd)` per channel of x (B, C, T), in
/// x's parameter dtype ([`ln_param_dtype`]: f32 for half inputs). Training:
/// the batch's mean and 1/√(biased var + eps), and the running statistics
/// move toward the batch's in place (the variance unbiased by N/(N−1)) with
/// weight `momentum`. Eval: the running mean and 1/√(running var + eps).
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_stats(
    x: &CpuStorage,
    run_mean: &mut CpuStorage,
    run_var: &mut CpuStorage,
    b: usize,
    c: usize,
    t: usize,
    eps: f64,
    momentum: f64,
    train: bool,
) -> Result<(CpuStorage, CpuStorage)> {
    let op = "batch_norm";
    if ln_param_dtype(x.dtype()) != x.dtype() {
        return batch_norm_stats(&x.to_dtype(DType::F32), run_mean, run_var, b, c, t, eps, momentum, train);
    }
    for s in [&*run_mean, &*run_var] {
        if s.dtype() != x.dtype() {
            return Err(crate::error::Error::DTypeMismatch { op, expected: x.dtype(), got: s.dtype() });
        }
        if s.len() != c {
            return Err(crate::error::Error::invalid(op, format!("expected running statistics of {c} channels, found {}", s.len())));
        }
    }
    Ok(match (x, run_mean, run_var) {
        (CpuStorage::F32(x), CpuStorage::F32(m), CpuStorage::F32(v)) => {
            let (m, r) = bn_stats_update(x, m, v, b, c, t, eps, momentum, train);
            (Float::store(m), Float::store(r))
        }
        (CpuStorage::F64(x), CpuStorage::F64(m), CpuStorage::F64(v)) => {
            let (m, r) = bn_stats_update(x, m, v, b, c, t, eps, momentum, train);
            (Float::store(m), Float::store(r))
        }
        (x, _, _) => return Err(super::unsupported(op, x.dtype())),
    })
}

fn bn_apply<T: Float>(x: &[T], m: &[T], r: &[T], w: &[T], bias: &[T], c: usize, t: usize) -> Vec<T> {
    let mut y = super::pool::zeroed(x.len());
    super::par_rows(&mut y, t.max(1), |row, yr| {
        let ch = row % c;
        for (i, yv) in yr.iter_mut().enumerate() {
            *yv = (x[row * t + i] - m[ch]) * r[ch] * w[ch] + bias[ch];
        }
    });
    y
}

/// `y = (x − mean[c])·rstd[c]·w[c] + b[c]` over (B, C, T).
/// Half x takes f32 parameters: computed in f32, rounded once to x's type.
pub fn batch_norm_apply(x: &CpuStorage, mean: &CpuStorage, rstd: &CpuStorage, w: &CpuStorage, bias: &CpuStorage, c: usize, t: usize) -> Result<CpuStorage> {
    if ln_param_dtype(x.dtype()) != x.dtype() {
        return Ok(batch_norm_apply(&x.to_dtype(DType::F32), mean, rstd, w, bias, c, t)?.to_dtype(x.dtype()));
    }
    Ok(float_match!("batch_norm", (x, w, bias), |x, w, bias| {
        Float::store(bn_apply(x, super::slice_as(mean, x)?, super::slice_as(rstd, x)?, w, bias, c, t))
    }))
}

#[allow(clippy::too_many_arguments)]
fn bn_bwd<T: Float>(x: &[T], w: &[T], m: &[T], r: &[T], g: &[T], b: usize, c: usize, t: usize, train: bool) -> (Vec<T>, Vec<T>, Vec<T>) {
    let sums: Vec<(T, T)> = (0..c)
        .into_par_iter()
        .map(|ch| {
            let (mut sg, mut sgx) = (T::zero(), T::zero());
            for bi in 0..b {
                for i in 0..t {
                    let k = (bi * c + ch) * t + i;
                    sg = sg + g[k];
                    sgx = sgx + g[k] * (x[k] - m[ch]) * r[ch];
                }
            }
            (sg, sgx)
        })
        .collect();
    let n = T::of((b * t) as f64);
    let mut gx = super::pool::zeroed(x.len());
    super::par_rows(&mut gx, t.max(1), |row, gr| {
        let ch = row % c;
        let (sg, sgx) = sums[ch];
        for (i, gv) in gr.iter_mut().enumerate() {
            let k = row * t + i;
            let xh = (x[k] - m[ch]) * r[ch];
            *gv = if train { w[ch] * r[ch] * (g[k] - sg / n - xh * sgx / n) } else { w[ch] * r[ch] * g[k] };
        }
    });
    let gw = sums.iter().map(|s| s.1).collect();
    let gb = sums.iter().map(|s| s.0).collect();
    (gx, gw, gb)
}

/// Batch norm backward over (B, C, T): `(gx, gw, gb)`, gw and gb in the
/// parameter dtype (half x: f32). With `train` the
/// statistics were the batch's (their gradient flows); else they were constants.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_backward(
    x: &CpuStorage,
    w: &CpuStorage,
    mean: &CpuStorage,
    rstd: &CpuStorage,
    g: &CpuStorage,
    b: usize,
    c: usize,
    t: usize,
    train: bool,
) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
    if ln_param_dtype(x.dtype()) != x.dtype() {
        let (gx, gw, gb) = batch_norm_backward(&x.to_dtype(DType::F32), w, mean, rstd, &g.to_dtype(DType::F32), b, c, t, train)?;
        return Ok((gx.to_dtype(x.dtype()), gw, gb));
    }
    Ok(float_match!("batch_norm_backward", (x, w, g), |x, w, g| {
        let (gx, gw, gb) = bn_bwd(x, w, super::slice_as(mean, x)?, super::slice_as(rstd, x)?, g, b, c, t, train);
        (Float::store(gx), Float::store(gw), Float::store(gb))
    }))
}
