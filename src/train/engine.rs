//! The training engine: what wraps the model for a step. Single-process
//! now; the DDP and ZeRO engines implement the same trait later.

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// What the executor needs from an engine.
pub trait Engine {
    /// The trainable parameters the optimizer updates, by name.
    fn parameters(&self) -> &[(String, Tensor)];
    /// Makes every rank's gradients the average over ranks (a no-op on one process).
    fn reduce_gradients(&mut self) -> Result<()>;
    /// Number of processes taking part.
    fn world_size(&self) -> usize;
}

/// One process: nothing to reduce.
pub struct SingleProcess {
    params: Vec<(String, Tensor)>,
}

impl SingleProcess {
    /// An engine over the model's parameters.
    pub fn new(params: Vec<(String, Tensor)>) -> Self {
        SingleProcess { params }
    }
}

impl Engine for SingleProcess {
    fn parameters(&self) -> &[(String, Tensor)] {
        &self.params
    }
    fn reduce_gradients(&mut self) -> Result<()> {
        Ok(())
    }
    fn world_size(&self) -> usize {
        1
    }
}

/// WeNet's `wrap_model`: the engine `--train_engine` names (only the single-process torch_ddp for now).
pub fn wrap_model(model: &crate::models::AsrModel, args: &super::TrainArgs, dist: &super::DistInfo) -> Result<Box<dyn Engine>> {
    use crate::nn::Module;
    match args.train_engine.as_str() {
        "torch_ddp" if dist.world_size == 1 => Ok(Box::new(SingleProcess::new(model.named_parameters()))),
        "torch_ddp" => Err(Error::config("--train_engine", format!("torch_ddp over {} processes is not yet supported", dist.world_size))),
        "deepspeed" => Err(Error::config("--train_engine", "deepspeed (ZeRO) is not yet supported; use torch_ddp")),
        other => Err(Error::config("--train_engine", format!("expected torch_ddp or deepspeed, found {other:?}"))),
    }
}
