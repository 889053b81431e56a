//! Global CMVN statistics in WeNet's JSON (`mean_stat`, `var_stat`,
//! `frame_num`: per-dimension sums of x and x² over all frames, and the frame
//! count), as tools/compute_cmvn_stats.py writes and wenet/utils/cmvn.py reads.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::data::list::DataList;
use crate::data::par::map_lines;
use crate::data::process::{utt_rng, Processor};
use crate::data::skip::SkipStats;
use crate::error::{Error, Result};

/// Sums of features and squared features, and the number of frames.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CmvnStats {
    /// Σ x per dimension.
    pub mean_stat: Vec<f64>,
    /// Σ x² per dimension.
    pub var_stat: Vec<f64>,
    /// Number of frames summed.
    pub frame_num: u64,
}

impl CmvnStats {
    /// Empty statistics of dimension `dim`.
    pub fn new(dim: usize) -> CmvnStats {
        CmvnStats { mean_stat: vec![0.0; dim], var_stat: vec![0.0; dim], frame_num: 0 }
    }

    /// Adds `frames` rows of `(frames, dim)` features.
    pub fn add(&mut self, feats: &[f32], frames: usize) {
        let dim = self.mean_stat.len();
        for row in feats.chunks_exact(dim).take(frames) {
            for (d, &x) in row.iter().enumerate() {
                self.mean_stat[d] += x as f64;
                self.var_stat[d] += x as f64 * x as f64;
            }
        }
        self.frame_num += frames as u64;
    }

    /// Adds another set of statistics of the same dimension.
    pub fn merge(&mut self, other: &CmvnStats) {
        self.mean_stat.iter_mut().zip(&other.mean_stat).for_each(|(a, b)| *a += b);
        self.var_stat.iter_mut().zip(&other.var_stat).for_each(|(a, b)| *a += b);
        self.frame_num += other.frame_num;
    }

    /// Mean and inverse standard deviation per dimension, as WeNet's `load_cmvn`
    /// (variance floored at 1e-20).
    pub fn mean_istd(&self) -> (Vec<f32>, Vec<f32>) {
        let n = self.frame_num.max(1) as f64;
        let mean: Vec<f64> = self.mean_stat.iter().map(|s| s / n).collect();
        let istd = self.var_stat.iter().zip(&mean).map(|(v, m)| (1.0 / (v / n - m * m).max(1e-20).sqrt()) as f32).collect();
        (mean.into_iter().map(|m| m as f32).collect(), istd)
    }

    /// Writes the JSON file.
    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string(self).map_err(|e| Error::Msg(format!("cannot encode CMVN JSON: {e}")))?;
        std::fs::write(path, text).map_err(|source| Error::Io { path: path.display().to_string(), source })
    }

    /// Reads a WeNet CMVN JSON file and checks its shape.
    pub fn read(path: &Path) -> Result<CmvnStats> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: shown.clone(), source })?;
        let s: CmvnStats = serde_json::from_str(&text)
            .map_err(|e| Error::Data { path: shown.clone(), msg: format!("expected CMVN JSON with mean_stat, var_stat, frame_num: {e}") })?;
        if s.mean_stat.len() != s.var_stat.len() || s.frame_num == 0 {
            return Err(Error::Data {
                path: shown,
                msg: format!(
                    "expected equal-length mean_stat/var_stat and frame_num > 0, found {}, {} and {}",
                    s.mean_stat.len(),
                    s.var_stat.len(),
                    s.frame_num
                ),
            });
        }
        Ok(s)
    }
}

/// Statistics over every utterance of `list` (features from `proc.features`,
/// seed 0 for any dither), on `num_workers` threads; bad input is skipped and counted.
pub fn compute_cmvn(list: &DataList, proc: &Processor, num_workers: usize) -> Result<(CmvnStats, SkipStats)> {
    let dim = proc.dim();
    let parts = map_lines(list, num_workers, "cmvn", |i| {
        let mut stats = CmvnStats::new(dim);
        let mut skips = Vec::new();
        list.for_each_utt(i, |sub, utt| {
            match utt.and_then(|u| proc.features(&u, &mut utt_rng(0, 0, i, sub))) {
                Ok(s) => stats.add(&s.feats, s.frames),
                Err(skip) => skips.push(skip),
            }
            true
        });
        (stats, skips)
    })?;
    // Folding in list order keeps the float sums identical for any thread count.
    let mut total = CmvnStats::new(dim);
    let mut skipped = SkipStats::logging();
    for (stats, skips) in parts {
        total.merge(&stats);
        skips.into_iter().for_each(|s| skipped.record(s));
    }
    Ok((total, skipped))
}
