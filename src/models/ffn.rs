//! The position-wise feed-forward block `w_2(dropout(act(w_1·x)))` and the
//! activations the configs name.

use super::config::Activation;
use crate::backend::cpu::elementwise::Unary;
use crate::error::Result;
use crate::nn::{Dropout, Linear, Module};
use crate::ops;
use crate::tensor::{DType, Rng, Tensor};

/// The elementwise map of an activation.
pub fn unary_of(act: Activation) -> Unary {
    match act {
        Activation::Relu => Unary::Relu,
        Activation::Swish => Unary::Silu,
        Activation::Gelu => Unary::Gelu,
        Activation::Tanh => Unary::Tanh,
    }
}

/// Applies an activation.
pub fn activate(act: Activation, x: &Tensor) -> Result<Tensor> {
    match act {
        Activation::Relu => ops::relu(x),
        Activation::Swish => ops::silu(x),
        Activation::Gelu => ops::gelu(x),
        Activation::Tanh => ops::tanh(x),
    }
}

/// WeNet's PositionwiseFeedForward: d → units → d.
#[derive(Clone, Debug)]
pub struct FeedForward {
    /// d → units.
    pub w_1: Linear,
    /// units → d.
    pub w_2: Linear,
    /// Dropout after the activation.
    pub dropout: Dropout,
    /// The activation.
    pub act: Activation,
}

impl FeedForward {
    /// A block over `d` features with `units` hidden units.
    pub fn new(d: usize, units: usize, dropout: f64, act: Activation, dtype: DType, rng: &mut Rng) -> Result<Self> {
        Ok(FeedForward { w_1: Linear::new(d, units, true, dtype, rng)?, w_2: Linear::new(units, d, true, dtype, rng)?, dropout: Dropout::new(dropout), act })
    }

    /// Applies the block to the last dim.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.w_1.forward(x)?;
        // Fused (the fusion switch's `ffn` family): the activation and the
        // dropout in one launch each way, the same bits.
        let h = if ops::fusion::enabled(ops::fusion::Fusion::Ffn) {
            ops::activation_dropout(&h, unary_of(self.act), self.dropout.p, self.dropout.training)?
        } else {
            self.dropout.forward(&activate(self.act, &h)?)?
        };
        self.w_2.forward(&h)
    }
}

impl Module for FeedForward {
    fn describe(&self) -> String {
        format!("PositionwiseFeedForward(activation={:?})", self.act)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("w_1".into(), &self.w_1), ("dropout".into(), &self.dropout), ("w_2".into(), &self.w_2)]
    }
    fn children_mut(&mut self) -> Vec<&mut dyn Module> {
        vec![&mut self.w_1, &mut self.dropout, &mut self.w_2]
    }
}
