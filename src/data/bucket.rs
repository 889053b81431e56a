//! Length bucketing (`batch_type: bucket`), with WeNet's semantics
//! (`bucket_by_sequence_length`): a sample of `frames` goes to the first
//! bucket `i` with `frames < bucket_boundaries[i]` (the last bucket takes the
//! rest), and a bucket is emitted as a batch when it holds
//! `bucket_batch_sizes[i]` samples; at the end every non-empty bucket is
//! emitted. So `bucket_batch_sizes` has one more entry than the boundaries.
//!
//! The automatic mode (no `bucket_boundaries` given) derives the buckets from
//! the data: the first `warmup` samples of the epoch are held back, the
//! boundaries are the `num_buckets`-quantiles of their lengths, and each
//! bucket's batch size is the frame budget `max_frames_in_batch` divided by
//! the longest length the bucket can hold (at least 1). The held samples are
//! then bucketed like the rest. Samples longer than the budget are refused
//! by [`BucketBatcher::fits`] (skipped and counted by the loader).

use crate::data::process::Sample;

/// Groups samples into batches of similar length.
#[derive(Debug)]
pub struct BucketBatcher {
    boundaries: Vec<usize>,
    sizes: Vec<usize>,
    buckets: Vec<Vec<Sample>>,
    /// Automatic mode before its boundaries are known: (frame budget, buckets, warm-up size, held samples).
    auto: Option<(usize, usize, usize, Vec<Sample>)>,
    /// Automatic mode's frame budget: longer samples are refused.
    budget: Option<usize>,
}

/// Boundaries at the `num_buckets`-quantiles of `lengths` (strictly increasing, possibly fewer).
pub fn quantile_boundaries(lengths: &[usize], num_buckets: usize) -> Vec<usize> {
    let mut v = lengths.to_vec();
    v.sort_unstable();
    let mut out: Vec<usize> = Vec::new();
    if v.is_empty() {
        return out;
    }
    for i in 1..num_buckets.max(1) {
        // A boundary one past the quantile sample puts that sample in the lower bucket.
        let b = v[(i * v.len() / num_buckets).min(v.len() - 1)] + 1;
        if out.last().is_none_or(|&l| b > l) && b <= v[v.len() - 1] {
            out.push(b);
        }
    }
    out
}

/// Batch sizes for `boundaries` under a budget of `max_frames` padded frames:
/// bucket i holds lengths below `boundaries[i]`, the last up to `longest`.
pub fn budget_batch_sizes(boundaries: &[usize], longest: usize, max_frames: usize) -> Vec<usize> {
    let uppers = boundaries.iter().map(|b| b.saturating_sub(1)).chain(std::iter::once(longest));
    uppers.map(|u| (max_frames / u.max(1)).max(1)).collect()
}

impl BucketBatcher {
    /// Explicit buckets (`sizes.len() == boundaries.len() + 1`, checked by the config).
    pub fn new(boundaries: Vec<usize>, sizes: Vec<usize>) -> BucketBatcher {
        let buckets = sizes.iter().map(|_| Vec::new()).collect();
        BucketBatcher { boundaries, sizes, buckets, auto: None, budget: None }
    }

    /// Automatic buckets from the first `warmup` samples' lengths.
    pub fn auto(max_frames: usize, num_buckets: usize, warmup: usize) -> BucketBatcher {
        BucketBatcher {
            boundaries: Vec::new(),
            sizes: Vec::new(),
            buckets: Vec::new(),
            auto: Some((max_frames, num_buckets, warmup.max(1), Vec::new())),
            budget: Some(max_frames),
        }
    }

    /// The boundaries and batch sizes in use (empty in automatic mode until derived).
    pub fn buckets(&self) -> (&[usize], &[usize]) {
        (&self.boundaries, &self.sizes)
    }

    /// Whether `s` can be batched (automatic mode: within the frame budget).
    pub fn fits(&self, s: &Sample) -> bool {
        self.budget.is_none_or(|max| s.frames <= max)
    }

    fn place(&mut self, s: Sample, out: &mut Vec<Vec<Sample>>) {
        let i = self.boundaries.iter().position(|&b| s.frames < b).unwrap_or(self.boundaries.len());
        self.buckets[i].push(s);
        if self.buckets[i].len() >= self.sizes[i] {
            out.push(std::mem::take(&mut self.buckets[i]));
        }
    }

    /// Derives the automatic buckets from the held samples and places them.
    fn derive(&mut self, out: &mut Vec<Vec<Sample>>) {
        let Some((max, n, _, held)) = self.auto.take() else { return };
        let lengths: Vec<usize> = held.iter().map(|s| s.frames).collect();
        let longest = lengths.iter().copied().max().unwrap_or(max).max(1);
        self.boundaries = quantile_boundaries(&lengths, n);
        // A later sample longer than the warm-up's longest joins the last bucket, whose
        // batches may then pass the budget by that excess.
        self.sizes = budget_batch_sizes(&self.boundaries, longest, max);
        self.buckets = self.sizes.iter().map(|_| Vec::new()).collect();
        for s in held {
            self.place(s, out);
        }
    }

    /// Adds a sample; returns the batches it completed (several when the automatic warm-up ends).
    pub fn push(&mut self, s: Sample) -> Vec<Vec<Sample>> {
        let mut out = Vec::new();
        if let Some((_, _, warmup, held)) = self.auto.as_mut() {
            held.push(s);
            if held.len() >= *warmup {
                self.derive(&mut out);
            }
            return out;
        }
        self.place(s, &mut out);
        out
    }

    /// The partial buckets at the end of the epoch, shortest bucket first.
    pub fn flush(&mut self) -> Vec<Vec<Sample>> {
        let mut out = Vec::new();
        self.derive(&mut out);
        out.extend(self.buckets.iter_mut().filter(|b| !b.is_empty()).map(std::mem::take));
        out
    }
}
