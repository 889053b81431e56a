//! `LayerNorm` over the last dim and `BatchNorm1d` over channels, with
//! PyTorch's defaults (eps 1e-5, affine, BatchNorm momentum 0.1).

use super::init::full_param;
use super::module::{Module, TensorKind};
use super::Dropout;
use crate::error::Result;
use crate::ops::{self, BatchNormState};
use crate::tensor::{DType, Device, Tensor};

/// Layer normalisation over the last dim with a learned scale and shift.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    /// Scale [d], initialised to ones.
    pub weight: Tensor,
    /// Shift [d], initialised to zeros.
    pub bias: Tensor,
    /// Added to the variance.
    pub eps: f64,
}

impl LayerNorm {
    /// A new layer over `d` features.
    pub fn new(d: usize, eps: f64, dtype: DType) -> Result<Self> {
        Ok(LayerNorm { weight: full_param(&[d], 1.0, dtype)?, bias: full_param(&[d], 0.0, dtype)?, eps })
    }

    /// Normalises the last dim of `x`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::layer_norm(x, Some(&self.weight), Some(&self.bias), self.eps)
    }

    /// The residual add before this norm and the norm, fused
    /// (`ops::add_layer_norm_masked`): `(s, h)` with `s = x +
    /// alpha·dropout(y)`, `h` = this layer's norm of `s` (the branch's
    /// dropout folded in while it trains); y's rows that `rows` marks (the
    /// branch's padded frames) are zeroed first.
    pub fn add_forward(&self, x: &Tensor, y: &Tensor, rows: Option<&Tensor>, alpha: f64, dropout: &Dropout) -> Result<(Tensor, Tensor)> {
        let p = if dropout.training { dropout.p } else { 0.0 };
        ops::add_layer_norm_masked(x, y, rows, alpha, p, Some(&self.weight), Some(&self.bias), self.eps)
    }
}

impl Module for LayerNorm {
    fn describe(&self) -> String {
        format!("LayerNorm(({},), eps={:e})", self.weight.dims()[0], self.eps)
    }
    fn own_tensors(&self) -> Vec<(&'static str, Tensor, TensorKind)> {
        vec![("weight", self.weight.clone(), TensorKind::Param), ("bias", self.bias.clone(), TensorKind::Param)]
    }
}

/// Batch normalisation over the channel dim of (B, C) or (B, C, T).
#[derive(Clone, Debug)]
pub struct BatchNorm1d {
    /// Scale [C].
    pub weight: Tensor,
    /// Shift [C].
    pub bias: Tensor,
    /// Running mean [C] (updated in place while training).
    pub running_mean: Tensor,
    /// Running unbiased variance [C].
    pub running_var: Tensor,
    /// How many training batches have updated the statistics (an i64 0-dim tensor).
    pub num_batches_tracked: Tensor,
    /// Weight of a new batch in the running statistics.
    pub momentum: f64,
    /// Added to the variance.
    pub eps: f64,
    /// Batch statistics (training) or running statistics (eval).
    pub training: bool,
}

impl BatchNorm1d {
    /// A new layer over `c` channels in training mode.
    pub fn new(c: usize, eps: f64, dtype: DType) -> Result<Self> {
        let cpu = Device::Cpu;
        Ok(BatchNorm1d {
            weight: full_param(&[c], 1.0, dtype)?,
            bias: full_param(&[c], 0.0, dtype)?,
            running_mean: Tensor::zeros([c], dtype, &cpu)?,
            running_var: Tensor::ones([c], dtype, &cpu)?,
            num_batches_tracked: Tensor::zeros((), DType::I64, &cpu)?,
            momentum: 0.1,
            eps,
            training: true,
        })
    }

    /// Normalises `x`; in training mode also moves the running statistics.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // Half activations (autocast) are normalised in f32 against the f32
        // parameters and statistics by batch_norm itself (no casts).
        let y = ops::batch_norm(x, &self.weight, &self.bias, &self.state())?;
        self.count_batch()?;
        Ok(y)
    }

    /// The running statistics and options an op normalising for this layer takes.
    pub fn state(&self) -> BatchNormState<'_> {
        BatchNormState { running_mean: &self.running_mean, running_var: &self.running_var, momentum: self.momentum, eps: self.eps, training: self.training }
    }

    /// Counts one batch in `num_batches_tracked` when training (after an op
    /// moved the running statistics with [`BatchNorm1d::state`]).
    pub fn count_batch(&self) -> Result<()> {
        if self.training {
            let n = self.num_batches_tracked.to_vec::<i64>()?.first().copied().unwrap_or(0);
            self.num_batches_tracked.assign(&Tensor::from_vec(vec![n + 1], (), &Device::Cpu)?)?;
        }
        Ok(())
    }
}

impl Module for BatchNorm1d {
    fn describe(&self) -> String {
        format!("BatchNorm1d({}, eps={:e}, momentum={})", self.weight.dims()[0], self.eps, self.momentum)
    }
    fn own_tensors(&self) -> Vec<(&'static str, Tensor, TensorKind)> {
        vec![
            ("weight", self.weight.clone(), TensorKind::Param),
            ("bias", self.bias.clone(), TensorKind::Param),
            ("running_mean", self.running_mean.clone(), TensorKind::Buffer),
            ("running_var", self.running_var.clone(), TensorKind::Buffer),
            ("num_batches_tracked", self.num_batches_tracked.clone(), TensorKind::Buffer),
        ]
    }
    fn set_own_training(&mut self, training: bool) {
        self.training = training;
    }
}
