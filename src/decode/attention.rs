//! Decoding with the attention decoder, one utterance at a time, with
//! WeNet's semantics (`wenet/transformer/search.py`, `attention_beam_search`).
//!
//! Beam search starts from `<sos>` and runs the decoder one step at a time
//! with its per-layer cache ([`crate::models::DecoderCache`]), so each step
//! computes only the new position. Every live hypothesis is extended by its
//! `beam_size` most likely next tokens (log-softmax of the decoder's output);
//! a hypothesis that has emitted `<eos>` is carried on unchanged at no cost
//! (WeNet's `mask_finished_scores` / `mask_finished_preds`). The `beam_size`
//! best of all candidates survive. A hypothesis ends only when `<eos>` is
//! chosen for it, so `<eos>`'s probability is part of every finished score;
//! the search stops when every survivor has ended or after `max_len` steps
//! (WeNet: the encoder's frame count). The final choice divides each score
//! by `len^length_penalty` (`len` = tokens without `<sos>`/`<eos>`; WeNet's
//! `scores / lengths.pow(length_penalty)`, 0 = plain log-probabilities).
//!
//! Attention rescoring scores each CTC n-best hypothesis `y` by the decoder:
//! `Σ log p(y_j | <sos> y_<j) + log p(<eos> | <sos> y)`; with a right-to-left
//! decoder and `reverse_weight > 0` the same over the reversed hypothesis is
//! mixed in as `(1 − w)·left + w·right`; the CTC score is then added times
//! `ctc_weight`, and the best total wins (the first on ties).

use crate::decode::ctc::Hypothesis;
use crate::error::{Error, Result};
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

/// The `k` largest entries of `row` as (id, value), largest first, lower id first on ties.
fn top_k(row: &[f64], k: usize) -> Vec<(usize, f64)> {
    let mut ids: Vec<usize> = (0..row.len()).collect();
    ids.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    ids.into_iter().take(k).map(|i| (i, row[i])).collect()
}

/// A prefix (with `<sos>`), its summed log-probability, whether it has
/// emitted `<eos>`, and its row in the decoder cache while it is live.
#[derive(Clone)]
struct Live {
    ys: Vec<i64>,
    score: f64,
    ended: bool,
    row: usize,
}

/// The tokens of a prefix (without `<sos>` and anything from `<eos>` on).
fn tokens_of(ys: &[i64], eos: i64) -> Vec<usize> {
    ys.iter().skip(1).take_while(|&&t| t != eos).map(|&t| t as usize).collect()
}

/// WeNet's final normalisation: `score / len^length_penalty`.
fn normalized(score: f64, len: usize, length_penalty: f64) -> f64 {
    if length_penalty == 0.0 {
        score
    } else {
        score / (len as f64).powf(length_penalty)
    }
}

/// Autoregressive beam search with the attention decoder over one
/// utterance's encoder output `enc_out` (1, T, D) of `enc_len` valid frames,
/// for at most `enc_len` steps (WeNet's limit).
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
    const OP: &str = "attention_beam_search";
    check_single(OP, enc_out, enc_len)?;
    if beam_size == 0 || max_len == 0 {
        return Err(Error::invalid(OP, format!("expected beam_size >= 1 and max_len >= 1, got {beam_size} and {max_len}")));
    }
    let (sos, eos) = (model.sos as i64, model.eos as i64);
    let decoder = model.decoder.left();
    let mem = ops::narrow(enc_out, 1, 0, enc_len)?;
    let mut cache = decoder.init_cache(&mem, &[enc_len])?;
    let mut beams = vec![Live { ys: vec![sos], score: 0.0, ended: false, row: 0 }];
    for _ in 0..max_len {
        let live: Vec<&Live> = beams.iter().filter(|b| !b.ended).collect();
        if live.is_empty() {
            break;
        }
        // Live hypotheses occupy cache rows 0..live in beam order.
        let last: Vec<i64> = live.iter().map(|b| *b.ys.last().unwrap_or(&sos)).collect();
        let logits = decoder.forward_step(&last, &mut cache)?;
        let v = logits.dims()[1];
        let lp = ops::log_softmax(&logits)?.to_f64_vec()?;
        let mut cands: Vec<Live> = Vec::new();
        for b in &beams {
            if b.ended {
                cands.push(b.clone());
                continue;
            }
            let row = &lp[b.row * v..(b.row + 1) * v];
            for (tok, l) in top_k(row, beam_size) {
                let mut ys = b.ys.clone();
                ys.push(tok as i64);
                cands.push(Live { ys, score: b.score + l, ended: tok as i64 == eos, row: b.row });
            }
        }
        // Stable: equal scores keep the order of hypothesis, then token rank.
        cands.sort_by(|a, b| b.score.total_cmp(&a.score));
        cands.truncate(beam_size);
        // The survivors still live keep their parent's cache row, renumbered in beam order.
        let parents: Vec<usize> = cands.iter().filter(|c| !c.ended).map(|c| c.row).collect();
        let mut next = 0;
        for c in cands.iter_mut().filter(|c| !c.ended) {
            c.row = next;
            next += 1;
        }
        if !parents.is_empty() {
            cache = cache.select(&parents)?;
        }
        beams = cands;
    }
    let mut best: Option<AttentionResult> = None;
    for b in &beams {
        let tokens = tokens_of(&b.ys, eos);
        let score = normalized(b.score, tokens.len(), length_penalty);
        if best.as_ref().is_none_or(|a| score > a.score) {
            best = Some(AttentionResult { tokens, score });
        }
    }
    best.ok_or_else(|| Error::invalid(OP, "no hypothesis survived"))
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
