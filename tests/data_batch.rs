//! Padding values and shapes, static batch sizes, the dynamic frame budget.

use asrforge::data::batch::{pad, BatchMode, Batcher, IGNORE_ID};
use asrforge::data::process::Sample;
use asrforge::tensor::rng::Rng;

fn sample(key: &str, frames: usize, dim: usize, label: Vec<i64>) -> Sample {
    let feats = (0..frames * dim).map(|i| 1.0 + i as f32).collect();
    Sample { key: key.into(), feats, frames, dim, label }
}

#[test]
fn pad_sorts_longest_first_and_pads() {
    let b = pad(vec![sample("a", 2, 3, vec![5]), sample("b", 4, 3, vec![7, 8, 9]), sample("c", 3, 3, vec![])]).unwrap();
    assert_eq!(b.keys, vec!["b", "c", "a"]);
    assert_eq!(b.feats.dims(), &[3, 4, 3]);
    assert_eq!(b.feats_lengths, vec![4, 3, 2]);
    assert_eq!(b.target.dims(), &[3, 3]);
    assert_eq!(b.target_lengths, vec![3, 0, 1]);
    let f = b.feats.to_vec::<f32>().unwrap();
    // "b" is copied whole; "c" then zeros for its 4th frame; "a" then two zero frames.
    assert_eq!(&f[0..12], &(1..=12).map(|v| v as f32).collect::<Vec<_>>()[..]);
    assert_eq!(&f[12..21], &(1..=9).map(|v| v as f32).collect::<Vec<_>>()[..]);
    assert_eq!(&f[21..24], &[0.0; 3]);
    assert_eq!(&f[24..30], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(&f[30..36], &[0.0; 6]);
    assert_eq!(b.target.to_vec::<i64>().unwrap(), vec![7, 8, 9, IGNORE_ID, IGNORE_ID, IGNORE_ID, 5, IGNORE_ID, IGNORE_ID]);
    assert_eq!(b.feats_lengths_tensor().unwrap().to_vec::<i64>().unwrap(), vec![4, 3, 2]);
    assert_eq!(b.target_lengths_tensor().unwrap().to_vec::<i64>().unwrap(), vec![3, 0, 1]);
}

#[test]
fn pad_refuses_empty_and_mixed_dims() {
    assert!(pad(vec![]).is_err());
    let e = pad(vec![sample("a", 2, 3, vec![]), sample("b", 2, 4, vec![])]).unwrap_err().to_string();
    assert!(e.contains("b") && e.contains("feature dim 3"), "{e}");
}

#[test]
fn static_batches_have_batch_size() {
    let mut b = Batcher::new(BatchMode::Static(4));
    let mut sizes = Vec::new();
    for i in 0..10 {
        if let Some(batch) = b.push(sample(&format!("u{i}"), 5, 2, vec![1])) {
            sizes.push(batch.len());
        }
    }
    sizes.extend(b.flush().map(|v| v.len()));
    assert_eq!(sizes, vec![4, 4, 2]);
}

#[test]
fn dynamic_budget_is_never_exceeded() {
    let max = 1000;
    let mut rng = Rng::new(11);
    let mut b = Batcher::new(BatchMode::Dynamic(max));
    let mut batches = Vec::new();
    let mut total = 0;
    for i in 0..500 {
        let frames = 1 + rng.below(max);
        total += 1;
        if let Some(batch) = b.push(sample(&format!("u{i}"), frames, 1, vec![])) {
            batches.push(batch);
        }
    }
    batches.extend(b.flush());
    assert_eq!(batches.iter().map(Vec::len).sum::<usize>(), total, "every sample lands in a batch");
    for batch in &batches {
        let longest = batch.iter().map(|s| s.frames).max().unwrap();
        assert!(longest * batch.len() <= max, "{} x {longest} > {max}", batch.len());
    }
    // Greedy: adding the next sample of the stream would have broken the budget.
    for w in batches.windows(2) {
        let longest = w[0].iter().chain(std::iter::once(&w[1][0])).map(|s| s.frames).max().unwrap();
        assert!(longest * (w[0].len() + 1) > max);
    }
}
