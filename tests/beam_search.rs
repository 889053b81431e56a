//! Attention beam search over hand-built scorers, and CTC prefix scores
//! against their definition (sums over every CTC path, enumerated).

use std::collections::HashMap;

use asrforge::decode::beam::{beam_search, BeamOptions, CtcJoint, StepScorer};
use asrforge::decode::ctc_prefix::{CtcPrefixState, CtcRows};
use asrforge::tensor::Rng;
use asrforge::Result;

const SOS: usize = 4;
const EOS: usize = 4;

/// Next-token distributions looked up by the whole prefix (with `<sos>`);
/// prefixes not in the table get `default`.
struct TableScorer {
    table: HashMap<Vec<i64>, Vec<f64>>,
    default: Vec<f64>,
    steps: usize,
}

impl StepScorer for TableScorer {
    fn step(&mut self, prefixes: &[&[i64]]) -> Result<Vec<f64>> {
        self.steps += 1;
        Ok(prefixes.iter().flat_map(|p| self.table.get(*p).unwrap_or(&self.default).clone()).collect())
    }
    fn select(&mut self, _parents: &[usize]) -> Result<()> {
        Ok(())
    }
}

/// Log-probabilities from probabilities.
fn ln(p: &[f64]) -> Vec<f64> {
    p.iter().map(|x| x.ln()).collect()
}

fn opts(beam_size: usize, max_len: usize) -> BeamOptions {
    BeamOptions { beam_size, length_penalty: 0.0, max_len, sos: SOS, eos: EOS }
}

#[test]
fn a_longer_hypothesis_beats_one_that_ended_early_with_a_higher_step_score() {
    // Vocabulary: 0 blank, 1 a, 2 b, 3 c, 4 <sos/eos>. The empty hypothesis ends
    // at the first step (0.30); "a b" then <eos> has 0.45·0.95·0.95 = 0.406, and
    // "a" alone 0.45·0.03: a search that stops at the first ended hypothesis, or
    // that leaves <eos> out of the scores it compares, returns a shorter result.
    let mut table = HashMap::new();
    table.insert(vec![4], ln(&[0.01, 0.45, 0.14, 0.10, 0.30]));
    table.insert(vec![4, 1], ln(&[0.005, 0.005, 0.95, 0.01, 0.03]));
    table.insert(vec![4, 1, 2], ln(&[0.01, 0.01, 0.01, 0.02, 0.95]));
    let mut s = TableScorer { table, default: ln(&[0.1, 0.1, 0.1, 0.1, 0.6]), steps: 0 };
    let r = beam_search(&mut s, opts(2, 10), None).unwrap();
    assert_eq!(r.tokens, vec![1, 2]);
    let want = 0.45f64.ln() + 0.95f64.ln() + 0.95f64.ln();
    assert!((r.score - want).abs() < 1e-12, "{} vs {want}", r.score);
    // Once both survivors have ended the search stops: <sos>, "a", "a b".
    assert_eq!(s.steps, 3);
}

/// Every sequence of tokens in 1..=3 of length <= `max_len` with its <eos>: the exhaustive best.
fn exhaustive_best(s: &TableScorer, max_len: usize) -> (Vec<usize>, f64) {
    let mut best = (vec![], f64::NEG_INFINITY);
    let mut stack = vec![(vec![SOS as i64], 0.0f64)];
    while let Some((p, score)) = stack.pop() {
        let row = s.table.get(&p).unwrap_or(&s.default);
        let ended = score + row[EOS];
        if ended > best.1 {
            best = (p[1..].iter().map(|&t| t as usize).collect(), ended);
        }
        if p.len() < max_len {
            for tok in 0..4 {
                let mut q = p.clone();
                q.push(tok as i64);
                stack.push((q, score + row[tok]));
            }
        }
    }
    best
}

#[test]
fn a_wide_beam_finds_the_exhaustive_best_on_random_scorers() {
    let mut rng = Rng::new(3);
    for case in 0..20 {
        // Random distributions for every prefix up to length 3 (4 tokens + <eos>).
        let mut table = HashMap::new();
        let mut prefixes = vec![vec![SOS as i64]];
        for _ in 0..3 {
            let mut next = Vec::new();
            for p in &prefixes {
                let u = rng.uniform(5);
                let sum: f64 = u.iter().map(|x| x * x * x).sum();
                table.insert(p.clone(), u.iter().map(|x| (x * x * x / sum).ln()).collect::<Vec<_>>());
                for tok in 0..4 {
                    let mut q = p.clone();
                    q.push(tok);
                    next.push(q);
                }
            }
            prefixes = next;
        }
        // Past length 3 only <eos> is possible.
        let default = vec![-1e9, -1e9, -1e9, -1e9, 0.0];
        let mut s = TableScorer { table, default, steps: 0 };
        let (want, want_score) = exhaustive_best(&s, 4);
        // 4^3 = 64 prefixes of length 3 at most: a beam of 64·4 keeps everything.
        let r = beam_search(&mut s, opts(256, 5), None).unwrap();
        assert_eq!(r.tokens, want, "case {case}");
        assert!((r.score - want_score).abs() < 1e-9, "case {case}: {} vs {want_score}", r.score);
    }
}

/// log p of every CTC path (T frames over V symbols), enumerated, summed into
/// (a) paths whose collapsed labels are exactly `labels`, (b) start with `labels`.
fn brute_force(x: &[f32], t_max: usize, v: usize, blank: usize, labels: &[usize]) -> (f64, f64) {
    let (mut exact, mut prefix) = (0.0f64, 0.0f64);
    let total = v.pow(t_max as u32);
    for code in 0..total {
        let mut c = code;
        let mut path = Vec::with_capacity(t_max);
        let mut lp = 0.0f64;
        for t in 0..t_max {
            let k = c % v;
            c /= v;
            path.push(k);
            lp += f64::from(x[t * v + k]);
        }
        let mut collapsed = Vec::new();
        let mut prev = None;
        for &k in &path {
            if Some(k) != prev && k != blank {
                collapsed.push(k);
            }
            prev = Some(k);
        }
        if collapsed == labels {
            exact += lp.exp();
        }
        if collapsed.starts_with(labels) {
            prefix += lp.exp();
        }
    }
    (exact.ln(), prefix.ln())
}

#[test]
fn ctc_prefix_scores_equal_sums_over_every_path() {
    let (t_max, v, blank) = (6, 4, 0);
    let mut rng = Rng::new(11);
    for case in 0..4 {
        let mut x = Vec::with_capacity(t_max * v);
        for _ in 0..t_max {
            let u = rng.uniform(v);
            let sum: f64 = u.iter().sum();
            x.extend(u.iter().map(|p| (p / sum).ln() as f32));
        }
        let rows = CtcRows { rows: &x, vocab: v, blank };
        rows.check().unwrap();
        // Includes a repeated label (1 1), which needs a blank between.
        for labels in [vec![], vec![2], vec![1, 3], vec![1, 1], vec![3, 1, 2], vec![2, 2, 2]] {
            let mut s = CtcPrefixState::initial(&rows);
            for &c in &labels {
                s = s.extend(&rows, c);
            }
            let (exact, prefix) = brute_force(&x, t_max, v, blank, &labels);
            assert!((s.final_score() - exact).abs() < 1e-5, "case {case} {labels:?}: final {} vs {exact}", s.final_score());
            assert!((s.score - prefix).abs() < 1e-5, "case {case} {labels:?}: prefix {} vs {prefix}", s.score);
        }
    }
    assert!(CtcRows { rows: &[0.0; 7], vocab: 4, blank: 0 }.check().is_err());
}

/// CTC rows of T frames that spell `frames` (one symbol per frame) with probability `p`.
fn peaked(frames: &[usize], v: usize, p: f64) -> Vec<f32> {
    let rest = ((1.0 - p) / (v - 1) as f64).ln() as f32;
    frames.iter().flat_map(|&k| (0..v).map(move |j| if j == k { p.ln() as f32 } else { rest })).collect()
}

#[test]
fn ctc_prefix_scores_restore_a_word_the_decoder_skips() {
    // Spoken "a b a c": the decoder, unsure which "a" it is at, prefers to jump
    // from the first "a" to "c" (0.6 against 0.4 for "b"); attention-only
    // search drops "b a". CTC has seen both.
    let mut table = HashMap::new();
    table.insert(vec![4], ln(&[0.01, 0.96, 0.01, 0.01, 0.01]));
    table.insert(vec![4, 1], ln(&[0.0, 0.0, 0.39, 0.6, 0.01]).into_iter().map(|x| x.max(-30.0)).collect::<Vec<_>>());
    table.insert(vec![4, 1, 2], ln(&[0.01, 0.96, 0.01, 0.01, 0.01]));
    table.insert(vec![4, 1, 2, 1], ln(&[0.01, 0.01, 0.01, 0.96, 0.01]));
    table.insert(vec![4, 1, 3], ln(&[0.01, 0.01, 0.01, 0.01, 0.96]));
    table.insert(vec![4, 1, 2, 1, 3], ln(&[0.01, 0.01, 0.01, 0.01, 0.96]));
    let default = ln(&[0.01, 0.01, 0.01, 0.01, 0.96]);
    let mut alone = TableScorer { table: table.clone(), default: default.clone(), steps: 0 };
    assert_eq!(beam_search(&mut alone, opts(4, 10), None).unwrap().tokens, vec![1, 3]);
    let ctc = peaked(&[0, 1, 0, 2, 0, 1, 1, 0, 3, 0], 5, 0.9);
    let rows = CtcRows { rows: &ctc, vocab: 5, blank: 0 };
    let mut joint = TableScorer { table, default, steps: 0 };
    let r = beam_search(&mut joint, opts(4, 10), Some(CtcJoint { rows, weight: 0.3 })).unwrap();
    assert_eq!(r.tokens, vec![1, 2, 1, 3]);
    // The score is (1 − λ)·decoder + λ·CTC of the whole sequence.
    let att = 0.96f64.ln() + 0.39f64.ln() + 0.96f64.ln() + 0.96f64.ln() + 0.96f64.ln();
    let mut s = CtcPrefixState::initial(&rows);
    for c in [1, 2, 1, 3] {
        s = s.extend(&rows, c);
    }
    let want = 0.7 * att + 0.3 * s.final_score();
    assert!((r.score - want).abs() < 1e-9, "{} vs {want}", r.score);
    let bad = CtcJoint { rows, weight: 1.5 };
    let mut again = TableScorer { table: HashMap::new(), default: ln(&[0.2; 5]), steps: 0 };
    assert!(beam_search(&mut again, opts(4, 10), Some(bad)).unwrap_err().to_string().contains("CTC weight in (0, 1]"));
}
