//! One process: backward straight onto the parameters, nothing to reduce.

use super::update::{adam_state, load_adam_state, replicated_step};
use super::{Engine, OptimizerState, StepOutcome};
use crate::error::Result;
use crate::optim::{Adam, AdamConfig, GradScaler};
use crate::tensor::Tensor;

/// The single-process engine: the model's parameters and their Adam.
pub struct SingleProcess {
    params: Vec<(String, Tensor)>,
    adam: Adam,
}

impl SingleProcess {
    /// An engine over the model's parameters with a fresh Adam.
    pub fn new(params: Vec<(String, Tensor)>, adam: AdamConfig) -> Result<Self> {
        Ok(SingleProcess { adam: Adam::new(params.clone(), adam)?, params })
    }
}

impl Engine for SingleProcess {
    fn parameters(&self) -> &[(String, Tensor)] {
        &self.params
    }
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn backward(&mut self, loss: &Tensor, _sync: bool) -> Result<()> {
        crate::autograd::backward(loss)
    }
    fn step(&mut self, lr: f64, grad_clip: f64, scaler: Option<&mut GradScaler>) -> Result<StepOutcome> {
        replicated_step(&self.params, &mut self.adam, lr, grad_clip, scaler)
    }
    fn zero_grad(&mut self) {
        self.adam.zero_grad();
    }
    fn all_reduce_sum(&mut self, _values: &mut [f64]) -> Result<()> {
        Ok(())
    }
    fn sharded_state(&self) -> bool {
        false
    }
    fn optimizer_state(&self) -> Result<OptimizerState> {
        Ok(adam_state(&self.adam))
    }
    fn load_optimizer_state(&mut self, saved: &[OptimizerState]) -> Result<()> {
        load_adam_state(&mut self.adam, saved)
    }
}
