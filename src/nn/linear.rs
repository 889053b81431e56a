//! `Linear`: `y = x·Wᵀ + b` with W of shape [out, in], as `torch.nn.Linear`.

use super::init::{kaiming_uniform_bound, uniform_param};
use super::module::{Module, TensorKind};
use crate::error::Result;
use crate::ops;
use crate::tensor::{DType, Rng, Tensor};

/// A fully connected layer (kaiming-uniform weight, uniform bias in ±1/√in).
#[derive(Clone, Debug)]
pub struct Linear {
    /// Weight [out, in].
    pub weight: Tensor,
    /// Bias [out], if any.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A new layer with PyTorch's default initialisation.
    pub fn new(in_features: usize, out_features: usize, bias: bool, dtype: DType, rng: &mut Rng) -> Result<Self> {
        let bound = kaiming_uniform_bound(in_features);
        let weight = uniform_param(&[out_features, in_features], bound, dtype, rng)?;
        let bias = if bias { Some(uniform_param(&[out_features], bound, dtype, rng)?) } else { None };
        Ok(Linear { weight, bias })
    }

    /// Applies the layer to the last dim of `x`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::linear(x, &self.weight, self.bias.as_ref())
    }

    /// Input features.
    pub fn in_features(&self) -> usize {
        self.weight.dims()[1]
    }

    /// Output features.
    pub fn out_features(&self) -> usize {
        self.weight.dims()[0]
    }
}

impl Module for Linear {
    fn describe(&self) -> String {
        format!("Linear(in_features={}, out_features={}, bias={})", self.in_features(), self.out_features(), self.bias.is_some())
    }
    fn own_tensors(&self) -> Vec<(&'static str, Tensor, TensorKind)> {
        let mut v = vec![("weight", self.weight.clone(), TensorKind::Param)];
        if let Some(b) = &self.bias {
            v.push(("bias", b.clone(), TensorKind::Param));
        }
        v
    }
}
