//! CTC loss against its definition: the negative log of the summed
//! probability of every alignment that collapses to the target, enumerated
//! by brute force on tiny inputs.

mod common;

use asrforge::ops::{self, Reduction};
use asrforge::tensor::Rng;
use asrforge::{Device, Tensor};

fn collapse(path: &[usize], blank: usize) -> Vec<usize> {
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

/// −log Σ_{paths → target} Π_t p[t, path_t], by enumerating all V^T paths.
fn brute(lp: &[f64], t: usize, v: usize, target: &[usize], blank: usize) -> f64 {
    let mut total = 0.0;
    let mut path = vec![0usize; t];
    loop {
        if collapse(&path, blank) == target {
            total += path.iter().enumerate().map(|(i, &k)| lp[i * v + k]).sum::<f64>().exp();
        }
        let mut i = 0;
        loop {
            if i == t {
                return -total.ln();
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

fn log_softmax_rows(x: &[f64], v: usize) -> Vec<f64> {
    x.chunks(v)
        .flat_map(|r| {
            let m = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let l = m + r.iter().map(|a| (a - m).exp()).sum::<f64>().ln();
            r.iter().map(move |a| a - l).collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn ctc_matches_brute_force_enumeration() {
    let seed = common::fresh_seed();
    let mut rng = Rng::new(seed);
    // (T, V, blank, targets per sequence, input lengths)
    let cases: Vec<(usize, usize, usize, Vec<Vec<usize>>, Vec<usize>)> = vec![
        (5, 3, 0, vec![vec![1, 2], vec![1, 1], vec![2], vec![]], vec![5, 5, 4, 3]),
        (6, 4, 0, vec![vec![1, 2, 3], vec![3, 3, 3], vec![2, 1]], vec![6, 6, 5]),
        (4, 3, 2, vec![vec![0, 1], vec![1]], vec![4, 2]),
    ];
    for (t, v, blank, targets, il) in cases {
        let b = targets.len();
        let s = targets.iter().map(|x| x.len()).max().unwrap().max(1);
        let lp = log_softmax_rows(&rng.normal(b * t * v), v);
        let mut tg = vec![0i64; b * s];
        for (i, x) in targets.iter().enumerate() {
            for (j, &l) in x.iter().enumerate() {
                tg[i * s + j] = l as i64;
            }
        }
        let tl: Vec<usize> = targets.iter().map(|x| x.len()).collect();
        let lpt = Tensor::from_vec(lp.clone(), [b, t, v], &Device::Cpu).unwrap();
        let tgt = Tensor::from_vec(tg, [b, s], &Device::Cpu).unwrap();
        let got = ops::ctc_loss(&lpt, &tgt, &il, &tl, blank, Reduction::None, false).unwrap().to_f64_vec().unwrap();
        for i in 0..b {
            let want = brute(&lp[i * t * v..i * t * v + il[i] * v], il[i], v, &targets[i], blank);
            assert!((got[i] - want).abs() < 1e-10 * want.abs().max(1.0), "seq {i}: ctc {} vs brute force {want} (seed {seed})", got[i]);
        }
        // Reductions follow their definitions.
        let tgt2 = Tensor::from_vec(tgt.to_vec::<i64>().unwrap(), [b, s], &Device::Cpu).unwrap();
        let total = ops::ctc_loss(&lpt, &tgt2, &il, &tl, blank, Reduction::Sum, false).unwrap().to_scalar().unwrap();
        common::assert_vec("sum reduction", &[total], &[got.iter().sum()], 1e-9);
        let mean = ops::ctc_loss(&lpt, &tgt2, &il, &tl, blank, Reduction::Mean, false).unwrap().to_scalar().unwrap();
        let want_mean = got.iter().zip(&tl).map(|(l, &n)| l / n.max(1) as f64).sum::<f64>() / b as f64;
        common::assert_vec("mean reduction", &[mean], &[want_mean], 1e-9);
    }
}

#[test]
fn ctc_impossible_alignment_is_infinite_and_zero_infinity_zeroes_it() {
    // Target "1 1" needs 3 frames (a blank between the repeats); 2 are given.
    let lp = log_softmax_rows(&[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], 3);
    let x = Tensor::from_vec(lp, [1, 2, 3], &Device::Cpu).unwrap().requires_grad_();
    let tg = Tensor::from_vec(vec![1i64, 1], [1, 2], &Device::Cpu).unwrap();
    let inf = ops::ctc_loss(&x, &tg, &[2], &[2], 0, Reduction::Sum, false).unwrap().to_scalar().unwrap();
    assert!(inf.is_infinite() && inf > 0.0, "got {inf}");
    asrforge::autograd::clear_tape();
    let z = ops::ctc_loss(&x, &tg, &[2], &[2], 0, Reduction::Sum, true).unwrap();
    assert_eq!(z.to_scalar().unwrap(), 0.0);
    asrforge::autograd::backward(&z).unwrap();
    assert!(x.grad().unwrap().to_f64_vec().unwrap().iter().all(|&g| g == 0.0));
}

#[test]
fn ctc_bad_input_is_an_error_naming_the_problem() {
    let lp = Tensor::zeros([2, 3, 4], asrforge::DType::F32, &Device::Cpu).unwrap();
    let tg = Tensor::from_vec(vec![1i64, 2, 3, 1, 2, 3, 1, 2], [2, 4], &Device::Cpu).unwrap();
    let bad = Tensor::from_vec(vec![1i64, 9, 0, 0], [2, 2], &Device::Cpu).unwrap();
    let e = ops::ctc_loss(&lp, &bad, &[3, 3], &[2, 1], 0, Reduction::Sum, false).unwrap_err().to_string();
    assert!(e.contains("9") && e.contains("< 4"), "{e}");
    let e = ops::ctc_loss(&lp, &tg, &[5, 3], &[1, 1], 0, Reduction::Sum, false).unwrap_err().to_string();
    assert!(e.contains("input length 5 exceeds the 3 frames"), "{e}");
}

/// A batch of a feasible sequence (0) and one whose target is longer than its
/// input (1), on f64 log-probabilities that require grad; returns the
/// per-sequence losses and the gradient of their sum.
fn mixed_batch(zero_infinity: bool) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (t, v) = (4, 3);
    let mut rng = Rng::new(11);
    let raw = rng.normal(2 * t * v);
    let lp = log_softmax_rows(&raw, v);
    let x = Tensor::from_vec(lp.clone(), [2, t, v], &Device::Cpu).unwrap().requires_grad_();
    // Sequence 0: "1 2" in 4 frames. Sequence 1: "1 2 1 2 1" (5 tokens) in 3 frames.
    let tg = Tensor::from_vec(vec![1i64, 2, 0, 0, 0, 1, 2, 1, 2, 1], [2, 5], &Device::Cpu).unwrap();
    let per = ops::ctc_loss(&x, &tg, &[4, 3], &[2, 5], 0, Reduction::None, zero_infinity).unwrap();
    let losses = per.to_f64_vec().unwrap();
    asrforge::autograd::backward(&ops::sum_all(&per).unwrap()).unwrap();
    let g = x.grad().unwrap().to_f64_vec().unwrap();
    asrforge::autograd::clear_tape();
    (losses, g, lp)
}

#[test]
fn ctc_target_longer_than_its_input_is_infinite_not_an_error() {
    // torch.nn.functional.ctc_loss(..., reduction='none', zero_infinity=False)
    // gives inf for a target that cannot fit; the feasible sequence keeps its loss.
    let (t, v) = (4, 3);
    let x = Tensor::from_vec(vec![0.0f64; 2 * t * v], [2, t, v], &Device::Cpu).unwrap();
    let tg = Tensor::from_vec(vec![1i64, 2, 0, 0, 0, 1, 2, 1, 2, 1], [2, 5], &Device::Cpu).unwrap();
    let per = ops::ctc_loss(&x, &tg, &[4, 3], &[2, 5], 0, Reduction::None, false).unwrap().to_f64_vec().unwrap();
    assert!(per[1].is_infinite() && per[1] > 0.0, "sequence 1: expected +inf, got {}", per[1]);
    // With every log-prob 0 each path has probability 1, so nll = −ln(#paths collapsing to "1 2").
    let want = brute(&vec![0.0; t * v], t, v, &[1, 2], 0);
    common::assert_vec("feasible sequence beside an infeasible one", &per[..1], &[want], 1e-12);
}

#[test]
fn ctc_zero_infinity_zeroes_an_infeasible_sequence_and_trains_the_rest() {
    let (t, v) = (4, 3);
    let (losses, g, lp) = mixed_batch(true);
    assert_eq!(losses[1], 0.0, "infeasible sequence: loss must be zeroed");
    assert!(g[t * v..].iter().all(|&x| x == 0.0), "infeasible sequence: gradient must be zero, got {:?}", &g[t * v..]);
    // The feasible sequence: its loss against brute force, its gradient against central differences of brute force.
    let want = brute(&lp[..t * v], t, v, &[1, 2], 0);
    common::assert_vec("feasible loss", &losses[..1], &[want], 1e-9);
    let h = 1e-6;
    let fd: Vec<f64> = (0..t * v)
        .map(|i| {
            let (mut p, mut m) = (lp[..t * v].to_vec(), lp[..t * v].to_vec());
            p[i] += h;
            m[i] -= h;
            (brute(&p, t, v, &[1, 2], 0) - brute(&m, t, v, &[1, 2], 0)) / (2.0 * h)
        })
        .collect();
    common::assert_vec("feasible gradient", &g[..t * v], &fd, 1e-5);
    // Without zero_infinity the batch sum is +inf (as PyTorch's).
    let (losses, _, _) = mixed_batch(false);
    assert!(losses[1].is_infinite());
}

#[test]
fn ctc_counts_infeasible_sequences_by_frames_needed() {
    use asrforge::backend::cpu::ctc::{count_infeasible, frames_needed, CtcDims};
    assert_eq!(frames_needed(&[1, 1, 2, 2, 2]), 5 + 3);
    assert_eq!(frames_needed(&[1, 2, 1]), 3);
    assert_eq!(frames_needed(&[]), 0);
    let d = CtcDims { b: 3, t: 4, v: 3, s: 3, blank: 0 };
    // "1 1" needs 3 frames: fits in 3, not in 2; "1 2 1" needs 3: not in 2.
    let tg = [1i64, 1, 0, 1, 1, 0, 1, 2, 1];
    assert_eq!(count_infeasible(&d, &tg, &[3, 2, 2], &[2, 2, 3]), 2);
    assert_eq!(count_infeasible(&d, &tg, &[3, 3, 3], &[2, 2, 3]), 0);
}
