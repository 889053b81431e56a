//! Tests that tell a right formula from a plausible wrong one, on cases
//! where the wrong one gives a different number:
//! - the label-smoothing loss divided by tokens (`normalize_length`) or by
//!   the batch, on a batch whose valid-token count differs from its size,
//!   with its gradient, against the formula written out here;
//! - relative-position attention with `pos_bias_u ≠ pos_bias_v`, against
//!   ((q+u)·kᵀ + (q+v)·pᵀ)/√d_k, softmax, ·v, heads merged, `linear_out`,
//!   written out here in plain f64 loops;
//! - SpecAugment's mask starts cover every frame (time) and every bin
//!   (frequency) over many seeds, with more frames than bins and fewer.

use asrforge::autograd;
use asrforge::data::config::SpecAugConf;
use asrforge::data::specaug::spec_aug;
use asrforge::nn::RelPositionMultiHeadedAttention;
use asrforge::ops;
use asrforge::tensor::Rng;
use asrforge::{DType, Device, Tensor};

fn t(v: &[f64], s: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), s.to_vec(), &Device::Cpu).unwrap()
}

fn close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}[{i}]: got {g}, expected {w}");
    }
}

#[test]
fn label_smoothing_divides_by_tokens_or_by_batch_and_its_gradient_follows() {
    // B = 2 sequences, L = 3, V = 4; 3 valid tokens (2 in the first
    // sequence, 1 in the second): the two divisors are 3 and 2.
    let (b, l, v) = (2usize, 3usize, 4usize);
    let logits: Vec<f64> = (0..b * l * v).map(|i| ((i * 37 % 11) as f64 - 5.0) * 0.3).collect();
    let target: Vec<i64> = vec![1, 3, -1, 2, -1, -1];
    let eps = 0.2;
    // Per row: q = 1−ε on the target, ε/(V−1) elsewhere; KL(q‖p) = Σ q (ln q − ln p).
    let mut total = 0.0;
    let mut dkl = vec![0.0; b * l * v]; // ∂ΣKL/∂x = softmax − q on valid rows
    for r in 0..b * l {
        if target[r] < 0 {
            continue;
        }
        let x = &logits[r * v..(r + 1) * v];
        let lse = x.iter().map(|a| a.exp()).sum::<f64>().ln();
        for k in 0..v {
            let q = if k as i64 == target[r] { 1.0 - eps } else { eps / (v as f64 - 1.0) };
            total += q * (q.ln() - (x[k] - lse));
            dkl[r * v + k] = (x[k] - lse).exp() - q;
        }
    }
    for (normalize_length, denom) in [(true, 3.0), (false, 2.0)] {
        let x = t(&logits, &[b, l, v]).requires_grad_();
        let tg = Tensor::from_vec(target.clone(), vec![b, l], &Device::Cpu).unwrap();
        let loss = ops::label_smoothing_loss(&x, &tg, eps, -1, normalize_length).unwrap();
        close(&format!("loss (normalize_length {normalize_length})"), &loss.to_f64_vec().unwrap(), &[total / denom], 1e-12);
        autograd::backward(&loss).unwrap();
        let want: Vec<f64> = dkl.iter().map(|g| g / denom).collect();
        close(&format!("gradient (normalize_length {normalize_length})"), &x.grad().unwrap().to_f64_vec().unwrap(), &want, 1e-12);
    }
}

/// y = W x + b over the last dim of `x` (rows of `n_in`), W [n_out, n_in].
fn linear(x: &[f64], n_in: usize, w: &[f64], bias: Option<&[f64]>) -> Vec<f64> {
    let n_out = w.len() / n_in;
    x.chunks(n_in).flat_map(|row| (0..n_out).map(move |o| (0..n_in).map(|i| w[o * n_in + i] * row[i]).sum::<f64>() + bias.map_or(0.0, |b| b[o]))).collect()
}

#[test]
fn relative_position_attention_matches_its_formula_with_distinct_biases() {
    let (heads, d, tt) = (2usize, 6usize, 4usize);
    let dk = d / heads;
    let mut rng = Rng::new(11);
    let att = RelPositionMultiHeadedAttention::new(heads, d, 0.0, DType::F64, &mut rng).unwrap();
    // Distinct, known biases: swapping them changes every score.
    let u: Vec<f64> = (0..heads * dk).map(|i| 0.4 - 0.15 * i as f64).collect();
    let vb: Vec<f64> = (0..heads * dk).map(|i| -0.5 + 0.2 * i as f64).collect();
    att.pos_bias_u.assign(&t(&u, &[heads, dk])).unwrap();
    att.pos_bias_v.assign(&t(&vb, &[heads, dk])).unwrap();
    let x: Vec<f64> = rng.normal(tt * d);
    let pos: Vec<f64> = rng.normal(tt * d);
    let got = autograd::no_grad(|| att.forward(&t(&x, &[1, tt, d]), &t(&x, &[1, tt, d]), &t(&x, &[1, tt, d]), None, &t(&pos, &[1, tt, d])))
        .unwrap()
        .to_f64_vec()
        .unwrap();

    let p = |w: &Tensor| w.to_f64_vec().unwrap();
    let a = &att.base;
    let q = linear(&x, d, &p(&a.linear_q.weight), Some(&p(a.linear_q.bias.as_ref().unwrap())));
    let k = linear(&x, d, &p(&a.linear_k.weight), Some(&p(a.linear_k.bias.as_ref().unwrap())));
    let val = linear(&x, d, &p(&a.linear_v.weight), Some(&p(a.linear_v.bias.as_ref().unwrap())));
    let pe = linear(&pos, d, &p(&att.linear_pos.weight), None);
    let mut merged = vec![0.0; tt * d];
    for h in 0..heads {
        let f = |m: &[f64], i: usize, j: usize| m[i * d + h * dk + j];
        for i in 0..tt {
            let scores: Vec<f64> = (0..tt)
                .map(|j| {
                    let ac: f64 = (0..dk).map(|c| (f(&q, i, c) + u[h * dk + c]) * f(&k, j, c)).sum();
                    let bd: f64 = (0..dk).map(|c| (f(&q, i, c) + vb[h * dk + c]) * f(&pe, j, c)).sum();
                    (ac + bd) / (dk as f64).sqrt()
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
            for c in 0..dk {
                merged[i * d + h * dk + c] = (0..tt).map(|j| (scores[j] - m).exp() / z * f(&val, j, c)).sum();
            }
        }
    }
    let want = linear(&merged, d, &p(&a.linear_out.weight), Some(&p(a.linear_out.bias.as_ref().unwrap())));
    close("rel-pos attention", &got, &want, 1e-12);
}

/// Every start a mask of one kind takes over `draws` seeds.
fn starts(frames: usize, bins: usize, time: bool, draws: u64) -> Vec<usize> {
    let conf = SpecAugConf { num_t_mask: usize::from(time), num_f_mask: usize::from(!time), max_t: 3, max_f: 3 };
    let mut seen = vec![0usize; if time { frames } else { bins }];
    for seed in 0..draws {
        let mut x = vec![1.0f32; frames * bins];
        for m in spec_aug(&mut x, frames, bins, &conf, &mut Rng::new(seed)) {
            assert_eq!(m.time, time);
            seen[m.start] += 1;
        }
    }
    seen
}

#[test]
fn spec_aug_mask_starts_cover_every_frame_and_every_bin() {
    // More frames than bins: time-mask starts reach the last frame, not only the first `bins`.
    let (frames, bins) = (120, 20);
    let seen = starts(frames, bins, true, 6000);
    let never: Vec<usize> = (0..frames).filter(|&s| seen[s] == 0).collect();
    assert!(never.is_empty(), "time-mask starts never drawn (of 0..{frames}): {never:?}");
    // Uniform over 0..frames: each start ~ 6000/120 = 50 times; no start gets more than 3x that.
    assert!(seen.iter().all(|&n| n < 150), "{seen:?}");
    // Fewer frames than bins: frequency-mask starts still reach the last bin.
    let (frames, bins) = (5, 40);
    let seen = starts(frames, bins, false, 4000);
    let never: Vec<usize> = (0..bins).filter(|&s| seen[s] == 0).collect();
    assert!(never.is_empty(), "frequency-mask starts never drawn (of 0..{bins}): {never:?}");
    // And time-mask starts cover the few frames there are.
    let seen = starts(frames, bins, true, 1000);
    assert!(seen.iter().all(|&n| n > 100), "{seen:?}");
}
