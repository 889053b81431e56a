//! `Embedding`: a lookup table [num, dim] initialised N(0, 1), as `torch.nn.Embedding`.

use super::module::{Module, TensorKind};
use crate::error::Result;
use crate::ops;
use crate::tensor::{DType, Device, Rng, Tensor};

/// A token embedding table.
#[derive(Clone, Debug)]
pub struct Embedding {
    /// The table [num_embeddings, dim].
    pub weight: Tensor,
}

impl Embedding {
    /// A new table drawn from the standard normal.
    pub fn new(num: usize, dim: usize, dtype: DType, rng: &mut Rng) -> Result<Self> {
        Ok(Embedding { weight: Tensor::randn([num, dim], 0.0, 1.0, dtype, rng, &Device::Cpu)?.requires_grad_() })
    }

    /// The rows for `ids` (i64, any shape) → ids.shape + [dim].
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        ops::embedding(&self.weight, ids)
    }
}

impl Module for Embedding {
    fn describe(&self) -> String {
        format!("Embedding({}, {})", self.weight.dims()[0], self.weight.dims()[1])
    }
    fn own_tensors(&self) -> Vec<(&'static str, Tensor, TensorKind)> {
        vec![("weight", self.weight.clone(), TensorKind::Param)]
    }
}
