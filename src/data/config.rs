//! The `dataset_conf` (and `tokenizer_conf`) sections of a WeNet train.yaml.
//!
//! Field names and defaults follow WeNet's processors (wenet/dataset/processor.py)
//! so a user's existing YAML works unchanged; unknown keys are ignored.

use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};

/// `filter_conf`: bounds an utterance must meet; lengths are frames at 100 per second.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default)]
pub struct FilterConf {
    /// Longest accepted input, in 10 ms frames.
    pub max_length: f64,
    /// Shortest accepted input, in 10 ms frames.
    pub min_length: f64,
    /// Most tokens accepted.
    pub token_max_length: usize,
    /// Fewest tokens accepted.
    pub token_min_length: usize,
    /// Lowest accepted tokens-per-frame ratio.
    pub min_output_input_ratio: f64,
    /// Highest accepted tokens-per-frame ratio.
    pub max_output_input_ratio: f64,
}

impl Default for FilterConf {
    fn default() -> Self {
        FilterConf {
            max_length: 10240.0,
            min_length: 10.0,
            token_max_length: 200,
            token_min_length: 1,
            min_output_input_ratio: 0.0005,
            max_output_input_ratio: 1.0,
        }
    }
}

/// `resample_conf`: the sample rate every utterance is brought to.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default)]
pub struct ResampleConf {
    /// Target rate in Hz.
    pub resample_rate: u32,
}

impl Default for ResampleConf {
    fn default() -> Self {
        ResampleConf { resample_rate: 16000 }
    }
}

/// `fbank_conf`: Kaldi filterbank options.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default)]
pub struct FbankConf {
    /// Number of mel bins (feature dimension).
    pub num_mel_bins: usize,
    /// Window length in milliseconds.
    pub frame_length: f64,
    /// Hop in milliseconds.
    pub frame_shift: f64,
    /// Standard deviation of the Gaussian dither added to each frame (0 disables it).
    pub dither: f64,
    /// Floor of the log-energy column; used only when `use_energy` is set (WeNet passes 0).
    pub energy_floor: f64,
    /// Prepend the log energy as an extra column (Kaldi's `--use-energy`; WeNet leaves it off).
    pub use_energy: bool,
}

impl Default for FbankConf {
    fn default() -> Self {
        FbankConf { num_mel_bins: 23, frame_length: 25.0, frame_shift: 10.0, dither: 0.0, energy_floor: 0.0, use_energy: false }
    }
}

/// `spec_aug_conf`: SpecAugment masks.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default)]
pub struct SpecAugConf {
    /// Number of time masks.
    pub num_t_mask: usize,
    /// Number of frequency masks.
    pub num_f_mask: usize,
    /// Widest time mask, in frames.
    pub max_t: usize,
    /// Widest frequency mask, in bins.
    pub max_f: usize,
}

impl Default for SpecAugConf {
    fn default() -> Self {
        SpecAugConf { num_t_mask: 2, num_f_mask: 2, max_t: 50, max_f: 10 }
    }
}

/// `spec_sub_conf`: replace time spans by earlier frames.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default)]
pub struct SpecSubConf {
    /// Longest replaced span, in frames.
    pub max_t: usize,
    /// Number of replaced spans.
    pub num_t_sub: usize,
}

impl Default for SpecSubConf {
    fn default() -> Self {
        SpecSubConf { max_t: 20, num_t_sub: 3 }
    }
}

/// `spec_trim_conf`: drop a random number of trailing frames.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default)]
pub struct SpecTrimConf {
    /// Most frames trimmed.
    pub max_t: usize,
}

impl Default for SpecTrimConf {
    fn default() -> Self {
        SpecTrimConf { max_t: 20 }
    }
}

/// `shuffle_conf`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default)]
pub struct ShuffleConf {
    /// Samples gathered before each shuffle.
    pub shuffle_size: usize,
}

impl Default for ShuffleConf {
    fn default() -> Self {
        ShuffleConf { shuffle_size: 10000 }
    }
}

/// `sort_conf`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default)]
pub struct SortConf {
    /// Samples gathered before each sort by frame count.
    pub sort_size: usize,
}

impl Default for SortConf {
    fn default() -> Self {
        SortConf { sort_size: 500 }
    }
}

/// `batch_conf`: static (fixed count), dynamic (padded frame budget) or
/// bucket (length buckets, WeNet's `bucket_boundaries`/`bucket_batch_sizes`,
/// or derived from the data and `max_frames_in_batch` when no boundaries are given).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default)]
pub struct BatchConf {
    /// `static` or `dynamic`.
    pub batch_type: String,
    /// Utterances per batch for `static`.
    pub batch_size: usize,
    /// Most padded frames (batch × longest) for `dynamic` and automatic `bucket`.
    pub max_frames_in_batch: usize,
    /// `bucket`: a sample goes to the first bucket i with frames < bucket_boundaries[i] (WeNet's).
    pub bucket_boundaries: Vec<usize>,
    /// `bucket`: batch size of each bucket, one more than the boundaries.
    pub bucket_batch_sizes: Vec<usize>,
    /// Automatic `bucket` (no boundaries): buckets at the length quantiles.
    pub num_buckets: usize,
    /// Automatic `bucket`: samples of each epoch whose lengths set the boundaries.
    pub bucket_warmup: usize,
}

impl BatchConf {
    /// Checks the `bucket` keys: explicit boundaries strictly increasing with one more
    /// batch size, every size > 0; or no boundaries and a frame budget (automatic mode).
    pub fn check_buckets(&self) -> std::result::Result<(), String> {
        let (b, s) = (&self.bucket_boundaries, &self.bucket_batch_sizes);
        if b.is_empty() && s.is_empty() {
            if self.max_frames_in_batch == 0 || self.num_buckets == 0 || self.bucket_warmup == 0 {
                return Err(format!(
                    "dataset_conf.batch_conf: automatic buckets (no bucket_boundaries) need max_frames_in_batch, num_buckets and bucket_warmup > 0, found {}, {} and {}",
                    self.max_frames_in_batch, self.num_buckets, self.bucket_warmup
                ));
            }
            return Ok(());
        }
        if s.len() != b.len() + 1 {
            return Err(format!(
                "dataset_conf.batch_conf.bucket_batch_sizes: expected {} sizes (one more than the {} bucket_boundaries), found {}",
                b.len() + 1,
                b.len(),
                s.len()
            ));
        }
        if b.windows(2).any(|w| w[0] >= w[1]) || b.first() == Some(&0) {
            return Err(format!("dataset_conf.batch_conf.bucket_boundaries: expected strictly increasing frame counts > 0, found {b:?}"));
        }
        if s.contains(&0) {
            return Err(format!("dataset_conf.batch_conf.bucket_batch_sizes: expected sizes > 0, found {s:?}"));
        }
        Ok(())
    }
}

impl Default for BatchConf {
    fn default() -> Self {
        BatchConf {
            batch_type: "static".into(),
            batch_size: 16,
            max_frames_in_batch: 12000,
            bucket_boundaries: Vec::new(),
            bucket_batch_sizes: Vec::new(),
            num_buckets: 8,
            bucket_warmup: 1000,
        }
    }
}

/// `dataset_conf` of a WeNet train.yaml.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default)]
pub struct DatasetConf {
    /// Utterance bounds.
    pub filter_conf: FilterConf,
    /// Target sample rate.
    pub resample_conf: ResampleConf,
    /// Perturb speed by 0.9 / 1.0 / 1.1.
    pub speed_perturb: bool,
    /// Only `fbank` is supported.
    pub feats_type: String,
    /// Filterbank options.
    pub fbank_conf: FbankConf,
    /// Apply SpecAugment.
    pub spec_aug: bool,
    /// SpecAugment options.
    pub spec_aug_conf: SpecAugConf,
    /// Apply spec_sub.
    pub spec_sub: bool,
    /// spec_sub options.
    pub spec_sub_conf: SpecSubConf,
    /// Apply spec_trim.
    pub spec_trim: bool,
    /// spec_trim options.
    pub spec_trim_conf: SpecTrimConf,
    /// Shuffle samples in a buffer.
    pub shuffle: bool,
    /// Shuffle buffer.
    pub shuffle_conf: ShuffleConf,
    /// Sort samples by frames in a buffer.
    pub sort: bool,
    /// Sort buffer.
    pub sort_conf: SortConf,
    /// Batching.
    pub batch_conf: BatchConf,
    /// Passes over the list per epoch.
    pub cycle: usize,
    /// Shuffle the list itself (per epoch) before partitioning.
    pub list_shuffle: bool,
}

impl Default for DatasetConf {
    fn default() -> Self {
        DatasetConf {
            filter_conf: FilterConf::default(),
            resample_conf: ResampleConf::default(),
            speed_perturb: false,
            feats_type: "fbank".into(),
            fbank_conf: FbankConf::default(),
            spec_aug: false,
            spec_aug_conf: SpecAugConf::default(),
            spec_sub: false,
            spec_sub_conf: SpecSubConf::default(),
            spec_trim: false,
            spec_trim_conf: SpecTrimConf::default(),
            shuffle: true,
            shuffle_conf: ShuffleConf::default(),
            sort: true,
            sort_conf: SortConf::default(),
            batch_conf: BatchConf::default(),
            cycle: 1,
            list_shuffle: true,
        }
    }
}

impl DatasetConf {
    /// The cross-validation variant, as WeNet derives it: no perturbation,
    /// no augmentation, no shuffling, no dither, one cycle.
    pub fn for_cv(&self) -> DatasetConf {
        let mut cv = self.clone();
        cv.speed_perturb = false;
        cv.spec_aug = false;
        cv.spec_sub = false;
        cv.spec_trim = false;
        cv.shuffle = false;
        cv.list_shuffle = false;
        cv.cycle = 1;
        cv.fbank_conf.dither = 0.0;
        cv
    }

    /// Checks values that would make the pipeline meaningless; `path` names the config.
    pub fn validate(&self, path: &str) -> Result<()> {
        let bad = |msg: String| Err(Error::ConfigFile { path: path.to_string(), msg });
        if self.feats_type != "fbank" {
            return bad(format!("dataset_conf.feats_type: expected `fbank`, found `{}`", self.feats_type));
        }
        if self.fbank_conf.num_mel_bins == 0 {
            return bad("dataset_conf.fbank_conf.num_mel_bins: expected > 0, found 0".into());
        }
        if !(self.fbank_conf.frame_length > 0.0 && self.fbank_conf.frame_shift > 0.0) {
            return bad(format!(
                "dataset_conf.fbank_conf: expected frame_length and frame_shift > 0 ms, found {} and {}",
                self.fbank_conf.frame_length, self.fbank_conf.frame_shift
            ));
        }
        if self.resample_conf.resample_rate < 1000 {
            return bad(format!("dataset_conf.resample_conf.resample_rate: expected >= 1000 Hz, found {}", self.resample_conf.resample_rate));
        }
        match self.batch_conf.batch_type.as_str() {
            "static" if self.batch_conf.batch_size == 0 => bad("dataset_conf.batch_conf.batch_size: expected > 0, found 0".into()),
            "dynamic" if self.batch_conf.max_frames_in_batch == 0 => bad("dataset_conf.batch_conf.max_frames_in_batch: expected > 0, found 0".into()),
            "static" | "dynamic" => Ok(()),
            "bucket" => match self.batch_conf.check_buckets() {
                Ok(()) => Ok(()),
                Err(m) => bad(m),
            },
            other => bad(format!("dataset_conf.batch_conf.batch_type: expected `static`, `dynamic` or `bucket`, found `{other}`")),
        }
    }
}

/// `tokenizer_conf` of a WeNet train.yaml (char and bpe tokenizer fields).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct TokenizerConf {
    /// Path of units.txt / lang_char.txt.
    pub symbol_table_path: Option<String>,
    /// Split transcripts on spaces into whole-word tokens instead of characters.
    pub split_with_space: bool,
    /// File of non-language symbols such as `<noise>`, one per line.
    pub non_lang_syms_path: Option<String>,
    /// The sentencepiece `.model` of `tokenizer: bpe`.
    pub bpe_path: Option<String>,
    /// asrforge's addition: `char` (default), `word`, or `wordpiece` (greedy
    /// longest match of a units table of pieces such as `▁HE`).
    pub mode: Option<String>,
}

/// The parts of a train.yaml the data pipeline reads.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct DataConfig {
    /// `dataset_conf`.
    pub dataset_conf: DatasetConf,
    /// `tokenizer`: `char` (default) or `bpe` (WeNet's BpeTokenizer over `tokenizer_conf.bpe_path`).
    pub tokenizer: Option<String>,
    /// `tokenizer_conf`.
    pub tokenizer_conf: TokenizerConf,
}

impl DataConfig {
    /// Parses YAML text; `path` is used in error messages.
    pub fn from_yaml_str(text: &str, path: &str) -> Result<DataConfig> {
        let cfg: DataConfig = serde_yaml_ng::from_str(text).map_err(|e| Error::ConfigFile { path: path.to_string(), msg: format!("invalid YAML: {e}") })?;
        cfg.dataset_conf.validate(path)?;
        Ok(cfg)
    }

    /// Reads and parses a train.yaml.
    pub fn from_yaml_file(path: &Path) -> Result<DataConfig> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
        DataConfig::from_yaml_str(&text, &path.display().to_string())
    }
}
