//! The per-utterance processors, in WeNet's order: tokenize → filter →
//! resample → speed_perturb → compute_fbank → spec_aug → spec_sub → spec_trim.
//!
//! Every random choice of an utterance comes from its own generator, seeded
//! from (seed, epoch, list line, position in shard); so the features do not
//! depend on which thread computed them, nor on how many threads there are.

use std::sync::Arc;

use crate::data::audio::load_audio;
use crate::data::config::DatasetConf;
use crate::data::fbank::Fbank;
use crate::data::filter;
use crate::data::limits::ModelLimits;
use crate::data::list::RawUtt;
use crate::data::resample::{resample, speed_perturb};
use crate::data::skip::{Skip, SkipReason};
use crate::data::specaug::{spec_aug, spec_sub, spec_trim};
use crate::data::tokenizer::Tokenizer;
use crate::error::Result;
use crate::tensor::rng::Rng;

/// One utterance ready for batching.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Utterance key.
    pub key: String,
    /// Features `(frames, dim)` row-major.
    pub feats: Vec<f32>,
    /// Number of frames.
    pub frames: usize,
    /// Feature dimension.
    pub dim: usize,
    /// Token ids (empty when no tokenizer is used).
    pub label: Vec<i64>,
}

/// SplitMix64 finaliser: spreads nearby integers over the whole seed space.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The generator of one utterance: a pure function of its coordinates.
pub fn utt_rng(seed: u64, epoch: u64, line: usize, sub: usize) -> Rng {
    Rng::new(mix(mix(mix(mix(seed) ^ epoch) ^ line as u64) ^ sub as u64))
}

/// A generator for a named stage of an epoch (list shuffle, sample shuffle).
pub fn stage_rng(seed: u64, epoch: u64, stage: u64) -> Rng {
    Rng::new(mix(mix(mix(seed ^ 0x5EED_0F0A_57A6_E000) ^ epoch) ^ stage))
}

/// Applies the processors of a `dataset_conf` to raw utterances.
#[derive(Clone, Debug)]
pub struct Processor {
    conf: DatasetConf,
    tokenizer: Option<Arc<Tokenizer>>,
    fbank: Fbank,
    limits: Option<ModelLimits>,
}

/// A skip when any feature is NaN or infinite (a non-finite or huge sample):
/// one such utterance would turn a whole step, or CMVN statistics, into NaN.
fn check_finite(key: &str, feats: &[f32], dim: usize) -> std::result::Result<(), Skip> {
    match feats.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => Err(Skip::new(
            SkipReason::NonFiniteFeatures,
            key,
            format!("expected finite features, found {} at frame {} bin {} (NaN, infinite or huge audio samples)", feats[i], i / dim.max(1), i % dim.max(1)),
        )),
    }
}

impl Processor {
    /// A processor for `conf`; without a tokenizer, labels are empty and token bounds are not checked.
    pub fn new(conf: &DatasetConf, tokenizer: Option<Arc<Tokenizer>>) -> Result<Processor> {
        let fbank = Fbank::new(&conf.fbank_conf, conf.resample_conf.resample_rate)?;
        Ok(Processor { conf: conf.clone(), tokenizer, fbank, limits: None })
    }

    /// The processor that also skips what the model cannot take: more
    /// encoder frames than its positional table, or a CTC target that does
    /// not fit its subsampled length.
    pub fn with_limits(mut self, limits: ModelLimits) -> Processor {
        self.limits = Some(limits);
        self
    }

    /// The model limits checked, if any.
    pub fn limits(&self) -> Option<&ModelLimits> {
        self.limits.as_ref()
    }

    /// The configuration in use.
    pub fn conf(&self) -> &DatasetConf {
        &self.conf
    }

    /// Feature dimension of every sample.
    pub fn dim(&self) -> usize {
        self.fbank.dim()
    }

    /// The full training chain for one utterance.
    pub fn process(&self, utt: RawUtt, rng: &mut Rng) -> std::result::Result<Sample, Skip> {
        let key = utt.key;
        let label = match &self.tokenizer {
            Some(tok) => {
                if utt.txt.trim().is_empty() {
                    return Err(Skip::new(SkipReason::EmptyTranscript, key, "expected a transcript, found an empty one"));
                }
                tok.encode(&utt.txt)
            }
            None => Vec::new(),
        };
        let wav = load_audio(&key, &utt.audio)?;
        let mut fconf = self.conf.filter_conf.clone();
        if self.tokenizer.is_none() {
            // Without labels only the length bounds mean anything.
            fconf.token_min_length = 0;
            fconf.min_output_input_ratio = 0.0;
        }
        if let Some((reason, detail)) = filter::check(wav.samples.len(), wav.sample_rate, label.len(), &fconf) {
            return Err(Skip::new(reason, key, detail));
        }
        let target = self.conf.resample_conf.resample_rate;
        let mut samples = resample(&wav.samples, wav.sample_rate, target).map_err(|e| Skip::new(SkipReason::CorruptAudio, key.as_str(), e))?;
        if self.conf.speed_perturb {
            samples = speed_perturb(&samples, target, rng).map_err(|e| Skip::new(SkipReason::CorruptAudio, key.as_str(), e))?.1;
        }
        let dim = self.fbank.dim();
        let mut feats = self.fbank.compute(&samples, rng);
        let mut frames = feats.len() / dim.max(1);
        if frames == 0 {
            return Err(Skip::new(
                SkipReason::TooShort,
                key,
                format!("expected at least one {} ms window, found {} samples", self.conf.fbank_conf.frame_length, samples.len()),
            ));
        }
        if self.conf.spec_aug {
            spec_aug(&mut feats, frames, dim, &self.conf.spec_aug_conf, rng);
        }
        if self.conf.spec_sub {
            spec_sub(&mut feats, frames, dim, &self.conf.spec_sub_conf, rng);
        }
        if self.conf.spec_trim {
            frames = spec_trim(&mut feats, frames, dim, &self.conf.spec_trim_conf, rng);
        }
        check_finite(&key, &feats[..frames * dim], dim)?;
        if let Some((reason, detail)) = self.limits.as_ref().and_then(|l| l.check(frames, &label)) {
            return Err(Skip::new(reason, key, detail));
        }
        Ok(Sample { key, feats, frames, dim, label })
    }

    /// Only resampling and fbank (dither as configured): the features of a
    /// dump or of CMVN statistics, before any perturbation or augmentation.
    pub fn features(&self, utt: &RawUtt, rng: &mut Rng) -> std::result::Result<Sample, Skip> {
        let wav = load_audio(&utt.key, &utt.audio)?;
        let samples = resample(&wav.samples, wav.sample_rate, self.conf.resample_conf.resample_rate)
            .map_err(|e| Skip::new(SkipReason::CorruptAudio, utt.key.as_str(), e))?;
        let dim = self.fbank.dim();
        let feats = self.fbank.compute(&samples, rng);
        let frames = feats.len() / dim.max(1);
        if frames == 0 {
            return Err(Skip::new(
                SkipReason::TooShort,
                utt.key.as_str(),
                format!("expected at least one {} ms window, found {} samples", self.conf.fbank_conf.frame_length, samples.len()),
            ));
        }
        check_finite(&utt.key, &feats, dim)?;
        Ok(Sample { key: utt.key.clone(), feats, frames, dim, label: Vec::new() })
    }
}
