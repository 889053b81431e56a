//! CTC greedy and prefix beam search against hand-computed posteriors and
//! against brute-force enumeration of every alignment on tiny inputs.

use asrforge::decode::ctc::{ctc_greedy_search, ctc_greedy_search_tensor, ctc_prefix_beam_search, ctc_prefix_beam_search_tensor, remove_duplicates_and_blank};
use asrforge::{Device, Error, Tensor};

/// A small deterministic generator so the tests need nothing beyond std.
struct XorShift(u64);

impl XorShift {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn ln_rows(p: &[f64]) -> Vec<f32> {
    p.iter().map(|&x| x.ln() as f32).collect()
}

/// Random posteriors: each row sums to 1.
fn random_posteriors(rng: &mut XorShift, t: usize, v: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(t * v);
    for _ in 0..t {
        let row: Vec<f64> = (0..v).map(|_| 0.05 + rng.uniform()).collect();
        let s: f64 = row.iter().sum();
        out.extend(row.iter().map(|x| x / s));
    }
    out
}

#[test]
fn collapse_helper() {
    assert_eq!(remove_duplicates_and_blank(&[0, 1, 1, 0, 1, 2, 2, 0, 0, 3], 0), vec![1, 1, 2, 3]);
    assert_eq!(remove_duplicates_and_blank(&[], 0), Vec::<usize>::new());
    assert_eq!(remove_duplicates_and_blank(&[0, 0, 0], 0), Vec::<usize>::new());
    // A non-zero blank id.
    assert_eq!(remove_duplicates_and_blank(&[3, 1, 3, 1, 1], 3), vec![1, 1]);
}

#[test]
fn greedy_on_hand_built_posterior() {
    // Frame arg-maxes: 1 1 0 2 2 0 1 3 → tokens 1 2 1 3, first frames 0 3 6 7.
    let argmax = [1usize, 1, 0, 2, 2, 0, 1, 3];
    let v = 4;
    let mut p = vec![0.1f64; argmax.len() * v];
    for (t, &k) in argmax.iter().enumerate() {
        p[t * v + k] = 0.7;
    }
    let lp = ln_rows(&p);
    let g = ctc_greedy_search(&lp, v, 0).unwrap();
    assert_eq!(g.tokens, vec![1, 2, 1, 3]);
    assert_eq!(g.times, vec![0, 3, 6, 7]);

    let t = Tensor::from_vec(lp.clone(), [argmax.len(), v], &Device::Cpu).unwrap();
    assert_eq!(ctc_greedy_search_tensor(&t, 0).unwrap(), g);
    // No frames: nothing decoded.
    assert_eq!(ctc_greedy_search(&[], v, 0).unwrap().tokens, Vec::<usize>::new());
}

#[test]
fn beam_equals_greedy_on_peaked_posteriors() {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    for case in 0..20 {
        let (t, v) = (5 + case % 7, 3 + case % 5);
        let mut p = Vec::with_capacity(t * v);
        for _ in 0..t {
            let peak = (rng.uniform() * v as f64) as usize % v;
            let rest: Vec<f64> = (0..v).map(|_| 0.01 + rng.uniform()).collect();
            let rest_sum: f64 = rest.iter().enumerate().filter(|(k, _)| *k != peak).map(|(_, x)| x).sum();
            for (k, x) in rest.iter().enumerate() {
                p.push(if k == peak { 0.99 } else { 0.01 * x / rest_sum });
            }
        }
        let lp = ln_rows(&p);
        let g = ctc_greedy_search(&lp, v, 0).unwrap();
        let hyps = ctc_prefix_beam_search(&lp, v, 0, 4).unwrap();
        assert_eq!(hyps[0].tokens, g.tokens, "case {case}");
        // Scores come best first.
        for w in hyps.windows(2) {
            assert!(w[0].log_score >= w[1].log_score, "case {case}: {w:?}");
        }
        // The greedy path alone has probability ~0.99^T; the best prefix sums at least that.
        let path: f64 = lp.chunks(v).map(|r| f64::from(r.iter().cloned().fold(f32::MIN, f32::max))).sum();
        assert!(hyps[0].log_score >= path - 1e-6, "case {case}");
    }
}

#[test]
fn beam_beats_greedy_when_prefix_sums_win() {
    // T = 2, V = 2 (blank 0, token 1), p(blank) = 0.6, p(1) = 0.4 each frame.
    // Greedy takes blank twice and returns [] with probability 0.6·0.6 = 0.36.
    // "1" collects 1-1, 1-blank and blank-1: 0.16 + 0.24 + 0.24 = 0.64.
    let lp = ln_rows(&[0.6, 0.4, 0.6, 0.4]);
    assert_eq!(ctc_greedy_search(&lp, 2, 0).unwrap().tokens, Vec::<usize>::new());
    let hyps = ctc_prefix_beam_search(&lp, 2, 0, 2).unwrap();
    assert_eq!(hyps.len(), 2);
    assert_eq!(hyps[0].tokens, vec![1]);
    assert!((hyps[0].log_score - 0.64f64.ln()).abs() < 1e-6, "{}", hyps[0].log_score);
    assert_eq!(hyps[1].tokens, Vec::<usize>::new());
    assert!((hyps[1].log_score - 0.36f64.ln()).abs() < 1e-6, "{}", hyps[1].log_score);

    let t = Tensor::from_vec(lp, [2, 2], &Device::Cpu).unwrap();
    assert_eq!(ctc_prefix_beam_search_tensor(&t, 0, 2).unwrap(), hyps);
}

#[test]
fn beam_size_one_follows_the_arg_max_path() {
    let mut rng = XorShift(42);
    for case in 0..10 {
        let (t, v) = (6, 4);
        let lp = ln_rows(&random_posteriors(&mut rng, t, v));
        let hyps = ctc_prefix_beam_search(&lp, v, 0, 1).unwrap();
        assert_eq!(hyps.len(), 1);
        // With one candidate token per frame only the arg-max path is ever scored.
        assert_eq!(hyps[0].tokens, ctc_greedy_search(&lp, v, 0).unwrap().tokens, "case {case}");
        let path: f64 = lp.chunks(v).map(|r| f64::from(r.iter().cloned().fold(f32::MIN, f32::max))).sum();
        assert!((hyps[0].log_score - path).abs() < 1e-5, "case {case}: {} vs {path}", hyps[0].log_score);
    }
}

/// log Σ over all V^T paths that collapse to each label sequence.
fn brute_force(lp: &[f32], t: usize, v: usize, blank: usize) -> Vec<(Vec<usize>, f64)> {
    let mut sums: Vec<(Vec<usize>, f64)> = Vec::new();
    let mut path = vec![0usize; t];
    loop {
        let prob: f64 = path.iter().enumerate().map(|(i, &k)| f64::from(lp[i * v + k])).sum::<f64>().exp();
        let seq = remove_duplicates_and_blank(&path, blank);
        match sums.iter_mut().find(|(s, _)| *s == seq) {
            Some(e) => e.1 += prob,
            None => sums.push((seq, prob)),
        }
        let mut i = 0;
        loop {
            if i == t {
                return sums.into_iter().map(|(s, p)| (s, p.ln())).collect();
            }
            path[i] += 1;
            if path[i] < v {
                break;
            }
            path[i] = 0;
            i += 1;
        }
    }
}

#[test]
fn log_scores_equal_brute_force_sums() {
    let mut rng = XorShift(7);
    for &(t, v, blank) in &[(3usize, 3usize, 0usize), (4, 3, 0), (3, 4, 2), (2, 2, 1)] {
        let lp = ln_rows(&random_posteriors(&mut rng, t, v));
        let truth = brute_force(&lp, t, v, blank);
        // A beam wider than the number of label sequences prunes nothing, so it is exact.
        let hyps = ctc_prefix_beam_search(&lp, v, blank, 1000).unwrap();
        assert_eq!(hyps.len(), truth.len(), "T={t} V={v}");
        for (seq, want) in &truth {
            let got = hyps.iter().find(|h| &h.tokens == seq).map(|h| h.log_score);
            let got = got.unwrap_or_else(|| panic!("T={t} V={v}: {seq:?} missing"));
            assert!((got - want).abs() < 1e-5, "T={t} V={v} {seq:?}: {got} vs {want}");
        }
        // Every probability is accounted for: the sequences sum to 1.
        let total: f64 = hyps.iter().map(|h| h.log_score.exp()).sum();
        assert!((total - 1.0).abs() < 1e-5, "T={t} V={v}: {total}");
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    assert!(matches!(ctc_greedy_search(&[0.0; 5], 2, 0), Err(Error::InvalidArgument { .. })));
    assert!(matches!(ctc_greedy_search(&[0.0; 4], 0, 0), Err(Error::InvalidArgument { .. })));
    assert!(matches!(ctc_greedy_search(&[0.0; 4], 2, 2), Err(Error::IndexOutOfRange { index: 2, size: 2, .. })));
    assert!(matches!(ctc_prefix_beam_search(&[0.0; 4], 2, 0, 0), Err(Error::InvalidArgument { .. })));
    match ctc_prefix_beam_search(&[0.0, 0.0, 0.0, f32::NAN], 2, 0, 2) {
        Err(Error::InvalidArgument { msg, .. }) => assert!(msg.contains("frame 1 token 1"), "{msg}"),
        other => panic!("expected an InvalidArgument error, got {other:?}"),
    }
    let t3 = Tensor::from_vec(vec![0.0f32; 8], [2, 2, 2], &Device::Cpu).unwrap();
    assert!(matches!(ctc_greedy_search_tensor(&t3, 0), Err(Error::ShapeMismatch { .. })));
}

#[test]
fn blank_penalty_shifts_the_blank_logit_before_the_log_softmax() {
    use asrforge::models::Ctc;
    use asrforge::tensor::{DType, Rng};
    let mut rng = Rng::new(9);
    let (t, d, v, blank) = (5, 8, 6, 0);
    let ctc = Ctc::new(v, d, blank, DType::F64, &mut rng).unwrap();
    let x = Tensor::randn([1, t, d], 0.0, 1.0, DType::F64, &mut rng, &Device::Cpu).unwrap();
    let w = ctc.ctc_lo.weight.to_f64_vec().unwrap();
    let b = ctc.ctc_lo.bias.as_ref().unwrap().to_f64_vec().unwrap();
    let xs = x.to_f64_vec().unwrap();
    for penalty in [0.0, 0.7, 3.0] {
        let got = ctc.log_probs_with_blank_penalty(&x, penalty).unwrap().to_f64_vec().unwrap();
        for ti in 0..t {
            // logits by hand, blank lowered by the penalty, then log-softmax.
            let z: Vec<f64> =
                (0..v).map(|k| b[k] + (0..d).map(|j| w[k * d + j] * xs[ti * d + j]).sum::<f64>() - if k == blank { penalty } else { 0.0 }).collect();
            let lse = z.iter().map(|a| a.exp()).sum::<f64>().ln();
            for k in 0..v {
                assert!((got[ti * v + k] - (z[k] - lse)).abs() < 1e-12, "penalty {penalty} t {ti} k {k}");
            }
        }
    }
}
