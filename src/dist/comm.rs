//! The `Communicator` trait: the collectives the engines and the join group
//! use, on tensors, with a timeout per call. Two implementations: the TCP
//! ring for CPU tensors (`dist::tcp`, the role gloo plays for PyTorch) and
//! NCCL for GPU tensors (the NCCL issue).
//!
//! Contracts every implementation keeps:
//! - Every rank calls the same collectives in the same order with tensors of
//!   the same shape and dtype; a mismatch that can be detected is an error.
//! - Results are bitwise identical on every rank (a fixed reduction order).
//! - A call that does not complete within the timeout returns
//!   `Error::Dist` naming the ranks that did not answer; it never hangs.
//! - Collectives write in place (`all_reduce`, `broadcast`) or into a
//!   caller-allocated output (`all_gather`, `reduce_scatter`).

use crate::error::Result;
use crate::tensor::{Device, Tensor};
use std::time::Duration;

/// How `all_reduce` / `reduce_scatter` combine the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Elementwise sum.
    Sum,
    /// Elementwise sum divided by the world size.
    Avg,
    /// Elementwise maximum.
    Max,
    /// Elementwise minimum.
    Min,
}

/// A group of `world_size` processes that run collectives together.
pub trait Communicator: Send {
    /// This process's rank in the group.
    fn rank(&self) -> usize;
    /// Number of processes in the group.
    fn world_size(&self) -> usize;
    /// The per-call timeout.
    fn timeout(&self) -> Duration;
    /// Sets the per-call timeout.
    fn set_timeout(&mut self, timeout: Duration);

    /// Replaces `t` on every rank with the reduction of every rank's `t`.
    fn all_reduce(&mut self, t: &Tensor, op: ReduceOp) -> Result<()>;
    /// Replaces `t` on every rank with rank `root`'s `t`.
    fn broadcast(&mut self, t: &Tensor, root: usize) -> Result<()>;
    /// Writes every rank's `input` into `output`, rank r's at elements
    /// `[r * n, (r + 1) * n)` where `n = input.elem_count()`;
    /// `output.elem_count()` must be `world_size * n`.
    fn all_gather(&mut self, input: &Tensor, output: &Tensor) -> Result<()>;
    /// Reduces every rank's `input` and writes chunk r of the result
    /// (elements `[r * n, (r + 1) * n)`, `n = output.elem_count()`) into rank
    /// r's `output`; `input.elem_count()` must be `world_size * n`.
    fn reduce_scatter(&mut self, input: &Tensor, output: &Tensor, op: ReduceOp) -> Result<()>;
    /// Returns once every rank has entered the barrier.
    fn barrier(&mut self) -> Result<()>;
    /// Whether collectives on device tensors run on the device (NCCL), so
    /// engines should hand it device buffers rather than host copies; false
    /// for a host-side communicator (TCP), which stages device tensors
    /// through the host itself.
    fn device_collectives(&self) -> bool {
        false
    }
    /// Tells every peer that this process gives up and why (an error on
    /// another communicator of the job, or outside any collective), so their
    /// current or next call fails with `reason` rather than with "rank r
    /// closed its connection"; the communicator is unusable afterwards. Does
    /// nothing after a failed call (the peers were told then) or on one process.
    fn abort(&mut self, _reason: &str) {}

    /// All-reduces a few f64 values in place (loss sums, squared gradient
    /// norms, utterance counts) without building a tensor by hand.
    fn all_reduce_f64(&mut self, values: &mut [f64], op: ReduceOp) -> Result<()> {
        let t = Tensor::from_vec(values.to_vec(), vec![values.len()], &Device::Cpu)?;
        self.all_reduce(&t, op)?;
        values.copy_from_slice(&t.to_vec::<f64>()?);
        Ok(())
    }
}
