//! WeNet's `filter` processor: length and ratio bounds on an utterance.
//!
//! Lengths are measured on the decoded waveform, before resampling, as
//! `samples / sample_rate * 100` frames — WeNet's convention, whatever the
//! real frame shift.

use crate::data::config::FilterConf;
use crate::data::skip::SkipReason;

/// Returns why the utterance falls outside `conf`, or `None` when it passes.
pub fn check(num_samples: usize, sample_rate: u32, num_tokens: usize, conf: &FilterConf) -> Option<(SkipReason, String)> {
    let frames = num_samples as f64 / sample_rate as f64 * 100.0;
    if frames < conf.min_length {
        return Some((SkipReason::TooShort, format!("expected >= {} frames, found {frames:.1}", conf.min_length)));
    }
    if frames > conf.max_length {
        return Some((SkipReason::TooLong, format!("expected <= {} frames, found {frames:.1}", conf.max_length)));
    }
    if num_tokens < conf.token_min_length {
        return Some((SkipReason::TooFewTokens, format!("expected >= {} tokens, found {num_tokens}", conf.token_min_length)));
    }
    if num_tokens > conf.token_max_length {
        return Some((SkipReason::TooManyTokens, format!("expected <= {} tokens, found {num_tokens}", conf.token_max_length)));
    }
    if frames > 0.0 {
        let ratio = num_tokens as f64 / frames;
        if ratio < conf.min_output_input_ratio {
            return Some((SkipReason::RatioTooLow, format!("expected tokens/frames >= {}, found {ratio:.5}", conf.min_output_input_ratio)));
        }
        if ratio > conf.max_output_input_ratio {
            return Some((SkipReason::RatioTooHigh, format!("expected tokens/frames <= {}, found {ratio:.5}", conf.max_output_input_ratio)));
        }
    }
    None
}
