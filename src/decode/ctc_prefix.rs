//! CTC prefix scores for joint CTC/attention beam search (Watanabe et al.,
//! "Hybrid CTC/Attention Architecture for End-to-End Speech Recognition",
//! IEEE JSTSP 2017, Algorithm 2; ESPnet's `CTCPrefixScore`).
//!
//! For a prefix `g` the state holds, per frame `t`, the log-probabilities
//! `rn[t]` / `rb[t]` of every CTC path over frames `0..=t` whose labels are
//! exactly `g` and whose last frame is a non-blank / blank. The prefix score
//! `ψ(h)` of `h = g·c` is the log-probability of all paths whose labels
//! *start* with `h` (any continuation after):
//!
//! - `rn_h[0] = x_0(c)` if `g` is empty, else −∞; `rb_h[0] = −∞`; `ψ = rn_h[0]`;
//! - for `t ≥ 1`: `φ = rb_g[t−1] ⊕ rn_g[t−1]`, or only `rb_g[t−1]` when `c`
//!   repeats the last label of `g` (a repeat needs a blank between);
//!   `rn_h[t] = (rn_h[t−1] ⊕ φ) + x_t(c)`, `rb_h[t] = (rb_h[t−1] ⊕ rn_h[t−1]) + x_t(blank)`,
//!   `ψ ⊕= φ + x_t(c)`;
//! - for `<eos>`: `ψ = rn_g[T−1] ⊕ rb_g[T−1]`, the whole CTC probability of `g`.
//!
//! (`⊕` is log-add.) The empty prefix has `rn = −∞` and `rb[t] = Σ_{τ≤t} x_τ(blank)`.
//! Each extension costs O(T).

use crate::backend::cpu::ctc::log_add;
use crate::error::{Error, Result};

/// One utterance's CTC log-probabilities, T rows of V (after the log-softmax).
#[derive(Clone, Copy, Debug)]
pub struct CtcRows<'a> {
    /// T × V, row-major.
    pub rows: &'a [f32],
    /// Vocabulary size V.
    pub vocab: usize,
    /// The blank id.
    pub blank: usize,
}

impl CtcRows<'_> {
    /// Frames T.
    pub fn frames(&self) -> usize {
        self.rows.len() / self.vocab.max(1)
    }

    fn at(&self, t: usize, k: usize) -> f64 {
        f64::from(self.rows[t * self.vocab + k])
    }

    /// Checks the shape: at least one frame, whole rows, a blank inside the vocabulary.
    pub fn check(&self) -> Result<()> {
        if self.vocab == 0 || self.rows.is_empty() || self.rows.len() % self.vocab != 0 || self.blank >= self.vocab {
            return Err(Error::invalid(
                "ctc_prefix_score",
                format!(
                    "expected T >= 1 rows of {} CTC log-probabilities and a blank below it, found {} values, blank {}",
                    self.vocab,
                    self.rows.len(),
                    self.blank
                ),
            ));
        }
        Ok(())
    }
}

/// The CTC state of one prefix (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct CtcPrefixState {
    /// Paths ending in a non-blank, per frame.
    rn: Vec<f64>,
    /// Paths ending in a blank, per frame.
    rb: Vec<f64>,
    /// The last label of the prefix (None for the empty prefix).
    last: Option<usize>,
    /// ψ of this prefix.
    pub score: f64,
}

impl CtcPrefixState {
    /// The state of the empty prefix (ψ = 0: every path starts with it).
    pub fn initial(x: &CtcRows) -> CtcPrefixState {
        let t_max = x.frames();
        let mut rb = Vec::with_capacity(t_max);
        let mut acc = 0.0;
        for t in 0..t_max {
            acc += x.at(t, x.blank);
            rb.push(acc);
        }
        CtcPrefixState { rn: vec![f64::NEG_INFINITY; t_max], rb, last: None, score: 0.0 }
    }

    /// The whole CTC log-probability of this prefix as a complete label sequence (ψ of `prefix·<eos>`).
    pub fn final_score(&self) -> f64 {
        match (self.rn.last(), self.rb.last()) {
            (Some(&n), Some(&b)) => log_add(n, b),
            _ => f64::NEG_INFINITY,
        }
    }

    /// The state of this prefix extended by the label `c` (not blank, not `<eos>`).
    pub fn extend(&self, x: &CtcRows, c: usize) -> CtcPrefixState {
        let t_max = x.frames();
        let mut rn = vec![f64::NEG_INFINITY; t_max];
        let mut rb = vec![f64::NEG_INFINITY; t_max];
        if self.last.is_none() && t_max > 0 {
            rn[0] = x.at(0, c);
        }
        let mut psi = rn.first().copied().unwrap_or(f64::NEG_INFINITY);
        for t in 1..t_max {
            let phi = if self.last == Some(c) { self.rb[t - 1] } else { log_add(self.rb[t - 1], self.rn[t - 1]) };
            let xc = x.at(t, c);
            rn[t] = log_add(rn[t - 1], phi) + xc;
            rb[t] = log_add(rb[t - 1], rn[t - 1]) + x.at(t, x.blank);
            psi = log_add(psi, phi + xc);
        }
        CtcPrefixState { rn, rb, last: Some(c), score: psi }
    }
}
