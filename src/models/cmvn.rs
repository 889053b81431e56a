//! Global CMVN: `(x − mean)·istd` per feature, with the statistics from
//! WeNet's JSON file `{"mean_stat", "var_stat", "frame_num"}` (sums and sums
//! of squares over all training frames). Buffers `mean` and `istd`.

use crate::error::{Error, Result};
use crate::nn::{Module, TensorKind};
use crate::ops;
use crate::tensor::{DType, Device, Tensor};

/// The variance floor WeNet applies before inverting.
const VAR_FLOOR: f64 = 1.0e-20;

/// Feature normalisation by global statistics.
#[derive(Clone, Debug)]
pub struct GlobalCmvn {
    /// Per-feature mean [F].
    pub mean: Tensor,
    /// Per-feature inverse standard deviation [F].
    pub istd: Tensor,
}

impl GlobalCmvn {
    /// From a mean and an inverse standard deviation of equal length.
    pub fn new(mean: &[f64], istd: &[f64], dtype: DType) -> Result<Self> {
        if mean.len() != istd.len() {
            return Err(Error::ShapeMismatch {
                op: "GlobalCmvn",
                expected: format!("istd of {} values like the mean", mean.len()),
                got: format!("{} values", istd.len()),
            });
        }
        let t = |v: &[f64]| -> Result<Tensor> { crate::ops::to_dtype(&Tensor::from_vec(v.to_vec(), [v.len()], &Device::Cpu)?, dtype) };
        Ok(GlobalCmvn { mean: t(mean)?, istd: t(istd)? })
    }

    /// The identity normalisation over `dim` features (a placeholder until stats are loaded).
    pub fn identity(dim: usize, dtype: DType) -> Result<Self> {
        GlobalCmvn::new(&vec![0.0; dim], &vec![1.0; dim], dtype)
    }

    /// Reads WeNet's JSON statistics: mean = Σx/n, var = Σx²/n − mean², istd = 1/√max(var, 1e-20).
    pub fn from_json_file(path: &str, dtype: DType) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.to_string(), source })?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::config(path, format!("not valid JSON: {e}")))?;
        let list = |k: &str| -> Result<Vec<f64>> {
            let a = v.get(k).and_then(|x| x.as_array()).ok_or_else(|| Error::config(format!("{path}: {k}"), "missing, expected a list of numbers"))?;
            a.iter().map(|x| x.as_f64().ok_or_else(|| Error::config(format!("{path}: {k}"), format!("expected numbers, found {x}")))).collect()
        };
        let (sum, sq) = (list("mean_stat")?, list("var_stat")?);
        let n = v.get("frame_num").and_then(|x| x.as_f64()).ok_or_else(|| Error::config(format!("{path}: frame_num"), "missing, expected a number"))?;
        if sum.len() != sq.len() || n <= 0.0 {
            return Err(Error::config(
                path,
                format!("expected mean_stat and var_stat of one length and frame_num > 0, found {}, {} and {n}", sum.len(), sq.len()),
            ));
        }
        let mean: Vec<f64> = sum.iter().map(|s| s / n).collect();
        let istd: Vec<f64> = sq.iter().zip(&mean).map(|(q, m)| 1.0 / (q / n - m * m).max(VAR_FLOOR).sqrt()).collect();
        GlobalCmvn::new(&mean, &istd, dtype)
    }

    /// Normalises x (B, T, F).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::mul(&ops::sub(x, &self.mean)?, &self.istd)
    }
}

impl Module for GlobalCmvn {
    fn describe(&self) -> String {
        format!("GlobalCMVN({})", self.mean.elem_count())
    }
    fn own_tensors(&self) -> Vec<(&'static str, Tensor, TensorKind)> {
        vec![("mean", self.mean.clone(), TensorKind::Buffer), ("istd", self.istd.clone(), TensorKind::Buffer)]
    }
}
