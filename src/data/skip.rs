//! Why an utterance was dropped, and the per-epoch tally of drops.
//!
//! Bad input never stops an epoch: every problem with one utterance (or one
//! list line, or one shard) becomes a [`Skip`], is counted by [`SkipReason`]
//! and the first few are logged with their key.

use std::collections::BTreeMap;
use std::fmt;

/// How many skips are logged one by one before only counting.
pub const LOG_FIRST: usize = 5;

/// The kinds of bad input the pipeline skips.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SkipReason {
    /// A data.list line that is neither valid JSON with key/wav nor `key wav txt`.
    MalformedLine,
    /// The audio file (or shard) does not exist.
    MissingFile,
    /// The file exists but cannot be read (permissions, I/O error).
    UnreadableFile,
    /// The bytes are not a WAV that can be decoded (corrupt, truncated, unsupported).
    CorruptAudio,
    /// A shard whose tar stream is corrupt or truncated; the rest of it is dropped.
    BadShard,
    /// The transcript is empty after trimming.
    EmptyTranscript,
    /// Fewer frames (at 100 per second) than `min_length`.
    TooShort,
    /// More frames than `max_length`.
    TooLong,
    /// Fewer tokens than `token_min_length`.
    TooFewTokens,
    /// More tokens than `token_max_length`.
    TooManyTokens,
    /// Tokens per frame below `min_output_input_ratio`.
    RatioTooLow,
    /// Tokens per frame above `max_output_input_ratio`.
    RatioTooHigh,
    /// A single utterance longer than the dynamic batch's `max_frames_in_batch`.
    OverBatchBudget,
    /// A key seen before in the same feature dump.
    DuplicateKey,
    /// More encoder frames (after subsampling) than the model's positional table holds.
    BeyondModel,
    /// Fewer feature frames than one encoder frame reads (the subsampling's
    /// context, 7 for conv2d): nothing to encode, decode or stream.
    TooShortToEncode,
    /// A target that no CTC alignment fits in its encoder frames (after subsampling).
    CtcInfeasible,
    /// Features with NaN or infinite values (non-finite or huge samples).
    NonFiniteFeatures,
}

impl SkipReason {
    /// Every reason, in a fixed order (the slots of a tally sent between ranks).
    pub const ALL: [SkipReason; 18] = [
        SkipReason::MalformedLine,
        SkipReason::MissingFile,
        SkipReason::UnreadableFile,
        SkipReason::CorruptAudio,
        SkipReason::BadShard,
        SkipReason::EmptyTranscript,
        SkipReason::TooShort,
        SkipReason::TooLong,
        SkipReason::TooFewTokens,
        SkipReason::TooManyTokens,
        SkipReason::RatioTooLow,
        SkipReason::RatioTooHigh,
        SkipReason::OverBatchBudget,
        SkipReason::DuplicateKey,
        SkipReason::BeyondModel,
        SkipReason::TooShortToEncode,
        SkipReason::CtcInfeasible,
        SkipReason::NonFiniteFeatures,
    ];

    /// The reason's stable name, as printed in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::MalformedLine => "malformed_line",
            SkipReason::MissingFile => "missing_file",
            SkipReason::UnreadableFile => "unreadable_file",
            SkipReason::CorruptAudio => "corrupt_audio",
            SkipReason::BadShard => "bad_shard",
            SkipReason::EmptyTranscript => "empty_transcript",
            SkipReason::TooShort => "too_short",
            SkipReason::TooLong => "too_long",
            SkipReason::TooFewTokens => "too_few_tokens",
            SkipReason::TooManyTokens => "too_many_tokens",
            SkipReason::RatioTooLow => "ratio_too_low",
            SkipReason::RatioTooHigh => "ratio_too_high",
            SkipReason::OverBatchBudget => "over_batch_budget",
            SkipReason::DuplicateKey => "duplicate_key",
            SkipReason::BeyondModel => "beyond_model",
            SkipReason::TooShortToEncode => "too_short_to_encode",
            SkipReason::CtcInfeasible => "ctc_infeasible",
            SkipReason::NonFiniteFeatures => "non_finite_features",
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One dropped utterance: why, which key (or list line), and what was found.
#[derive(Clone, Debug, PartialEq)]
pub struct Skip {
    /// The kind of problem.
    pub reason: SkipReason,
    /// The utterance key, or `line N` / the shard path when no key is known.
    pub key: String,
    /// What was expected and what was found.
    pub detail: String,
}

impl Skip {
    /// A skip for `key` with a human-readable detail.
    pub fn new(reason: SkipReason, key: impl Into<String>, detail: impl Into<String>) -> Self {
        Skip { reason, key: key.into(), detail: detail.into() }
    }
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.key, self.reason, self.detail)
    }
}

/// Counts of skips by reason, plus the first few in full.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SkipStats {
    counts: BTreeMap<SkipReason, usize>,
    first: Vec<Skip>,
    /// Whether each of the first skips is also printed to stderr as it happens.
    pub log: bool,
}

impl SkipStats {
    /// An empty tally that logs its first [`LOG_FIRST`] skips to stderr.
    pub fn logging() -> Self {
        SkipStats::with_log(true)
    }

    /// An empty tally that logs its first skips only when `log` is set.
    pub fn with_log(log: bool) -> Self {
        SkipStats { log, ..Default::default() }
    }

    /// Counts one skip; the first few are kept (and logged when `log` is set).
    pub fn record(&mut self, skip: Skip) {
        *self.counts.entry(skip.reason).or_insert(0) += 1;
        if self.first.len() < LOG_FIRST {
            if self.log {
                eprintln!("data: skipped {skip}");
            }
            self.first.push(skip);
        }
    }

    /// Adds `n` skips for `reason` without details (a tally received from another rank).
    pub fn add_count(&mut self, reason: SkipReason, n: usize) {
        if n > 0 {
            *self.counts.entry(reason).or_insert(0) += n;
        }
    }

    /// How many utterances were skipped for `reason`.
    pub fn count(&self, reason: SkipReason) -> usize {
        self.counts.get(&reason).copied().unwrap_or(0)
    }

    /// How many utterances were skipped in all.
    pub fn total(&self) -> usize {
        self.counts.values().sum()
    }

    /// The first skips, in the order they were recorded.
    pub fn first(&self) -> &[Skip] {
        &self.first
    }

    /// Counts by reason, in a stable order.
    pub fn counts(&self) -> impl Iterator<Item = (SkipReason, usize)> + '_ {
        self.counts.iter().map(|(r, n)| (*r, *n))
    }

    /// One line for the end-of-epoch log: `skipped 3 (missing_file 2, too_short 1)`.
    pub fn summary(&self) -> String {
        if self.counts.is_empty() {
            return "skipped 0".to_string();
        }
        let parts: Vec<String> = self.counts.iter().map(|(r, n)| format!("{r} {n}")).collect();
        format!("skipped {} ({})", self.total(), parts.join(", "))
    }
}
