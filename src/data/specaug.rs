//! Feature augmentation: SpecAugment masks, spec_sub and spec_trim, with
//! WeNet's sampling (wenet/dataset/processor.py: `spec_aug`, `spec_sub`,
//! `spec_trim`; Python's `randint(a, b)` includes both ends).
//!
//! Features are `(T, F)` row-major.

use crate::data::config::{SpecAugConf, SpecSubConf, SpecTrimConf};
use crate::tensor::rng::Rng;

/// A uniform integer in `lo..=hi` (as Python's `random.randint`).
fn randint(rng: &mut Rng, lo: usize, hi: usize) -> usize {
    lo + rng.below(hi - lo + 1)
}

/// `frames`, or fewer if `feats` holds fewer whole rows of `bins` (a caller's mistake must not index past the buffer).
fn held_frames(len: usize, frames: usize, bins: usize) -> usize {
    if bins == 0 {
        0
    } else {
        frames.min(len / bins)
    }
}

/// A zeroed span: `[start, end)` along time or frequency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mask {
    /// True for a time mask (rows), false for a frequency mask (columns).
    pub time: bool,
    /// First masked index.
    pub start: usize,
    /// One past the last masked index.
    pub end: usize,
}

/// Applies `num_f_mask` frequency then `num_t_mask` time masks to `feats`; returns the masks.
pub fn spec_aug(feats: &mut [f32], frames: usize, bins: usize, conf: &SpecAugConf, rng: &mut Rng) -> Vec<Mask> {
    let frames = held_frames(feats.len(), frames, bins);
    let mut masks = Vec::with_capacity(conf.num_f_mask + conf.num_t_mask);
    if frames == 0 || bins == 0 {
        return masks;
    }
    for _ in 0..conf.num_f_mask {
        let start = randint(rng, 0, bins - 1);
        let len = randint(rng, 1, conf.max_f.max(1));
        let end = (start + len).min(bins);
        for row in feats.chunks_exact_mut(bins) {
            row[start..end].iter_mut().for_each(|v| *v = 0.0);
        }
        masks.push(Mask { time: false, start, end });
    }
    for _ in 0..conf.num_t_mask {
        let start = randint(rng, 0, frames - 1);
        let len = randint(rng, 1, conf.max_t.max(1));
        let end = (start + len).min(frames);
        feats[start * bins..end * bins].iter_mut().for_each(|v| *v = 0.0);
        masks.push(Mask { time: true, start, end });
    }
    masks
}

/// Replaces `num_t_sub` random spans with the frames `pos` earlier (read from the original features).
pub fn spec_sub(feats: &mut [f32], frames: usize, bins: usize, conf: &SpecSubConf, rng: &mut Rng) {
    let frames = held_frames(feats.len(), frames, bins);
    if frames == 0 || bins == 0 {
        return;
    }
    let orig = feats.to_vec();
    for _ in 0..conf.num_t_sub {
        let start = randint(rng, 0, frames - 1);
        let len = randint(rng, 1, conf.max_t.max(1));
        let end = (start + len).min(frames);
        let pos = randint(rng, 0, start);
        feats[start * bins..end * bins].copy_from_slice(&orig[(start - pos) * bins..(end - pos) * bins]);
    }
}

/// Drops `randint(1, max_t)` trailing frames when that is under half the utterance; returns the new frame count.
pub fn spec_trim(feats: &mut Vec<f32>, frames: usize, bins: usize, conf: &SpecTrimConf, rng: &mut Rng) -> usize {
    let frames = held_frames(feats.len(), frames, bins);
    let len = randint(rng, 1, conf.max_t.max(1));
    if (len as f64) < frames as f64 / 2.0 {
        let keep = frames - len;
        feats.truncate(keep * bins);
        keep
    } else {
        frames
    }
}
