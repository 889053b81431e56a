//! CTC loss (Graves et al., ICML 2006) in log space, one sequence per task.
//!
//! Layouts: log_probs (B, T, V); targets (B, S) padded, of which the first
//! `target_lengths[b]` are used. With the extended label l' = (blank, l1,
//! blank, l2, …, blank) of length L' = 2L+1, α and β both include the
//! emission at t, so α_t(s)·β_t(s)/y_t(l'_s) is the probability of all paths
//! through (t, s), and the true partial derivative of nll = −log p is
//!   ∂nll/∂lp[t,k] = −exp(logΣ_{s: l'_s=k} (α_t(s) + β_t(s) − lp[t,k]) + nll).
//! (Unlike PyTorch's kernel this is the derivative with respect to the
//! log-probabilities themselves, so it needs no log_softmax behind it.)
//! The CPU reference computes in f64.
//!
//! A target that no alignment can produce (longer than its input, or with
//! repeats that need more blanks than there are frames) is not an error: α
//! never reaches the last states, so its nll is +∞ and its gradient zero, as
//! `torch.nn.functional.ctc_loss` gives; `ops::ctc_loss` zeroes it under
//! `zero_infinity`. The CUDA kernel shares [`check`] and computes the same.

use super::{CpuStorage, Float};
use crate::error::{Error, Result};
use crate::float_match;
use rayon::prelude::*;

/// log(e^a + e^b) without overflow; −∞ is the identity (log-space addition).
#[inline]
pub fn log_add(a: f64, b: f64) -> f64 {
    if a == f64::NEG_INFINITY {
        return b;
    }
    if b == f64::NEG_INFINITY {
        return a;
    }
    let m = a.max(b);
    m + ((a - m).exp() + (b - m).exp()).ln()
}

/// Sizes and per-sequence lengths of one CTC problem.
#[derive(Clone, Debug)]
pub struct CtcDims {
    pub b: usize,
    pub t: usize,
    pub v: usize,
    pub s: usize,
    pub blank: usize,
}

/// Checks lengths and labels; an error names the sequence and what was wrong.
pub fn check(d: &CtcDims, targets: &[i64], il: &[usize], tl: &[usize]) -> Result<()> {
    if il.len() != d.b || tl.len() != d.b {
        return Err(Error::invalid("ctc_loss", format!("expected {} input and target lengths, got {} and {}", d.b, il.len(), tl.len())));
    }
    if d.blank >= d.v {
        return Err(Error::invalid("ctc_loss", format!("blank id {} is outside the vocabulary of {}", d.blank, d.v)));
    }
    for b in 0..d.b {
        if il[b] > d.t {
            return Err(Error::invalid("ctc_loss", format!("sequence {b}: input length {} exceeds the {} frames of log_probs", il[b], d.t)));
        }
        if tl[b] > d.s {
            return Err(Error::invalid("ctc_loss", format!("sequence {b}: target length {} exceeds the {} columns of targets", tl[b], d.s)));
        }
        let lab = &targets[b * d.s..b * d.s + tl[b]];
        if let Some(&bad) = lab.iter().find(|&&l| l < 0 || l as usize >= d.v) {
            return Err(Error::IndexOutOfRange { op: "ctc_loss (target label)", index: bad, size: d.v });
        }
    }
    Ok(())
}

/// Frames an alignment of `label` needs: one per token plus a blank between
/// each pair of equal neighbours. A sequence whose input is shorter has no
/// alignment: its loss is +∞ (zeroed with its gradient under `zero_infinity`).
pub fn frames_needed(label: &[i64]) -> usize {
    label.len() + label.windows(2).filter(|w| w[0] == w[1]).count()
}

/// How many sequences of a batch have no alignment (input shorter than [`frames_needed`]).
pub fn count_infeasible(d: &CtcDims, targets: &[i64], il: &[usize], tl: &[usize]) -> usize {
    (0..d.b.min(il.len()).min(tl.len())).filter(|&b| il[b] < frames_needed(&targets[b * d.s..b * d.s + tl[b].min(d.s)])).count()
}

/// nll and (optionally) ∂nll/∂lp for one sequence; lp is its (T, V) block.
/// With `lse` (the fused CTC) lp holds logits, y_t(k) = lp[t, k] − lse[t],
/// and the gradient is with respect to the logits: p_t(k) minus the
/// occupation probability, for t < tlen.
fn one<T: Float>(lp: &[T], lse: Option<&[f64]>, v: usize, tlen: usize, lab: &[i64], blank: usize, grad: Option<&mut [T]>) -> f64 {
    let l = lab.len();
    let sl = 2 * l + 1;
    let ext = |s: usize| if s % 2 == 0 { blank } else { lab[s / 2] as usize };
    let at = |t: usize, k: usize| lp[t * v + k].f64() - lse.map_or(0.0, |m| m[t]);
    if tlen == 0 {
        return if l == 0 { 0.0 } else { f64::INFINITY };
    }
    let ninf = f64::NEG_INFINITY;
    let mut alpha = vec![ninf; tlen * sl];
    alpha[0] = at(0, blank);
    if sl > 1 {
        alpha[1] = at(0, ext(1));
    }
    for t in 1..tlen {
        for s in 0..sl {
            let mut a = alpha[(t - 1) * sl + s];
            if s >= 1 {
                a = log_add(a, alpha[(t - 1) * sl + s - 1]);
            }
            if s >= 2 && ext(s) != blank && ext(s) != ext(s - 2) {
                a = log_add(a, alpha[(t - 1) * sl + s - 2]);
            }
            alpha[t * sl + s] = if a == ninf { ninf } else { a + at(t, ext(s)) };
        }
    }
    let last = (tlen - 1) * sl;
    let logp = if sl > 1 { log_add(alpha[last + sl - 1], alpha[last + sl - 2]) } else { alpha[last] };
    let nll = -logp;
    let Some(g) = grad else { return nll };
    for x in g.iter_mut() {
        *x = T::zero();
    }
    if !nll.is_finite() {
        return nll;
    }
    let mut beta = vec![ninf; tlen * sl];
    beta[last + sl - 1] = at(tlen - 1, ext(sl - 1));
    if sl > 1 {
        beta[last + sl - 2] = at(tlen - 1, ext(sl - 2));
    }
    for t in (0..tlen - 1).rev() {
        for s in 0..sl {
            let mut b = beta[(t + 1) * sl + s];
            if s + 1 < sl {
                b = log_add(b, beta[(t + 1) * sl + s + 1]);
            }
            // The mirror of α's skip into s + 2 (a label equal to the blank
            // id makes ext(s) and ext(s + 2) differ in kind, so the test is
            // on the state skipped into, as α's).
            if s + 2 < sl && ext(s + 2) != blank && ext(s) != ext(s + 2) {
                b = log_add(b, beta[(t + 1) * sl + s + 2]);
            }
            beta[t * sl + s] = if b == ninf { ninf } else { b + at(t, ext(s)) };
        }
    }
    let mut acc = vec![ninf; v];
    for t in 0..tlen {
        acc.iter_mut().for_each(|a| *a = ninf);
        for s in 0..sl {
            let k = ext(s);
            acc[k] = log_add(acc[k], alpha[t * sl + s] + beta[t * sl + s]);
        }
        for k in 0..v {
            let occupied = acc[k] != ninf;
            // The reference's unoccupied symbols keep their zero; only the
            // fused gradient (p − occupancy) is written at every symbol.
            if !occupied && lse.is_none() {
                continue;
            }
            let y = at(t, k);
            let p = if lse.is_some() { y.exp() } else { 0.0 };
            g[t * v + k] = T::of(if occupied { p - (acc[k] - y + nll).exp() } else { p });
        }
    }
    nll
}

/// Per-sequence negative log-likelihoods, and with `want_grad` the gradient
/// of each sequence's nll with respect to log_probs (zero past its length).
pub fn ctc_loss(lp: &CpuStorage, targets: &[i64], il: &[usize], tl: &[usize], d: &CtcDims, want_grad: bool) -> Result<(Vec<f64>, Option<CpuStorage>)> {
    ctc_loss_any(lp, targets, il, tl, d, want_grad, false)
}

/// The fused CTC (the CPU twin of `ctc_lse_rows` + `ctc_loss_fused`): the
/// nll from the logits (B, T, V) with the log-softmax folded in (each row's
/// log-sum-exp in f64), and the gradient with respect to the logits.
pub fn ctc_loss_fused(
    logits: &CpuStorage,
    targets: &[i64],
    il: &[usize],
    tl: &[usize],
    d: &CtcDims,
    want_grad: bool,
) -> Result<(Vec<f64>, Option<CpuStorage>)> {
    ctc_loss_any(logits, targets, il, tl, d, want_grad, true)
}

/// log Σ_k exp(x[r, k]) of each row of v, in f64.
fn lse_rows<T: Float>(x: &[T], v: usize) -> Vec<f64> {
    x.par_chunks(v.max(1))
        .map(|row| {
            let m = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b.f64()));
            if m == f64::NEG_INFINITY {
                return m;
            }
            m + row.iter().map(|&b| (b.f64() - m).exp()).sum::<f64>().ln()
        })
        .collect()
}

fn ctc_loss_any(
    lp: &CpuStorage,
    targets: &[i64],
    il: &[usize],
    tl: &[usize],
    d: &CtcDims,
    want_grad: bool,
    fused: bool,
) -> Result<(Vec<f64>, Option<CpuStorage>)> {
    check(d, targets, il, tl)?;
    if lp.len() != d.b * d.t * d.v {
        return Err(Error::invalid("ctc_loss", format!("expected {} values for {d:?}, got {}", d.b * d.t * d.v, lp.len())));
    }
    Ok(float_match!("ctc_loss", lp, |lp| {
        let per = d.t * d.v;
        let lse = if fused { Some(lse_rows(lp, d.v)) } else { None };
        let lse_of = |b: usize| lse.as_deref().map(|m| &m[b * d.t..(b + 1) * d.t]);
        let one_seq = |b: usize, g: Option<&mut [_]>| one(&lp[b * per..(b + 1) * per], lse_of(b), d.v, il[b], &targets[b * d.s..b * d.s + tl[b]], d.blank, g);
        if want_grad {
            let mut grad = vec![Default::default(); d.b * per];
            let nll: Vec<f64> = grad.par_chunks_mut(per.max(1)).enumerate().map(|(b, g)| one_seq(b, Some(g))).collect();
            (nll, Some(Float::store(grad)))
        } else {
            let nll: Vec<f64> = (0..d.b).into_par_iter().map(|b| one_seq(b, None)).collect();
            (nll, None)
        }
    }))
}
