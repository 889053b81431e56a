//! The autoregressive beam search of attention decoding, over any
//! next-token scorer, with WeNet's semantics (`wenet/transformer/search.py`,
//! `attention_beam_search`) and optional CTC prefix scores.
//!
//! Beam search starts from `<sos>`. Every live hypothesis is extended by its
//! `beam_size` most likely next tokens; a hypothesis that has emitted
//! `<eos>` is carried on unchanged at no cost (WeNet's `mask_finished_scores`
//! / `mask_finished_preds`). The `beam_size` best of all candidates survive.
//! A hypothesis ends only when `<eos>` is chosen for it, so `<eos>`'s
//! probability is part of every finished score; the search stops when every
//! survivor has ended or after `max_len` steps (WeNet: the encoder's frame
//! count). The final choice divides each score by `len^length_penalty`
//! (`len` = tokens without `<sos>`/`<eos>`; WeNet's
//! `scores / lengths.pow(length_penalty)`, 0 = plain log-probabilities),
//! and that is the score returned.
//!
//! With a CTC weight `λ > 0` (joint CTC/attention decoding as in Watanabe
//! et al. 2017 and ESPnet; WeNet's `attention` mode has no CTC, λ = 0) a
//! hypothesis `h` scores `(1 − λ)·log p_att(h) + λ·ψ(h)`, ψ its CTC prefix
//! score ([`crate::decode::ctc_prefix`]; after `<eos>`, the whole CTC
//! probability of the tokens). The candidates of each hypothesis are then
//! its `⌈1.5·beam_size⌉` most likely tokens under the decoder (ESPnet's
//! pre-beam), CTC's blank is never a candidate, and the rest is as above.
//! CTC's probability of a sequence falls fast when a spoken word is left
//! out, so λ > 0 removes the deletions a decoder alone makes when it is
//! unsure where it is in the audio (repeated words, a short training run).

use super::ctc_prefix::{CtcPrefixState, CtcRows};
use crate::error::{Error, Result};

/// Scores the next token of a set of live prefixes, keeping whatever state
/// it needs per row (a decoder's per-layer cache).
pub trait StepScorer {
    /// Log-probabilities (rows × V, flat) of the token after each prefix
    /// (`<sos>` first); row r continues the scorer's row r.
    fn step(&mut self, prefixes: &[&[i64]]) -> Result<Vec<f64>>;
    /// Keeps the rows `parents` (repeats allowed) as the next step's rows, in that order.
    fn select(&mut self, parents: &[usize]) -> Result<()>;
}

/// The settings of [`beam_search`].
#[derive(Clone, Copy, Debug)]
pub struct BeamOptions {
    /// Hypotheses kept per step (>= 1).
    pub beam_size: usize,
    /// Final normalisation `score / len^length_penalty` (0: none).
    pub length_penalty: f64,
    /// Steps at most (>= 1).
    pub max_len: usize,
    /// The `<sos>` id.
    pub sos: usize,
    /// The `<eos>` id.
    pub eos: usize,
}

/// A CTC posterior and its weight λ in the joint score.
#[derive(Clone, Copy, Debug)]
pub struct CtcJoint<'a> {
    /// The utterance's CTC log-probabilities.
    pub rows: CtcRows<'a>,
    /// λ in (0, 1].
    pub weight: f64,
}

/// The best hypothesis: tokens (without `<sos>`/`<eos>`) and its final score.
#[derive(Clone, Debug, PartialEq)]
pub struct BeamResult {
    /// Token ids.
    pub tokens: Vec<usize>,
    /// Its score after the length normalisation.
    pub score: f64,
}

/// A prefix (with `<sos>`), its summed decoder log-probability, its CTC
/// state, its joint score, whether it has emitted `<eos>`, and its scorer row while live.
#[derive(Clone)]
struct Live {
    ys: Vec<i64>,
    att: f64,
    ctc: Option<CtcPrefixState>,
    score: f64,
    ended: bool,
    row: usize,
}

/// The `k` largest entries of `row` as (id, value), largest first, lower id first on ties.
pub fn top_k(row: &[f64], k: usize) -> Vec<(usize, f64)> {
    let mut ids: Vec<usize> = (0..row.len()).collect();
    ids.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    ids.into_iter().take(k).map(|i| (i, row[i])).collect()
}

/// The tokens of a prefix (without `<sos>` and anything from `<eos>` on).
pub fn tokens_of(ys: &[i64], eos: i64) -> Vec<usize> {
    ys.iter().skip(1).take_while(|&&t| t != eos).map(|&t| t as usize).collect()
}

/// WeNet's final normalisation: `score / len^length_penalty`.
pub fn normalized(score: f64, len: usize, length_penalty: f64) -> f64 {
    if length_penalty == 0.0 {
        score
    } else {
        score / (len as f64).powf(length_penalty)
    }
}

/// Beam search over `scorer` (see the module docs), with CTC prefix scores when `ctc` is given.
pub fn beam_search(scorer: &mut dyn StepScorer, opts: BeamOptions, ctc: Option<CtcJoint>) -> Result<BeamResult> {
    const OP: &str = "attention_beam_search";
    let BeamOptions { beam_size, length_penalty, max_len, sos, eos } = opts;
    if beam_size == 0 || max_len == 0 {
        return Err(Error::invalid(OP, format!("expected beam_size >= 1 and max_len >= 1, got {beam_size} and {max_len}")));
    }
    if let Some(j) = &ctc {
        j.rows.check()?;
        if !(j.weight > 0.0 && j.weight <= 1.0) || eos >= j.rows.vocab {
            return Err(Error::invalid(
                OP,
                format!("expected a CTC weight in (0, 1] and <eos> {eos} below the CTC vocabulary {}, found weight {}", j.rows.vocab, j.weight),
            ));
        }
    }
    let (sos, eos) = (sos as i64, eos as i64);
    let lambda = ctc.map_or(0.0, |j| j.weight);
    let per_hyp = if ctc.is_some() { beam_size + beam_size.div_ceil(2) } else { beam_size };
    let init_ctc = ctc.map(|j| CtcPrefixState::initial(&j.rows));
    let mut beams = vec![Live { ys: vec![sos], att: 0.0, ctc: init_ctc, score: 0.0, ended: false, row: 0 }];
    for _ in 0..max_len {
        let live: Vec<&[i64]> = beams.iter().filter(|b| !b.ended).map(|b| b.ys.as_slice()).collect();
        if live.is_empty() {
            break;
        }
        // Live hypotheses occupy scorer rows 0..live in beam order.
        let lp = scorer.step(&live)?;
        let v = lp.len() / live.len();
        if v == 0 || lp.len() != live.len() * v || ctc.is_some_and(|j| j.rows.vocab != v) {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: format!("{} rows of next-token log-probabilities (of the CTC vocabulary when joint)", live.len()),
                got: format!("{} values", lp.len()),
            });
        }
        let mut cands: Vec<Live> = Vec::new();
        for b in &beams {
            if b.ended {
                cands.push(b.clone());
                continue;
            }
            let row = &lp[b.row * v..(b.row + 1) * v];
            for (tok, l) in top_k(row, per_hyp) {
                let mut ys = b.ys.clone();
                ys.push(tok as i64);
                let ended = tok as i64 == eos;
                let att = b.att + l;
                let (state, score) = match (&ctc, &b.ctc) {
                    (Some(j), Some(s)) => {
                        if tok == j.rows.blank && !ended {
                            continue;
                        }
                        let (state, psi) = if ended {
                            (s.clone(), s.final_score())
                        } else {
                            let n = s.extend(&j.rows, tok);
                            let psi = n.score;
                            (n, psi)
                        };
                        (Some(state), (1.0 - lambda) * att + lambda * psi)
                    }
                    _ => (None, att),
                };
                cands.push(Live { ys, att, ctc: state, score, ended, row: b.row });
            }
        }
        // Stable: equal scores keep the order of hypothesis, then token rank.
        cands.sort_by(|a, b| b.score.total_cmp(&a.score));
        cands.truncate(beam_size);
        // The survivors still live keep their parent's scorer row, renumbered in beam order.
        let parents: Vec<usize> = cands.iter().filter(|c| !c.ended).map(|c| c.row).collect();
        for (next, c) in cands.iter_mut().filter(|c| !c.ended).enumerate() {
            c.row = next;
        }
        if !parents.is_empty() {
            scorer.select(&parents)?;
        }
        beams = cands;
    }
    let mut best: Option<BeamResult> = None;
    for b in &beams {
        let tokens = tokens_of(&b.ys, eos);
        let score = normalized(b.score, tokens.len(), length_penalty);
        if best.as_ref().is_none_or(|a| score > a.score) {
            best = Some(BeamResult { tokens, score });
        }
    }
    best.ok_or_else(|| Error::invalid(OP, "no hypothesis survived"))
}
