//! `Dropout`: inverted dropout while training, the identity in eval mode.

use super::module::Module;
use crate::error::Result;
use crate::ops;
use crate::tensor::Tensor;

/// Dropout with probability `p`, drawing from the thread's default generator.
#[derive(Clone, Debug)]
pub struct Dropout {
    /// The drop probability.
    pub p: f64,
    /// Whether masks are drawn (training) or the input passes through (eval).
    pub training: bool,
}

impl Dropout {
    /// A dropout layer in training mode.
    pub fn new(p: f64) -> Self {
        Dropout { p, training: true }
    }

    /// Applies dropout.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::dropout(x, self.p, self.training)
    }
}

impl Module for Dropout {
    fn describe(&self) -> String {
        format!("Dropout(p={})", self.p)
    }
    fn set_own_training(&mut self, training: bool) {
        self.training = training;
    }
}
