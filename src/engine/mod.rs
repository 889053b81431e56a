//! Engines: what wraps the model's parameters and the optimizer for a
//! training step. `SingleProcess` (one process), `ddp` (PyTorch DDP:
//! bucketed gradient all-reduce overlapping backward) and `zero`
//! (DeepSpeed ZeRO stage 1/2: sharded optimizer state, and for stage 2
//! sharded gradients). Each owns its Adam; the executor owns the schedule
//! and the loss scaler and calls the engine once per micro-batch
//! (`backward`) and once per optimizer step (`step`).

pub mod buckets;
pub mod comm_thread;
pub mod ddp;
pub mod deepspeed;
mod deepspeed_json;
pub mod flat;
pub mod single;
pub mod update;
pub mod zero;
pub mod zero_state;

pub use ddp::{Ddp, DdpStats, DEFAULT_BUCKET_BYTES};
pub use single::SingleProcess;
pub use zero::{ZeroEngine, ZeroOptions, ZeroStats};

use crate::error::Result;
use crate::optim::GradScaler;
use crate::tensor::Tensor;
use std::collections::BTreeMap;

/// What one optimizer step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepOutcome {
    /// The global gradient norm (over every rank's shard) before clipping,
    /// after unscaling.
    pub grad_norm: f64,
    /// Whether the update was skipped (inf/NaN gradient on any rank).
    pub skipped: bool,
}

/// The optimizer state one rank saves for an exact resume.
#[derive(Clone, Debug, Default)]
pub struct OptimizerState {
    /// Adam's step count.
    pub step: u64,
    /// Tensors by name (moments; for ZeRO the rank's flat shards).
    pub tensors: Vec<(String, Tensor)>,
    /// String metadata (for ZeRO: world size, rank, flat layout).
    pub meta: BTreeMap<String, String>,
}

/// The interface `wrap_model` returns and the executor drives.
pub trait Engine {
    /// The model's trainable parameters, by name (full tensors on every rank).
    fn parameters(&self) -> &[(String, Tensor)];
    /// This process's rank.
    fn rank(&self) -> usize;
    /// Number of processes taking part.
    fn world_size(&self) -> usize;
    /// Backward of one micro-batch's loss (already divided by `accum_grad`
    /// and multiplied by the loss scale). `sync` is true on the last
    /// micro-batch of an accumulation; only then do engines communicate.
    fn backward(&mut self, loss: &Tensor, sync: bool) -> Result<()>;
    /// After the accumulation's last backward: make the gradients global,
    /// unscale them with `scaler`, clip the global norm to `grad_clip`
    /// (no clipping when `grad_clip <= 0`), update at `lr` unless a gradient is
    /// inf/NaN on any rank, and clear the gradients. The scaler's `update`
    /// and the schedule's step stay with the caller.
    fn step(&mut self, lr: f64, grad_clip: f64, scaler: Option<&mut GradScaler>) -> Result<StepOutcome>;
    /// Clears the gradients (after a failed batch).
    fn zero_grad(&mut self);
    /// Sums `values` over every rank in place (cv losses and counts); the identity on one process.
    fn all_reduce_sum(&mut self, values: &mut [f64]) -> Result<()>;
    /// Whether each rank saves its own optimizer state (ZeRO) rather than rank 0 saving one for all.
    fn sharded_state(&self) -> bool;
    /// The optimizer state this rank saves.
    fn optimizer_state(&self) -> Result<OptimizerState>;
    /// Restores from the states the saving job wrote, one per saving rank in
    /// rank order (one for an unsharded engine). A sharded engine re-shards
    /// when their number differs from this job's world size.
    fn load_optimizer_state(&mut self, saved: &[OptimizerState]) -> Result<()>;
    /// Tells the other ranks why this one gives up (see
    /// `Communicator::abort`); nothing on one process.
    fn abort(&mut self, _reason: &str) {}
}
