//! Decoding with the attention decoder, one utterance at a time, with
//! WeNet's semantics (`wenet/transformer/search.py`).
//!
//! Attention beam search ([`crate::decode::beam`]) steps the decoder one
//! position at a time with its per-layer cache
//! ([`crate::models::DecoderCache`]), so each step computes only the new
//! position.
//!
//! Attention rescoring scores each CTC n-best hypothesis `y` by the decoder:
//! `Σ log p(y_j | <sos> y_<j) + log p(<eos> | <sos> y)`; with a right-to-left
//! decoder and `reverse_weight > 0` the same over the reversed hypothesis is
//! mixed in as `(1 − w)·left + w·right`; the CTC score is then added times
//! `ctc_weight`, and the best total wins (the first on ties).

use crate::decode::beam::{beam_search, tokens_of, top_k, BeamOptions, CtcJoint, StepScorer};
use crate::decode::ctc::Hypothesis;
use crate::error::{Error, Result};
use crate::models::decoder::TransformerDecoder;
use crate::models::decoder_cache::DecoderCache;
use crate::models::AsrModel;
use crate::ops;
use crate::tensor::Tensor;

/// The result of one utterance's attention decoding or rescoring.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionResult {
    /// Token ids, without `<sos>` and `<eos>`.
    pub tokens: Vec<usize>,
    /// The hypothesis' score (see the module docs).
    pub score: f64,
}

/// Checks that `enc_out` is one utterance (1, T, D) with `enc_len <= T`.
fn check_single(op: &'static str, enc_out: &Tensor, enc_len: usize) -> Result<()> {
    if enc_out.rank() != 3 || enc_out.dims()[0] != 1 || enc_len > enc_out.dims()[1] || enc_len == 0 {
        return Err(Error::ShapeMismatch {
            op,
            expected: format!("one encoder output (1, T, D) with 0 < {enc_len} <= T"),
            got: format!("{}", enc_out.shape()),
        });
    }
    Ok(())
}

/// `n` copies of a (1, T, D) encoder output stacked to (n, T, D).
fn repeat_rows(x: &Tensor, n: usize) -> Result<Tensor> {
    if n == 1 {
        return Ok(x.clone());
    }
    let refs: Vec<&Tensor> = std::iter::repeat_n(x, n).collect();
    ops::cat(&refs, 0)
}

/// Decoder log-probabilities of the next token after each prefix (all of one
/// length, `<sos>` first), recomputing every prefix in full: n rows of V.
pub fn next_token_log_probs(model: &AsrModel, enc_out: &Tensor, enc_len: usize, prefixes: &[Vec<i64>]) -> Result<Vec<Vec<f64>>> {
    let n = prefixes.len();
    let l = prefixes.first().map_or(0, Vec::len);
    if l == 0 || prefixes.iter().any(|p| p.len() != l) {
        return Err(Error::invalid("next_token_log_probs", "expected one or more non-empty prefixes of equal length"));
    }
    let flat: Vec<i64> = prefixes.iter().flatten().copied().collect();
    let ys = Tensor::from_vec(flat, [n, l], &enc_out.device())?;
    let mem = repeat_rows(enc_out, n)?;
    let (logits, _) = model.decoder.forward(&mem, &vec![enc_len; n], &ys, &vec![l; n], None)?;
    let v = logits.dims()[2];
    let last = ops::narrow(&logits, 1, l - 1, 1)?;
    let lp = ops::log_softmax(&last)?.to_f64_vec()?;
    Ok(lp.chunks(v).map(<[f64]>::to_vec).collect())
}

/// The left-to-right decoder stepped with its per-layer cache: a [`StepScorer`]
/// whose rows are hypotheses over one utterance's encoder output.
pub struct DecoderScorer<'m> {
    decoder: &'m TransformerDecoder,
    cache: DecoderCache,
    sos: i64,
}

impl<'m> DecoderScorer<'m> {
    /// A scorer over `enc_out` (1, T, D) with `enc_len` valid frames, one row (`<sos>`) to start.
    pub fn new(model: &'m AsrModel, enc_out: &Tensor, enc_len: usize) -> Result<Self> {
        check_single("DecoderScorer", enc_out, enc_len)?;
        let decoder = model.decoder.left();
        let mem = ops::narrow(enc_out, 1, 0, enc_len)?;
        let cache = decoder.init_cache(&mem, &[enc_len])?;
        Ok(DecoderScorer { decoder, cache, sos: model.sos as i64 })
    }
}

impl StepScorer for DecoderScorer<'_> {
    fn step(&mut self, prefixes: &[&[i64]]) -> Result<Vec<f64>> {
        // The cache holds every position but the last of each prefix.
        let last: Vec<i64> = prefixes.iter().map(|p| *p.last().unwrap_or(&self.sos)).collect();
        let logits = self.decoder.forward_step(&last, &mut self.cache)?;
        ops::log_softmax(&logits)?.to_f64_vec()
    }
    fn select(&mut self, parents: &[usize]) -> Result<()> {
        self.cache = self.cache.select(parents)?;
        Ok(())
    }
}

/// Autoregressive beam search with the attention decoder over one
/// utterance's encoder output `enc_out` (1, T, D) of `enc_len` valid frames,
/// for at most `enc_len` steps (WeNet's limit); see [`crate::decode::beam`].
pub fn attention_beam_search(model: &AsrModel, enc_out: &Tensor, enc_len: usize, beam_size: usize, length_penalty: f64) -> Result<AttentionResult> {
    attention_beam_search_max(model, enc_out, enc_len, beam_size, length_penalty, enc_len)
}

/// [`attention_beam_search`] with an explicit step limit `max_len` (at least 1).
pub fn attention_beam_search_max(
    model: &AsrModel,
    enc_out: &Tensor,
    enc_len: usize,
    beam_size: usize,
    length_penalty: f64,
    max_len: usize,
) -> Result<AttentionResult> {
    attention_beam_search_joint(model, enc_out, enc_len, BeamOptions { beam_size, length_penalty, max_len, sos: model.sos, eos: model.eos }, None)
}

/// Attention beam search with the options spelled out and, when `ctc` is
/// given, joint CTC/attention scores (`ctc.rows`: this utterance's `enc_len` CTC rows).
pub fn attention_beam_search_joint(model: &AsrModel, enc_out: &Tensor, enc_len: usize, opts: BeamOptions, ctc: Option<CtcJoint>) -> Result<AttentionResult> {
    let mut scorer = DecoderScorer::new(model, enc_out, enc_len)?;
    let r = beam_search(&mut scorer, opts, ctc)?;
    Ok(AttentionResult { tokens: r.tokens, score: r.score })
}

/// Greedy decoding with the attention decoder, recomputing the whole prefix
/// each step (no cache): the arg-max token each step until `<eos>` or
/// `enc_len` steps (the reference for beam size 1 and for the cache).
pub fn attention_greedy_search(model: &AsrModel, enc_out: &Tensor, enc_len: usize) -> Result<AttentionResult> {
    check_single("attention_greedy_search", enc_out, enc_len)?;
    let (sos, eos) = (model.sos as i64, model.eos as i64);
    let (mut ys, mut score) = (vec![sos], 0.0);
    for _ in 0..enc_len {
        let row = next_token_log_probs(model, enc_out, enc_len, std::slice::from_ref(&ys))?.remove(0);
        let (tok, lp) = top_k(&row, 1)[0];
        ys.push(tok as i64);
        score += lp;
        if tok as i64 == eos {
            break;
        }
    }
    Ok(AttentionResult { tokens: tokens_of(&ys, eos), score })
}

/// Summed log-probability of `hyp` then `<eos>` under `rows` ((len+1) × V,
/// row j predicting token j); `reversed` reads the hypothesis right to left.
pub fn sequence_score(rows: &[f64], vocab: usize, hyp: &[usize], eos: usize, reversed: bool) -> Result<f64> {
    let need = (hyp.len() + 1) * vocab;
    if rows.len() < need || hyp.iter().chain([&eos]).any(|&t| t >= vocab) {
        return Err(Error::ShapeMismatch {
            op: "sequence_score",
            expected: format!("{} rows of {vocab} log-probabilities and token ids < {vocab}", hyp.len() + 1),
            got: format!("{} values, tokens {hyp:?}, eos {eos}", rows.len()),
        });
    }
    let n = hyp.len();
    let mut s = 0.0;
    for j in 0..n {
        let w = if reversed { hyp[n - 1 - j] } else { hyp[j] };
        s += rows[j * vocab + w];
    }
    Ok(s + rows[n * vocab + eos])
}

/// Picks the best of `nbest` given each hypothesis' left-to-right (and
/// optionally right-to-left) decoder rows; returns its index and total score.
pub fn rescore(
    nbest: &[Hypothesis],
    left: &[Vec<f64>],
    right: Option<&[Vec<f64>]>,
    vocab: usize,
    eos: usize,
    ctc_weight: f64,
    reverse_weight: f64,
) -> Result<(usize, f64)> {
    if nbest.is_empty() || left.len() != nbest.len() || right.is_some_and(|r| r.len() != nbest.len()) {
        return Err(Error::invalid(
            "rescore",
            format!(
                "expected decoder rows for each of {} hypotheses (at least one), found {} left and {:?} right",
                nbest.len(),
                left.len(),
                right.map(<[Vec<f64>]>::len)
            ),
        ));
    }
    let mut best = (0, f64::NEG_INFINITY);
    for (i, h) in nbest.iter().enumerate() {
        let mut score = sequence_score(&left[i], vocab, &h.tokens, eos, false)?;
        if let (Some(r), true) = (right, reverse_weight > 0.0) {
            let rs = sequence_score(&r[i], vocab, &h.tokens, eos, true)?;
            score = score * (1.0 - reverse_weight) + rs * reverse_weight;
        }
        score += h.log_score * ctc_weight;
        if score > best.1 {
            best = (i, score);
        }
    }
    Ok(best)
}

/// One (L+1) × V block per row of a (N, L+1, V) tensor, each cut to its hypothesis' `len + 1` rows.
fn per_hyp_rows(log_probs: &Tensor, lens: &[usize]) -> Result<Vec<Vec<f64>>> {
    let (l1, v) = (log_probs.dims()[1], log_probs.dims()[2]);
    let flat = log_probs.to_f64_vec()?;
    Ok(lens.iter().enumerate().map(|(i, &n)| flat[i * l1 * v..(i * l1 + n + 1) * v].to_vec()).collect())
}

/// Attention rescoring of a CTC n-best list over one utterance's encoder output (1, T, D).
pub fn attention_rescoring(
    model: &AsrModel,
    enc_out: &Tensor,
    enc_len: usize,
    nbest: &[Hypothesis],
    ctc_weight: f64,
    reverse_weight: f64,
) -> Result<AttentionResult> {
    check_single("attention_rescoring", enc_out, enc_len)?;
    if nbest.is_empty() {
        return Ok(AttentionResult { tokens: Vec::new(), score: f64::NEG_INFINITY });
    }
    let hyps: Vec<Vec<i64>> = nbest.iter().map(|h| h.tokens.iter().map(|&t| t as i64).collect()).collect();
    let lens: Vec<usize> = nbest.iter().map(|h| h.tokens.len()).collect();
    let mem = repeat_rows(enc_out, nbest.len())?;
    let (left, right) = model.decoder_logits(&mem, &vec![enc_len; nbest.len()], &hyps)?;
    let vocab = left.dims()[2];
    let left = per_hyp_rows(&ops::log_softmax(&left)?, &lens)?;
    let right = match right {
        Some(r) if reverse_weight > 0.0 => Some(per_hyp_rows(&ops::log_softmax(&r)?, &lens)?),
        _ => None,
    };
    let (i, score) = rescore(nbest, &left, right.as_deref(), vocab, model.eos, ctc_weight, reverse_weight)?;
    Ok(AttentionResult { tokens: nbest[i].tokens.clone(), score })
}
