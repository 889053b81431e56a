//! Length bucketing: WeNet's bucket rule (first bucket with frames < its
//! boundary, emitted at its batch size, the rest at the end), the automatic
//! buckets from length quantiles and a frame budget, the config checks, and
//! the padding fraction the loader reports.

use asrforge::data::bucket::{budget_batch_sizes, quantile_boundaries, BucketBatcher};
use asrforge::data::config::BatchConf;
use asrforge::data::loader::EpochSummary;
use asrforge::data::process::Sample;

fn sample(i: usize, frames: usize) -> Sample {
    Sample { key: format!("u{i}"), feats: vec![0.0; frames], frames, dim: 1, label: vec![1] }
}

fn keys(batches: &[Vec<Sample>]) -> Vec<Vec<String>> {
    batches.iter().map(|b| b.iter().map(|s| s.key.clone()).collect()).collect()
}

#[test]
fn explicit_buckets_follow_wenets_rule() {
    // Buckets: [0, 10) of 3, [10, 20) of 2, [20, ∞) of 1.
    let mut b = BucketBatcher::new(vec![10, 20], vec![3, 2, 1]);
    let mut out = Vec::new();
    for (i, f) in [5, 15, 25, 9, 10, 20, 3, 19, 4].into_iter().enumerate() {
        out.extend(b.push(sample(i, f)));
    }
    // u2 (25) fills bucket 2 at once; u1+u4 (15, 10) fill bucket 1; u5 (20) bucket 2; u0+u3+u6 bucket 0.
    assert_eq!(keys(&out), vec![vec!["u2"], vec!["u1", "u4"], vec!["u5"], vec!["u0", "u3", "u6"]]);
    // The end: the partial buckets, lowest first.
    assert_eq!(keys(&b.flush()), vec![vec!["u8"], vec!["u7"]]);
    assert!(b.flush().is_empty());
}

#[test]
fn automatic_boundaries_are_length_quantiles_and_sizes_fill_the_budget() {
    let lengths: Vec<usize> = (1..=100).collect();
    // Quartiles of 1..=100: the samples at 25, 50, 75 (0-based) are 26, 51, 76; boundaries one past them.
    assert_eq!(quantile_boundaries(&lengths, 4), vec![27, 52, 77]);
    assert_eq!(quantile_boundaries(&[5, 5, 5, 5], 4), Vec::<usize>::new(), "one length: one bucket");
    // Bucket uppers 26, 51, 76 and the longest 100 under 1000 frames.
    assert_eq!(budget_batch_sizes(&[27, 52, 77], 100, 1000), vec![38, 19, 13, 10]);
    assert_eq!(budget_batch_sizes(&[], 5000, 1000), vec![1], "never below one utterance");

    // Warm-up of 40 samples, then every sample lands in exactly one batch within the budget.
    let mut b = BucketBatcher::auto(600, 4, 40);
    let frames: Vec<usize> = (0..200).map(|i| 20 + (i * 37) % 81).collect();
    let mut out = Vec::new();
    for (i, &f) in frames.iter().enumerate() {
        out.extend(b.push(sample(i, f)));
        if i < 39 {
            assert!(out.is_empty(), "nothing leaves before the warm-up ends");
        }
    }
    out.extend(b.flush());
    let mut seen: Vec<String> = out.iter().flatten().map(|s| s.key.clone()).collect();
    seen.sort();
    let mut want: Vec<String> = (0..200).map(|i| format!("u{i}")).collect();
    want.sort();
    assert_eq!(seen, want);
    let (bounds, sizes) = b.buckets();
    assert_eq!(sizes.len(), bounds.len() + 1);
    assert!(bounds.len() == 3, "{bounds:?}");
    // The warm-up saw the whole range 20..=100, so every batch keeps within 600 padded frames.
    for batch in &out {
        let longest = batch.iter().map(|s| s.frames).max().unwrap();
        assert!(batch.len() * longest <= 600, "{} x {longest}", batch.len());
    }
    assert!(!b.fits(&sample(0, 601)) && b.fits(&sample(0, 600)));
}

#[test]
fn bucket_config_is_checked() {
    let mut c = BatchConf { batch_type: "bucket".into(), bucket_boundaries: vec![100, 200], bucket_batch_sizes: vec![8, 4, 2], ..Default::default() };
    assert!(c.check_buckets().is_ok());
    c.bucket_batch_sizes = vec![8, 4];
    assert!(c.check_buckets().unwrap_err().contains("expected 3 sizes (one more than the 2 bucket_boundaries), found 2"));
    c.bucket_batch_sizes = vec![8, 4, 2];
    c.bucket_boundaries = vec![200, 100];
    assert!(c.check_buckets().unwrap_err().contains("strictly increasing"));
    c.bucket_boundaries = vec![100, 200];
    c.bucket_batch_sizes = vec![8, 0, 2];
    assert!(c.check_buckets().unwrap_err().contains("sizes > 0"));
    let auto = BatchConf { batch_type: "bucket".into(), max_frames_in_batch: 0, ..Default::default() };
    assert!(auto.check_buckets().unwrap_err().contains("automatic buckets"));
}

#[test]
fn padding_fraction_is_padding_over_padded_frames() {
    // Two batches: (10, 6) → 20 padded; (4) → 4 padded; 20 real frames of 24.
    let s = EpochSummary { frames: 20, padded_frames: 24, ..Default::default() };
    assert!((s.padding_fraction() - 4.0 / 24.0).abs() < 1e-15);
    assert_eq!(EpochSummary::default().padding_fraction(), 0.0);
}
