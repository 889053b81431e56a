//! Dumping every utterance's fbank to one safetensors file, keyed by utterance key.
//!
//! Features are taken after resampling and fbank (dither as configured,
//! seeded), before speed perturbation, augmentation and CMVN. The file is
//! built in memory, so a dump is meant for a dev set or a check, not for
//! thousands of hours.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::Dtype;

use crate::data::list::DataList;
use crate::data::par::map_lines;
use crate::data::process::{utt_rng, Processor, Sample};
use crate::data::skip::{Skip, SkipReason, SkipStats};
use crate::error::{Error, Result};

/// Features of every utterance in `list`, in list order, plus the skips.
pub fn compute_feats(list: &DataList, proc: &Processor, num_workers: usize, seed: u64) -> Result<(Vec<Sample>, SkipStats)> {
    let parts = map_lines(list, num_workers, "fbank", |i| {
        let mut out = Vec::new();
        list.for_each_utt(i, |sub, utt| {
            out.push(utt.and_then(|u| proc.features(&u, &mut utt_rng(seed, 0, i, sub))));
            true
        });
        out
    })?;
    let mut samples = Vec::new();
    let mut skips = SkipStats::logging();
    let mut seen = HashSet::new();
    for r in parts.into_iter().flatten() {
        match r {
            Ok(s) if !seen.insert(s.key.clone()) => skips.record(Skip::new(SkipReason::DuplicateKey, s.key, "expected unique keys, found this one again")),
            Ok(s) => samples.push(s),
            Err(skip) => skips.record(skip),
        }
    }
    Ok((samples, skips))
}

/// Writes `samples` as f32 tensors `[frames, dim]` named by key, with `metadata`.
pub fn write_feats(samples: &[Sample], metadata: HashMap<String, String>, path: &Path) -> Result<()> {
    let shown = path.display().to_string();
    let bytes: Vec<Vec<u8>> = samples.iter().map(|s| s.feats.iter().flat_map(|v| v.to_le_bytes()).collect()).collect();
    let mut views = Vec::with_capacity(samples.len());
    for (s, b) in samples.iter().zip(&bytes) {
        let view = TensorView::new(Dtype::F32, vec![s.frames, s.dim], b)
            .map_err(|e| Error::Data { path: shown.clone(), msg: format!("{}: cannot build tensor: {e}", s.key) })?;
        views.push((s.key.clone(), view));
    }
    safetensors::serialize_to_file(views, Some(metadata), path).map_err(|e| Error::Data { path: shown, msg: format!("cannot write safetensors: {e}") })
}

/// One dumped utterance: frames, dim, and the `(frames, dim)` features.
pub type DumpedFeats = (usize, usize, Vec<f32>);

/// Reads a dump back: key → (frames, dim, features).
pub fn read_feats(path: &Path) -> Result<HashMap<String, DumpedFeats>> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| Error::Io { path: shown.clone(), source })?;
    let st =
        safetensors::SafeTensors::deserialize(&bytes).map_err(|e| Error::Data { path: shown.clone(), msg: format!("expected a safetensors file: {e}") })?;
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        let shape = view.shape();
        if view.dtype() != Dtype::F32 || shape.len() != 2 {
            return Err(Error::Data { path: shown, msg: format!("{name}: expected an F32 tensor [frames, dim], found {:?} {:?}", view.dtype(), shape) });
        }
        let v = view.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        out.insert(name, (shape[0], shape[1], v));
    }
    Ok(out)
}
