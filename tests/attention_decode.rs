//! Attention decoding: beam search with beam 1 is greedy decoding with the
//! decoder, and rescoring picks what the decoder (mixed with CTC as WeNet
//! does) prefers.

use asrforge::autograd::no_grad;
use asrforge::decode::attention::{attention_beam_search, attention_beam_search_max, attention_greedy_search, attention_rescoring, rescore, sequence_score};
use asrforge::decode::ctc::Hypothesis;
use asrforge::models::{AsrModel, ModelConfig};
use asrforge::nn::Module;
use asrforge::ops;
use asrforge::tensor::{DType, Rng};
use asrforge::{Device, Tensor};

fn tiny(seed: u64) -> AsrModel {
    let root: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/conf/tiny.yaml")).unwrap()).unwrap();
    let (cfg, _) = ModelConfig::from_yaml(&root).unwrap();
    let mut m = AsrModel::without_cmvn_stats(&cfg, DType::F32, &mut Rng::new(seed)).unwrap();
    m.train(false);
    m
}

fn enc(seed: u64, t: usize) -> Tensor {
    Tensor::randn([1, t, 64], 0.0, 1.0, DType::F32, &mut Rng::new(seed), &Device::Cpu).unwrap()
}

#[test]
fn beam_one_equals_greedy_decoding() {
    let m = tiny(3);
    for (seed, t) in [(1, 6), (2, 9), (3, 12)] {
        let e = enc(seed, t);
        let (beam, greedy) = no_grad(|| (attention_beam_search(&m, &e, t, 1, 0.0).unwrap(), attention_greedy_search(&m, &e, t).unwrap()));
        assert_eq!(beam.tokens, greedy.tokens, "seed {seed}");
        // Beam search steps the cached decoder, greedy recomputes every prefix in
        // full: the same sums of f32 log-probabilities, rounded differently.
        assert!((beam.score - greedy.score).abs() < 1e-5 * greedy.score.abs().max(1.0), "{} vs {}", beam.score, greedy.score);
        assert!(beam.score < 0.0 && beam.tokens.len() <= t);
        assert!(beam.tokens.iter().all(|&k| k != m.sos && k != m.eos));
    }
}

#[test]
fn length_penalty_divides_the_final_score_by_a_power_of_the_length() {
    // WeNet: the final pick maximises score / len^length_penalty over the last beam,
    // which the penalty does not change (pruning uses the plain sums).
    let m = tiny(4);
    let e = enc(5, 7);
    let (a, b) = no_grad(|| (attention_beam_search(&m, &e, 7, 4, 0.0).unwrap(), attention_beam_search(&m, &e, 7, 4, 0.5).unwrap()));
    let norm_a = a.score / (a.tokens.len() as f64).powf(0.5);
    if a.tokens == b.tokens {
        assert!((b.score - norm_a).abs() < 1e-12, "{} vs {norm_a}", b.score);
    } else {
        assert!(b.score > norm_a, "the penalised pick {} must beat the plain pick's normalised {norm_a}", b.score);
    }
    assert!(attention_beam_search(&m, &e, 7, 0, 0.0).unwrap_err().to_string().contains("beam_size >= 1"));
}

/// Teacher-forced log-probability of `tokens` (then `<eos>` when `with_eos`) by full recomputation.
fn teacher_forced(m: &AsrModel, e: &Tensor, t: usize, tokens: &[usize], with_eos: bool) -> f64 {
    let hi: Vec<i64> = tokens.iter().map(|&k| k as i64).collect();
    let (lg, _) = no_grad(|| m.decoder_logits(e, &[t], &[hi])).unwrap();
    let lp = no_grad(|| ops::log_softmax(&lg)).unwrap().to_f64_vec().unwrap();
    let v = lg.dims()[2];
    let body: f64 = tokens.iter().enumerate().map(|(j, &k)| lp[j * v + k]).sum();
    body + if with_eos { lp[tokens.len() * v + m.eos] } else { 0.0 }
}

#[test]
fn a_finished_hypothesis_is_scored_with_its_eos() {
    // Every hypothesis that stopped before the step limit ended on <eos>, and
    // its score is the decoder's probability of its tokens and of that <eos>.
    let m = tiny(8);
    for (seed, t, beam) in [(11, 9, 3), (12, 14, 5)] {
        let e = enc(seed, t);
        let r = no_grad(|| attention_beam_search(&m, &e, t, beam, 0.0)).unwrap();
        let ended = r.tokens.len() < t;
        let want = teacher_forced(&m, &e, t, &r.tokens, ended);
        assert!((r.score - want).abs() < 1e-5 * want.abs().max(1.0), "seed {seed}: {} vs {want}", r.score);
    }
    // With a step limit of 2 nothing longer than 2 tokens can come back.
    let e = enc(13, 12);
    let r = no_grad(|| attention_beam_search_max(&m, &e, 12, 4, 0.0, 2)).unwrap();
    assert!(r.tokens.len() <= 2);
    let want = teacher_forced(&m, &e, 12, &r.tokens, r.tokens.len() < 2);
    assert!((r.score - want).abs() < 1e-5 * want.abs().max(1.0), "{} vs {want}", r.score);
}

fn ln(p: f64) -> f64 {
    p.ln()
}

/// Rows of a 4-symbol vocabulary (0 blank, 1 A, 2 B, 3 eos): every entry ln 0.1 but the given ones.
fn rows(set: &[(usize, usize, f64)], len: usize) -> Vec<f64> {
    let mut r = vec![ln(0.1); (len + 1) * 4];
    for &(row, tok, p) in set {
        r[row * 4 + tok] = ln(p);
    }
    r
}

#[test]
fn rescoring_picks_the_decoders_choice_unless_ctc_dominates() {
    let nbest = vec![Hypothesis { tokens: vec![1], log_score: -1.0 }, Hypothesis { tokens: vec![2], log_score: -1.5 }];
    let left = vec![rows(&[(0, 1, 0.2), (1, 3, 0.5)], 1), rows(&[(0, 2, 0.7), (1, 3, 0.9)], 1)];
    let (i, s) = rescore(&nbest, &left, None, 4, 3, 0.5, 0.0).unwrap();
    assert_eq!(i, 1);
    assert!((s - (ln(0.7) + ln(0.9) - 0.75)).abs() < 1e-12);
    let (i, s) = rescore(&nbest, &left, None, 4, 3, 10.0, 0.0).unwrap();
    assert_eq!(i, 0);
    assert!((s - (ln(0.2) + ln(0.5) - 10.0)).abs() < 1e-12);
    // A right-to-left decoder that strongly prefers hypothesis 0 turns it around at reverse_weight 0.9.
    let right = vec![rows(&[(0, 1, 0.99), (1, 3, 0.99)], 1), rows(&[(0, 2, 0.001), (1, 3, 0.01)], 1)];
    let (i, s) = rescore(&nbest, &left, Some(&right), 4, 3, 0.5, 0.9).unwrap();
    assert_eq!(i, 0);
    let want = (ln(0.2) + ln(0.5)) * 0.1 + (ln(0.99) + ln(0.99)) * 0.9 - 0.5;
    assert!((s - want).abs() < 1e-12);
    // reverse_weight 0 ignores the right decoder.
    assert_eq!(rescore(&nbest, &left, Some(&right), 4, 3, 0.5, 0.0).unwrap().0, 1);
}

#[test]
fn sequence_score_reads_reversed_hypotheses_right_to_left() {
    // hyp [1, 2]: forward reads A at row 0, B at row 1; reversed reads B at row 0, A at row 1.
    let r = rows(&[(0, 1, 0.5), (1, 2, 0.25), (0, 2, 0.8), (1, 1, 0.4), (2, 3, 0.6)], 2);
    assert!((sequence_score(&r, 4, &[1, 2], 3, false).unwrap() - (ln(0.5) + ln(0.25) + ln(0.6))).abs() < 1e-12);
    assert!((sequence_score(&r, 4, &[1, 2], 3, true).unwrap() - (ln(0.8) + ln(0.4) + ln(0.6))).abs() < 1e-12);
    assert!(sequence_score(&r, 4, &[1, 9], 3, false).is_err());
}

#[test]
fn model_rescoring_picks_the_best_teacher_forced_hypothesis() {
    let m = tiny(6);
    let e = enc(8, 10);
    let hyps: Vec<Vec<usize>> = vec![vec![5, 6, 7], vec![9], vec![12, 3, 3, 40], vec![]];
    let nbest: Vec<Hypothesis> = hyps.iter().map(|h| Hypothesis { tokens: h.clone(), log_score: 0.0 }).collect();
    let got = no_grad(|| attention_rescoring(&m, &e, 10, &nbest, 0.3, 0.0)).unwrap();
    // Independently: each hypothesis alone through the decoder.
    let scores: Vec<f64> = hyps
        .iter()
        .map(|h| {
            let hi: Vec<i64> = h.iter().map(|&t| t as i64).collect();
            let (lg, _) = no_grad(|| m.decoder_logits(&e, &[10], &[hi])).unwrap();
            let lp = no_grad(|| ops::log_softmax(&lg)).unwrap().to_f64_vec().unwrap();
            sequence_score(&lp, 64, h, m.eos, false).unwrap()
        })
        .collect();
    let best = (0..scores.len()).fold(0, |b, i| if scores[i] > scores[b] { i } else { b });
    assert_eq!(got.tokens, hyps[best]);
    assert!((got.score - scores[best]).abs() < 1e-4, "{} vs {}", got.score, scores[best]);
}
