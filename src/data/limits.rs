//! What the model can take, as plain numbers the loader checks per utterance.
//!
//! The encoder's subsampling maps T feature frames to T' encoder frames (a
//! chain of valid convolutions, each `(L − k) / s + 1`), and its positional
//! table holds a fixed number of rows (5000 in WeNet's configs): an
//! utterance with more encoder frames than rows cannot be encoded. The table
//! is not grown on demand (WeNet's `RelPositionalEncoding.extend_pe` does):
//! a fixed table keeps the attention's T'² memory bounded by what the config
//! declares and every rank's model identical, and an utterance past it is a
//! data problem, skipped and counted like any other. With CTC trained, a
//! target needs at least one encoder frame per token plus one per repeated
//! neighbour (`frames_needed`), checked on T', not on the feature frames.
//! An utterance shorter than what one encoder frame reads (T' = 0) can be
//! neither trained nor decoded (full context or chunk by chunk) and is
//! skipped as `too_short_to_encode`.

use crate::data::skip::SkipReason;

/// The encoder's length limits, derived from the model config (see `models::limits`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelLimits {
    /// (kernel, stride) of each subsampling convolution over time, in order (empty: none).
    pub subsampling: Vec<(usize, usize)>,
    /// Encoder frames (after subsampling) the positional table holds; `None`: unbounded.
    pub max_encoder_frames: Option<usize>,
    /// Whether CTC is trained, so each target must fit its encoder frames.
    pub ctc: bool,
}

impl ModelLimits {
    /// Encoder frames for `frames` feature frames.
    pub fn encoder_frames(&self, frames: usize) -> usize {
        self.subsampling.iter().fold(frames, |l, &(k, s)| if l >= k { (l - k) / s.max(1) + 1 } else { 0 })
    }

    /// The fewest feature frames that give one encoder frame (the subsampling's context plus one).
    pub fn min_feature_frames(&self) -> usize {
        // Invert each conv from the last: (L − k)/s + 1 >= 1 holds from L = k.
        self.subsampling.iter().rev().fold(1, |m, &(k, s)| (m - 1) * s.max(1) + k.max(1))
    }

    /// The most feature frames whose encoder frames fit the table (`None`: unbounded).
    pub fn max_feature_frames(&self) -> Option<usize> {
        let max = self.max_encoder_frames?;
        // Invert each conv from the last: (L − k)/s + 1 <= m holds up to L = m·s + k − 1.
        Some(self.subsampling.iter().rev().fold(max, |m, &(k, s)| m * s.max(1) + k.max(1) - 1))
    }

    /// Why an utterance of `frames` feature frames and `label` cannot be trained, or `None`.
    pub fn check(&self, frames: usize, label: &[i64]) -> Option<(SkipReason, String)> {
        let enc = self.encoder_frames(frames);
        if enc == 0 {
            return Some((
                SkipReason::TooShortToEncode,
                format!("expected at least {} feature frames (what one encoder frame reads), found {frames}", self.min_feature_frames()),
            ));
        }
        if let Some(max) = self.max_encoder_frames {
            if enc > max {
                return Some((
                    SkipReason::BeyondModel,
                    format!(
                        "expected at most {max} encoder frames (the positional table; {} feature frames), found {enc} ({frames} feature frames)",
                        self.max_feature_frames().unwrap_or(max)
                    ),
                ));
            }
        }
        if self.ctc && !label.is_empty() {
            let needed = label.len() + label.windows(2).filter(|w| w[0] == w[1]).count();
            if needed > enc {
                return Some((
                    SkipReason::CtcInfeasible,
                    format!(
                        "expected at least {needed} encoder frames for {} tokens (with repeats), found {enc} ({frames} feature frames after subsampling)",
                        label.len()
                    ),
                ));
            }
        }
        None
    }
}
