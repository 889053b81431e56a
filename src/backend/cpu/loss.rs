//! Label-smoothing loss (Szegedy et al., 2016), as WeNet computes it: KL
//! divergence from the smoothed target q to p = softmax(x), per row of x
//! (N, V), rows whose target is the ignore index skipped:
//!   q_k = ε/(V−1) for k ≠ y, q_y = 1 − ε
//!   loss = Σ_rows Σ_k q_k (log q_k − log p_k) / denom
//!   ∂loss/∂x_j = (p_j − q_j)/denom  (Σ_k q_k = 1)
//! Terms with q_k = 0 contribute 0 (xlogy), so ε = 0 is cross-entropy.

use super::{CpuStorage, Float};
use crate::error::{Error, Result};
use crate::float_match;
use rayon::prelude::*;

/// The summed KL over valid rows, the number of valid rows, and with
/// `want_grad` the gradient of the sum with respect to x.
pub fn label_smoothing(x: &CpuStorage, target: &[i64], v: usize, smoothing: f64, ignore: i64, want_grad: bool) -> Result<(f64, usize, Option<CpuStorage>)> {
    check_targets(target, v, ignore)?;
    Ok(float_match!("label_smoothing_loss", x, |x| {
        let rows = target.len();
        let valid = target.iter().filter(|&&t| t != ignore).count();
        if want_grad {
            let mut grad = super::zeros_as(x, rows * v);
            let kl: Vec<f64> = grad.par_chunks_mut(v).enumerate().map(|(r, g)| row_kl(&x[r * v..(r + 1) * v], target[r], ignore, smoothing, Some(g))).collect();
            (kl.iter().sum(), valid, Some(Float::store(grad)))
        } else {
            let kl: Vec<f64> = (0..rows).into_par_iter().map(|r| row_kl(&x[r * v..(r + 1) * v], target[r], ignore, smoothing, None)).collect();
            (kl.iter().sum(), valid, None)
        }
    }))
}

/// The fused forward (the CPU twin of `label_smoothing_fused_fwd` in
/// cuda/loss.cu): per row, in one pass, the KL with the sums regrouped,
/// C − ε'·(Σ_k x_k − V·lse) − (c − ε')·(x_y − lse), and the log-sum-exp
/// kept for the backward. Returns the summed KL, the valid rows and the
/// per-row log-sum-exp (0 for an ignored row).
pub fn label_smoothing_fused_fwd(x: &CpuStorage, target: &[i64], v: usize, smoothing: f64, ignore: i64) -> Result<(f64, usize, Vec<f64>)> {
    check_targets(target, v, ignore)?;
    Ok(float_match!("label_smoothing_loss", x, |x| {
        let valid = target.iter().filter(|&&t| t != ignore).count();
        let (kl, lse): (Vec<f64>, Vec<f64>) =
            (0..target.len()).into_par_iter().map(|r| fused_row(&x[r * v..(r + 1) * v], target[r], ignore, smoothing)).unzip();
        (kl.iter().sum(), valid, lse)
    }))
}

/// The fused backward: dx = (exp(x − lse) − q)·scale per row (0 for an ignored row).
pub fn label_smoothing_fused_bwd(x: &CpuStorage, target: &[i64], lse: &[f64], v: usize, smoothing: f64, ignore: i64, scale: f64) -> Result<CpuStorage> {
    if lse.len() != target.len() || x.len() != target.len() * v {
        return Err(Error::invalid(
            "label_smoothing_loss backward",
            format!("expected {} logits and {} row sums, got {} and {}", target.len() * v, target.len(), x.len(), lse.len()),
        ));
    }
    Ok(float_match!("label_smoothing_loss", x, |x| Float::store(fused_bwd_rows(x, target, lse, v, smoothing, ignore, scale))))
}

fn fused_bwd_rows<T: Float>(x: &[T], target: &[i64], lse: &[f64], v: usize, smoothing: f64, ignore: i64, scale: f64) -> Vec<T> {
    let off = smoothing / (v as f64 - 1.0);
    let on = 1.0 - smoothing;
    let mut dx = super::zeros_as(x, x.len());
    dx.par_chunks_mut(v).enumerate().for_each(|(r, d)| {
        if target[r] == ignore {
            return;
        }
        for (k, dv) in d.iter_mut().enumerate() {
            let q = if k as i64 == target[r] { on } else { off };
            *dv = T::of(((x[r * v + k].f64() - lse[r]).exp() - q) * scale);
        }
    });
    dx
}

/// The label-smoothing checks every backend shares: a vocabulary of at
/// least 2 and every non-ignored target inside it.
pub fn check_targets(target: &[i64], v: usize, ignore: i64) -> Result<()> {
    if v < 2 {
        return Err(Error::invalid("label_smoothing_loss", format!("expected a vocabulary of at least 2, got {v}")));
    }
    if let Some(&bad) = target.iter().find(|&&t| t != ignore && (t < 0 || t as usize >= v)) {
        return Err(Error::IndexOutOfRange { op: "label_smoothing_loss (target)", index: bad, size: v });
    }
    Ok(())
}

/// One row of the fused forward: (KL, log-sum-exp), (0, 0) for an ignored row.
fn fused_row<T: Float>(xr: &[T], tgt: i64, ignore: i64, smoothing: f64) -> (f64, f64) {
    if tgt == ignore {
        return (0.0, 0.0);
    }
    let v = xr.len();
    let off = smoothing / (v as f64 - 1.0);
    let on = 1.0 - smoothing;
    let qlogq = |q: f64| if q > 0.0 { q * q.ln() } else { 0.0 };
    let c = (v - 1) as f64 * qlogq(off) + qlogq(on);
    let (mut m, mut s, mut sx) = (f64::NEG_INFINITY, 0.0f64, 0.0f64);
    for &b in xr {
        let xv = b.f64();
        sx += xv;
        if xv > m {
            s = s * (m - xv).exp() + 1.0;
            m = xv;
        } else {
            s += (xv - m).exp();
        }
    }
    let lse = m + s.ln();
    let xy = xr[tgt as usize].f64();
    (c - off * (sx - v as f64 * lse) - (on - off) * (xy - lse), lse)
}

/// KL(q‖softmax(x)) of one row (0 for an ignored row), and its gradient.
fn row_kl<T: Float>(xr: &[T], tgt: i64, ignore: i64, smoothing: f64, g: Option<&mut [T]>) -> f64 {
    let v = xr.len();
    if tgt == ignore {
        if let Some(g) = g {
            g.iter_mut().for_each(|x| *x = T::zero());
        }
        return 0.0;
    }
    let off = smoothing / (v as f64 - 1.0);
    let on = 1.0 - smoothing;
    let q = |k: usize| if k as i64 == tgt { on } else { off };
    let qlogq = |q: f64| if q > 0.0 { q * q.ln() } else { 0.0 };
    let m = xr.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b.f64()));
    let s: f64 = xr.iter().map(|&b| (b.f64() - m).exp()).sum();
    let lse = m + s.ln();
    let mut kl = 0.0;
    for (k, &xv) in xr.iter().enumerate() {
        kl += qlogq(q(k)) - q(k) * (xv.f64() - lse);
    }
    if let Some(g) = g {
        for (k, gv) in g.iter_mut().enumerate() {
            *gv = T::of((xr[k].f64() - lse).exp() - q(k));
        }
    }
    kl
}

/// 1.0 for each row of x (rows, v) whose argmax (the first largest value; a
/// NaN never wins; index 0 when none exceeds −∞) equals its target, else 0;
/// 0 for a row whose target is `ignore`.
pub fn token_hits(x: &CpuStorage, target: &[i64], v: usize, ignore: i64) -> Result<Vec<f64>> {
    if x.len() != target.len() * v {
        return Err(Error::invalid("token_accuracy", format!("expected {} logits for {} rows of {v}, got {}", target.len() * v, target.len(), x.len())));
    }
    Ok(float_match!("token_accuracy", x, |x| {
        target
            .iter()
            .enumerate()
            .map(|(r, &t)| {
                let row = &x[r * v..(r + 1) * v];
                let arg = row.iter().enumerate().fold((0, f64::NEG_INFINITY), |m, (i, &e)| if e.f64() > m.1 { (i, e.f64()) } else { m }).0;
                if t != ignore && arg as i64 == t {
                    1.0
                } else {
                    0.0
                }
            })
            .collect()
    }))
}
