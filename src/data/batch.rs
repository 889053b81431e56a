//! Shuffle and sort buffers, static and dynamic batching, and padding into a
//! typed [`Batch`] — WeNet's `shuffle`, `sort`, `batch` and `padding`.

use crate::data::config::BatchConf;
use crate::data::process::Sample;
use crate::error::{Error, Result};
use crate::tensor::rng::Rng;
use crate::tensor::{Device, Tensor};

/// Padded features and targets of several utterances, longest first.
#[derive(Clone, Debug)]
pub struct Batch {
    /// Utterance keys, in batch order.
    pub keys: Vec<String>,
    /// Features `[B, T, F]` f32, zero-padded past each length.
    pub feats: Tensor,
    /// Frames of each utterance (descending).
    pub feats_lengths: Vec<usize>,
    /// Token ids `[B, L]` i64, padded with -1.
    pub target: Tensor,
    /// Tokens of each utterance.
    pub target_lengths: Vec<usize>,
}

impl Batch {
    /// Number of utterances.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the batch is empty (never true for a batch the loader yields).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The same batch with its features on `device`, through reused pinned
    /// staging buffers on a GPU. The targets, lengths and keys stay on the
    /// host: every consumer of the targets (the CTC and attention losses,
    /// the decoder's sos/eos inputs, the accuracy) reads their values on the
    /// host, so a device copy would only be read back, a wait in every step.
    pub fn to_device(&self, device: &Device) -> Result<Batch> {
        Ok(Batch { feats: self.feats.clone().to_device_staged(device)?, ..self.clone() })
    }

    /// `feats_lengths` as an i64 tensor `[B]`.
    pub fn feats_lengths_tensor(&self) -> Result<Tensor> {
        let v: Vec<i64> = self.feats_lengths.iter().map(|&n| n as i64).collect();
        Tensor::from_vec(v, [self.len()], &Device::Cpu)
    }

    /// `target_lengths` as an i64 tensor `[B]`.
    pub fn target_lengths_tensor(&self) -> Result<Tensor> {
        let v: Vec<i64> = self.target_lengths.iter().map(|&n| n as i64).collect();
        Tensor::from_vec(v, [self.len()], &Device::Cpu)
    }
}

/// The padding value of targets, as WeNet's `IGNORE_ID`.
pub const IGNORE_ID: i64 = -1;

/// Pads `samples` into a batch sorted by frames, longest first (stable among equals).
pub fn pad(mut samples: Vec<Sample>) -> Result<Batch> {
    if samples.is_empty() {
        return Err(Error::invalid("pad", "expected at least one sample, found none"));
    }
    samples.sort_by_key(|s| std::cmp::Reverse(s.frames));
    let dim = samples[0].dim;
    if let Some(s) = samples.iter().find(|s| s.dim != dim) {
        return Err(Error::ShapeMismatch { op: "pad", expected: format!("feature dim {dim}"), got: format!("{} for {}", s.dim, s.key) });
    }
    if let Some(s) = samples.iter().find(|s| s.feats.len() < s.frames * s.dim) {
        return Err(Error::ShapeMismatch {
            op: "pad",
            expected: format!("{} x {} features for {}", s.frames, s.dim, s.key),
            got: format!("{} values", s.feats.len()),
        });
    }
    let b = samples.len();
    let t = samples[0].frames;
    let l = samples.iter().map(|s| s.label.len()).max().unwrap_or(0);
    let mut feats = vec![0.0f32; b * t * dim];
    let mut target = vec![IGNORE_ID; b * l];
    for (i, s) in samples.iter().enumerate() {
        feats[i * t * dim..i * t * dim + s.frames * dim].copy_from_slice(&s.feats[..s.frames * dim]);
        target[i * l..i * l + s.label.len()].copy_from_slice(&s.label);
    }
    Ok(Batch {
        keys: samples.iter().map(|s| s.key.clone()).collect(),
        feats: Tensor::from_vec(feats, [b, t, dim], &Device::Cpu)?,
        feats_lengths: samples.iter().map(|s| s.frames).collect(),
        target: Tensor::from_vec(target, [b, l], &Device::Cpu)?,
        target_lengths: samples.iter().map(|s| s.label.len()).collect(),
    })
}

/// Fisher-Yates shuffle driven by `rng`.
pub fn shuffle<T>(items: &mut [T], rng: &mut Rng) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i + 1);
        items.swap(i, j);
    }
}

/// How samples are grouped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchMode {
    /// A fixed number of utterances.
    Static(usize),
    /// At most this many padded frames (utterances × longest).
    Dynamic(usize),
}

impl BatchMode {
    /// From a `batch_conf` (already validated).
    pub fn from_conf(conf: &BatchConf) -> BatchMode {
        if conf.batch_type == "dynamic" {
            BatchMode::Dynamic(conf.max_frames_in_batch.max(1))
        } else {
            BatchMode::Static(conf.batch_size.max(1))
        }
    }
}

/// Groups a stream of samples into batches.
#[derive(Debug)]
pub struct Batcher {
    mode: BatchMode,
    buf: Vec<Sample>,
    longest: usize,
}

impl Batcher {
    /// An empty batcher.
    pub fn new(mode: BatchMode) -> Batcher {
        Batcher { mode, buf: Vec::new(), longest: 0 }
    }

    /// Adds a sample; returns a full batch when one is complete. In dynamic
    /// mode the caller must not pass a sample longer than the budget alone.
    pub fn push(&mut self, s: Sample) -> Option<Vec<Sample>> {
        match self.mode {
            BatchMode::Static(n) => {
                self.buf.push(s);
                (self.buf.len() >= n).then(|| std::mem::take(&mut self.buf))
            }
            BatchMode::Dynamic(max) => {
                // WeNet's rule: close the batch before the one that would push
                // (count + 1) × longest past the budget.
                let longest = self.longest.max(s.frames);
                if !self.buf.is_empty() && longest * (self.buf.len() + 1) > max {
                    let out = std::mem::take(&mut self.buf);
                    self.longest = s.frames;
                    self.buf.push(s);
                    Some(out)
                } else {
                    self.longest = longest;
                    self.buf.push(s);
                    None
                }
            }
        }
    }

    /// Whether `s` can ever fit a batch (dynamic mode: alone within the budget).
    pub fn fits(&self, s: &Sample) -> bool {
        match self.mode {
            BatchMode::Static(_) => true,
            BatchMode::Dynamic(max) => s.frames <= max,
        }
    }

    /// The last, partial batch.
    pub fn flush(&mut self) -> Option<Vec<Sample>> {
        self.longest = 0;
        (!self.buf.is_empty()).then(|| std::mem::take(&mut self.buf))
    }
}

/// A buffer that shuffles every `size` samples (WeNet's `shuffle`).
#[derive(Debug)]
pub struct ShuffleBuffer {
    size: usize,
    buf: Vec<Sample>,
    rng: Rng,
}

impl ShuffleBuffer {
    /// A buffer of `size` (at least 1) driven by `rng`.
    pub fn new(size: usize, rng: Rng) -> ShuffleBuffer {
        ShuffleBuffer { size: size.max(1), buf: Vec::new(), rng }
    }

    /// Adds a sample; returns the shuffled buffer when full.
    pub fn push(&mut self, s: Sample) -> Option<Vec<Sample>> {
        self.buf.push(s);
        (self.buf.len() >= self.size).then(|| self.flush())
    }

    /// The remaining samples, shuffled.
    pub fn flush(&mut self) -> Vec<Sample> {
        let mut out = std::mem::take(&mut self.buf);
        shuffle(&mut out, &mut self.rng);
        out
    }
}

/// A buffer that sorts every `size` samples by frames, shortest first (WeNet's `sort`).
#[derive(Debug)]
pub struct SortBuffer {
    size: usize,
    buf: Vec<Sample>,
}

impl SortBuffer {
    /// A buffer of `size` (at least 1).
    pub fn new(size: usize) -> SortBuffer {
        SortBuffer { size: size.max(1), buf: Vec::new() }
    }

    /// Adds a sample; returns the sorted buffer when full.
    pub fn push(&mut self, s: Sample) -> Option<Vec<Sample>> {
        self.buf.push(s);
        (self.buf.len() >= self.size).then(|| self.flush())
    }

    /// The remaining samples, sorted (stable).
    pub fn flush(&mut self) -> Vec<Sample> {
        let mut out = std::mem::take(&mut self.buf);
        out.sort_by_key(|s| s.frames);
        out
    }
}
