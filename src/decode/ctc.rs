//! CTC decoding of one utterance's frame log-probabilities (T × V, row-major):
//! greedy search and prefix beam search with WeNet's semantics.
//!
//! Prefix beam search keeps, for every prefix, two log probabilities: the
//! total of the alignments that end in blank (`pb`) and of those that end in
//! the prefix's last token (`pnb`). The split is what lets a repeated token
//! either merge with the previous one (after `pnb`) or start a new one (after
//! `pb`). Each frame only the `beam_size` most likely tokens are expanded and
//! only the `beam_size` best prefixes survive.

use std::collections::HashMap;

use crate::backend::cpu::ctc::log_add;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The result of greedy search.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GreedyResult {
    /// Token ids after merging repeats and dropping blanks.
    pub tokens: Vec<usize>,
    /// For each token, the first frame of the run of frames that emitted it.
    pub times: Vec<usize>,
}

/// One hypothesis of prefix beam search.
#[derive(Clone, Debug, PartialEq)]
pub struct Hypothesis {
    /// Token ids.
    pub tokens: Vec<usize>,
    /// Log of the summed probability of every kept alignment that collapses to `tokens`.
    pub log_score: f64,
}

/// Merges consecutive repeats, then drops `blank` (the CTC collapse of one alignment).
pub fn remove_duplicates_and_blank(path: &[usize], blank: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut prev = None;
    for &p in path {
        if Some(p) != prev && p != blank {
            out.push(p);
        }
        prev = Some(p);
    }
    out
}

/// Checks a T × V buffer and returns T.
fn frames(op: &'static str, log_probs: &[f32], vocab: usize, blank: usize) -> Result<usize> {
    if vocab == 0 {
        return Err(Error::invalid(op, "expected a vocabulary of at least 1 token, got 0"));
    }
    if log_probs.len() % vocab != 0 {
        return Err(Error::invalid(op, format!("expected T × {vocab} log-probabilities, got {} (not a multiple of {vocab})", log_probs.len())));
    }
    if blank >= vocab {
        return Err(Error::IndexOutOfRange { op, index: blank as i64, size: vocab });
    }
    // A NaN would silently win or lose every comparison; say where it is instead.
    if let Some(pos) = log_probs.iter().position(|x| x.is_nan()) {
        return Err(Error::invalid(op, format!("expected log-probabilities, found NaN at frame {} token {}", pos / vocab, pos % vocab)));
    }
    Ok(log_probs.len() / vocab)
}

/// Copies a [T, V] tensor of any float dtype to f32 on the host and returns it with V.
fn tensor_rows(op: &'static str, log_probs: &Tensor) -> Result<(Vec<f32>, usize)> {
    let dims = log_probs.dims();
    if dims.len() != 2 {
        return Err(Error::ShapeMismatch { op, expected: "[T, V]".into(), got: format!("{dims:?}") });
    }
    let vocab = dims[1];
    let data = log_probs.to_f64_vec()?.into_iter().map(|x| x as f32).collect();
    Ok((data, vocab))
}

/// Index of the largest value; the first one on ties.
fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (k, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = k;
        }
    }
    best
}

/// Greedy CTC search: arg-max per frame, merge repeats, drop blanks.
pub fn ctc_greedy_search(log_probs: &[f32], vocab: usize, blank: usize) -> Result<GreedyResult> {
    frames("ctc_greedy_search", log_probs, vocab, blank)?;
    let mut tokens = Vec::new();
    let mut times = Vec::new();
    let mut prev = None;
    for (t, row) in log_probs.chunks(vocab).enumerate() {
        let k = argmax(row);
        if Some(k) != prev && k != blank {
            tokens.push(k);
            times.push(t);
        }
        prev = Some(k);
    }
    Ok(GreedyResult { tokens, times })
}

/// [`ctc_greedy_search`] on a [T, V] tensor.
pub fn ctc_greedy_search_tensor(log_probs: &Tensor, blank: usize) -> Result<GreedyResult> {
    let (data, vocab) = tensor_rows("ctc_greedy_search", log_probs)?;
    ctc_greedy_search(&data, vocab, blank)
}

/// A prefix's probabilities: alignments ending in blank, and ending in its last token.
#[derive(Clone, Copy)]
struct Beam {
    pb: f64,
    pnb: f64,
}

impl Beam {
    fn total(&self) -> f64 {
        log_add(self.pb, self.pnb)
    }
}

/// The next frame's prefixes, in first-seen order so that ties sort deterministically.
#[derive(Default)]
struct NextBeams {
    prefixes: Vec<Vec<usize>>,
    beams: Vec<Beam>,
    index: HashMap<Vec<usize>, usize>,
}

impl NextBeams {
    fn entry(&mut self, prefix: Vec<usize>) -> &mut Beam {
        let idx = match self.index.get(&prefix) {
            Some(&i) => i,
            None => {
                let i = self.beams.len();
                self.index.insert(prefix.clone(), i);
                self.prefixes.push(prefix);
                self.beams.push(Beam { pb: f64::NEG_INFINITY, pnb: f64::NEG_INFINITY });
                i
            }
        };
        &mut self.beams[idx]
    }
}

/// The `k` most likely tokens of a frame, most likely first (lower id first on ties).
fn top_k(row: &[f32], k: usize) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..row.len()).collect();
    ids.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    ids.truncate(k);
    ids
}

/// CTC prefix beam search; returns up to `beam_size` hypotheses, best first.
pub fn ctc_prefix_beam_search(log_probs: &[f32], vocab: usize, blank: usize, beam_size: usize) -> Result<Vec<Hypothesis>> {
    const OP: &str = "ctc_prefix_beam_search";
    frames(OP, log_probs, vocab, blank)?;
    if beam_size == 0 {
        return Err(Error::invalid(OP, "expected beam_size >= 1, got 0"));
    }
    let mut hyps: Vec<(Vec<usize>, Beam)> = vec![(Vec::new(), Beam { pb: 0.0, pnb: f64::NEG_INFINITY })];
    for row in log_probs.chunks(vocab) {
        let mut next = NextBeams::default();
        for s in top_k(row, beam_size.min(vocab)) {
            let ps = f64::from(row[s]);
            for (prefix, beam) in &hyps {
                let last = prefix.last().copied();
                if s == blank {
                    // A blank keeps the prefix; every alignment now ends in blank.
                    let e = next.entry(prefix.clone());
                    e.pb = log_add(e.pb, beam.total() + ps);
                } else if Some(s) == last {
                    // The same token again merges with the run that ended in it ...
                    let e = next.entry(prefix.clone());
                    e.pnb = log_add(e.pnb, beam.pnb + ps);
                    // ... or, after a blank, starts a new token.
                    if beam.pb > f64::NEG_INFINITY {
                        let mut longer = prefix.clone();
                        longer.push(s);
                        let e = next.entry(longer);
                        e.pnb = log_add(e.pnb, beam.pb + ps);
                    }
                } else {
                    let mut longer = prefix.clone();
                    longer.push(s);
                    let e = next.entry(longer);
                    e.pnb = log_add(e.pnb, beam.total() + ps);
                }
            }
        }
        let mut ranked: Vec<(Vec<usize>, Beam)> = next
            .prefixes
            .into_iter()
            .zip(next.beams)
            // A prefix no alignment reaches carries no information; drop it.
            .filter(|(_, b)| b.total() > f64::NEG_INFINITY)
            .collect();
        // Stable sort: equal scores keep first-seen order, so results do not depend on hashing.
        ranked.sort_by(|a, b| b.1.total().total_cmp(&a.1.total()));
        ranked.truncate(beam_size);
        hyps = ranked;
    }
    Ok(hyps.into_iter().map(|(tokens, b)| Hypothesis { tokens, log_score: b.total() }).collect())
}

/// [`ctc_prefix_beam_search`] on a [T, V] tensor.
pub fn ctc_prefix_beam_search_tensor(log_probs: &Tensor, blank: usize, beam_size: usize) -> Result<Vec<Hypothesis>> {
    let (data, vocab) = tensor_rows("ctc_prefix_beam_search", log_probs)?;
    ctc_prefix_beam_search(&data, vocab, blank, beam_size)
}
