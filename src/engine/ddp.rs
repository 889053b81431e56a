//! The DDP engine (`--train_engine torch_ddp` over several processes), with
//! PyTorch DistributedDataParallel's semantics:
//!
//! - at construction every parameter and buffer is broadcast from rank 0,
//!   so ranks start identical whatever their seeds;
//! - gradients are grouped into buckets (`buckets.rs`, default 25 MB, in
//!   reverse parameter order); during a synchronising backward, autograd
//!   reports each parameter when its gradient is final, and a bucket whose
//!   parameters are all final is flattened and handed to the communication
//!   thread, which all-reduces it (average) while backward goes on. Buckets
//!   are launched strictly in bucket order, so every rank issues the same
//!   collectives in the same order whatever order its gradients became
//!   ready in; at the end of backward the remaining buckets are launched,
//!   with zeros (and a "not used" flag) for parameters that got no gradient,
//!   so unused parameters never hang the job;
//! - a non-synchronising backward (`sync == false`: the first micro-batches
//!   of a gradient accumulation, PyTorch's `no_sync`) only accumulates
//!   locally and communicates nothing;
//! - `step` waits for the outstanding buckets, writes the averages back as
//!   gradients, then unscales, clips and updates like one process. The
//!   averaged gradients are bitwise identical on every rank, so the global
//!   norm, the clip coefficient and the inf/NaN decision are too: no extra
//!   communication is needed for them;
//! - buffers (BatchNorm running statistics) are never communicated after
//!   construction: each rank keeps its own, as PyTorch DDP with
//!   `broadcast_buffers=False`;
//! - optionally ([`Ddp::with_half_grad_sync`], WeNet's `--fp16_grad_sync`)
//!   the buckets travel in f16 or bf16, as PyTorch's `fp16_compress_hook`
//!   and `bf16_compress_hook`: each bucket's gradients are divided by the
//!   world size and rounded to the half type, summed, and converted back;
//!   the used flags stay exact (`buckets::compress`). Half the bytes on the
//!   wire, at the price of the half type's rounding in the averaged
//!   gradients (still bitwise equal on every rank).

use super::buckets::{assign_buckets, compress, decompress, flatten, flatten_on_device, unflatten, unflatten_on_device, used_flags_on_device, Bucket};
use super::comm_thread::{CommThread, Pending};
use super::update::{adam_state, load_adam_state, replicated_step};
use super::{Engine, OptimizerState, StepOutcome};
use crate::dist::{Communicator, ReduceOp};
use crate::error::{Error, Result};
use crate::optim::{Adam, AdamConfig, GradScaler};
use crate::tensor::{DType, Device, Tensor, TensorId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// PyTorch's default `bucket_cap_mb` (25 MiB).
pub const DEFAULT_BUCKET_BYTES: usize = 25 * 1024 * 1024;

/// What the engine did, for tests and diagnostics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DdpStats {
    /// Gradient elements per bucket, in bucket (launch) order.
    pub bucket_numels: Vec<usize>,
    /// Backwards that synchronised (the last micro-batch of a step).
    pub sync_backwards: u64,
    /// Backwards that only accumulated locally (`no_sync`).
    pub local_backwards: u64,
    /// Bucket all-reduces issued.
    pub bucket_all_reduces: u64,
    /// Of those, launched from the gradient-ready hook while backward was still running.
    pub launched_during_backward: u64,
    /// Synchronising backwards whose first bucket was launched while backward was still running.
    pub first_bucket_during_backward: u64,
    /// Synchronising backwards during which the communication thread had
    /// already started an all-reduce when backward ended (measured, so it
    /// depends on scheduling).
    pub comm_started_before_backward_end: u64,
    /// Other collectives (cv sums, barriers).
    pub other_collectives: u64,
}

/// The DDP engine.
pub struct Ddp {
    params: Vec<(String, Tensor)>,
    adam: Adam,
    buckets: Vec<Bucket>,
    /// Parameter index by tensor id, and each parameter's bucket.
    index: HashMap<TensorId, usize>,
    bucket_of: Vec<usize>,
    rank: usize,
    world: usize,
    comm: CommThread,
    pending: Vec<(usize, Pending<(Tensor, Instant)>)>,
    backward_end: Option<Instant>,
    stats: Arc<Mutex<DdpStats>>,
    /// Buckets stay on the GPU (the parameters are there and the
    /// communicator reduces device buffers, NCCL); else each bucket comes
    /// to the host once on the training thread.
    device_buckets: bool,
    /// The half type the buckets travel in (`--fp16_grad_sync`), or none: the parameters' dtype.
    grad_sync: Option<DType>,
}

impl Ddp {
    /// Broadcasts `params` and `buffers` from rank 0 over `comm`, then
    /// builds the buckets (`bucket_bytes` each at most) and moves `comm` to
    /// the communication thread.
    pub fn new(params: Vec<(String, Tensor)>, buffers: &[(String, Tensor)], adam: AdamConfig, comm: Box<dyn Communicator>, bucket_bytes: usize) -> Result<Ddp> {
        let mut comm = comm;
        let (rank, world) = (comm.rank(), comm.world_size());
        for (name, t) in params.iter().chain(buffers) {
            comm.broadcast(t, 0).map_err(|e| Error::dist("broadcast", rank, format!("initial broadcast of {name} from rank 0: {e}")))?;
        }
        let sizes: Vec<usize> = params.iter().map(|(_, p)| p.elem_count()).collect();
        let elem_bytes = params.first().map_or(4, |(_, p)| p.dtype().size_in_bytes());
        let buckets = assign_buckets(&sizes, elem_bytes, bucket_bytes);
        let mut bucket_of = vec![0; params.len()];
        for (b, bk) in buckets.iter().enumerate() {
            for &i in &bk.params {
                bucket_of[i] = b;
            }
        }
        let index = params.iter().enumerate().map(|(i, (_, p))| (p.id(), i)).collect();
        let stats = DdpStats { bucket_numels: buckets.iter().map(|b| b.numel).collect(), ..Default::default() };
        let device_buckets = comm.device_collectives() && params.first().is_some_and(|(_, p)| p.device() != Device::Cpu);
        Ok(Ddp {
            adam: Adam::new(params.clone(), adam)?,
            params,
            buckets,
            index,
            bucket_of,
            rank,
            world,
            comm: CommThread::start(comm)?,
            pending: Vec::new(),
            backward_end: None,
            stats: Arc::new(Mutex::new(stats)),
            device_buckets,
            grad_sync: None,
        })
    }

    /// Makes every bucket all-reduce travel in `half` (f16 or bf16; `None`
    /// keeps the parameters' dtype): WeNet's `--fp16_grad_sync`, PyTorch's
    /// `fp16_compress_hook` / `bf16_compress_hook`. Each bucket's gradients
    /// are divided by the world size before they are rounded to `half`
    /// (so the sum cannot overflow where a gradient does not), summed over
    /// the ranks and converted back; the used flags stay exact.
    pub fn with_half_grad_sync(mut self, half: Option<DType>) -> Result<Ddp> {
        if let Some(d) = half {
            if !matches!(d, DType::F16 | DType::BF16) {
                return Err(Error::invalid("Ddp::with_half_grad_sync", format!("expected f16 or bf16 for the gradient all-reduce, found {}", d.as_str())));
            }
        }
        self.grad_sync = half;
        Ok(self)
    }

    /// The half type the gradient buckets travel in (`None`: the parameters' dtype).
    pub fn grad_sync_dtype(&self) -> Option<DType> {
        self.grad_sync
    }

    /// A handle on the engine's counters (stays valid after the engine is boxed).
    pub fn stats(&self) -> Arc<Mutex<DdpStats>> {
        self.stats.clone()
    }

    fn update_stats(&self, f: impl FnOnce(&mut DdpStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn launch(&mut self, b: usize) -> Result<()> {
        // A half-precision bucket carries the world size as its used flag, so that it is exactly 1 after compress's division.
        let flag = if self.grad_sync.is_some() { self.world as f64 } else { 1.0 };
        let flat = if self.device_buckets { flatten_on_device(&self.buckets[b], &self.params, flag)? } else { flatten(&self.buckets[b], &self.params, flag)? };
        // In half precision the bucket is pre-divided and summed; else averaged.
        let (flat, op) = match self.grad_sync {
            Some(half) => (compress(&self.buckets[b], &flat, self.world, half)?, ReduceOp::Sum),
            None => (flat, ReduceOp::Avg),
        };
        let p = self.comm.submit("all_reduce", move |c| {
            let t0 = Instant::now();
            c.all_reduce(&flat, op)?;
            Ok((flat, t0))
        })?;
        self.pending.push((b, p));
        Ok(())
    }

    /// Backward with the gradient-ready hook, launching complete buckets in bucket order.
    fn sync_backward(&mut self, loss: &Tensor) -> Result<()> {
        let nb = self.buckets.len();
        let mut ready = vec![0usize; nb];
        let mut marked = vec![false; self.params.len()];
        let mut next = 0usize;
        let mut in_hook = 0u64;
        let r = {
            let this = &mut *self;
            crate::autograd::backward_with_hooks(loss, &mut |leaf: &Tensor| {
                let Some(&i) = this.index.get(&leaf.id()) else { return Ok(()) };
                if std::mem::replace(&mut marked[i], true) {
                    return Ok(());
                }
                ready[this.bucket_of[i]] += 1;
                while next < nb && ready[next] == this.buckets[next].params.len() {
                    this.launch(next)?;
                    next += 1;
                    in_hook += 1;
                }
                Ok(())
            })
        };
        // Whatever happened, launch every remaining bucket so that this
        // rank issues the same collectives as the others.
        let rest: Result<()> = (next..nb).try_for_each(|b| self.launch(b));
        self.backward_end = Some(Instant::now());
        self.update_stats(|s| {
            s.sync_backwards += 1;
            s.bucket_all_reduces += nb as u64;
            s.launched_during_backward += in_hook;
            s.first_bucket_during_backward += u64::from(in_hook > 0);
        });
        r.and(rest)
    }

    /// Waits for the launched buckets and writes their averages back as gradients.
    fn finish_reduction(&mut self) -> Result<()> {
        let mut started_early = false;
        let mut first_err = None;
        let mut done = Vec::new();
        for (b, p) in std::mem::take(&mut self.pending) {
            match p.wait() {
                Ok((flat, t0)) => {
                    started_early |= self.backward_end.is_some_and(|end| t0 < end);
                    // A half-precision bucket comes back to the parameters' dtype (on its device).
                    match self.grad_sync.map(|_| decompress(&self.buckets[b], &self.params, &flat)).transpose() {
                        Ok(back) => done.push((b, back.unwrap_or(flat))),
                        Err(e) => {
                            first_err.get_or_insert(e);
                        }
                    }
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if first_err.is_none() {
            let r = if self.device_buckets {
                // Every bucket's used flags in one read, then the gradients cut on the device.
                let pairs: Vec<(&Bucket, &Tensor)> = done.iter().map(|(b, f)| (&self.buckets[*b], f)).collect();
                used_flags_on_device(&pairs)
                    .and_then(|used| done.iter().zip(&used).try_for_each(|((b, flat), u)| unflatten_on_device(&self.buckets[*b], &self.params, flat, u)))
            } else {
                done.iter().try_for_each(|(b, flat)| unflatten(&self.buckets[*b], &self.params, flat))
            };
            if let Err(e) = r {
                first_err = Some(e);
            }
        }
        if self.backward_end.take().is_some() && started_early {
            self.update_stats(|s| s.comm_started_before_backward_end += 1);
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Engine for Ddp {
    fn parameters(&self) -> &[(String, Tensor)] {
        &self.params
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn backward(&mut self, loss: &Tensor, sync: bool) -> Result<()> {
        if !sync {
            self.update_stats(|s| s.local_backwards += 1);
            return crate::autograd::backward(loss);
        }
        if !self.pending.is_empty() {
            return Err(Error::dist("backward", self.rank, "a synchronising backward ran twice without a step in between"));
        }
        self.sync_backward(loss)
    }
    fn step(&mut self, lr: f64, grad_clip: f64, scaler: Option<&mut GradScaler>) -> Result<StepOutcome> {
        self.finish_reduction()?;
        replicated_step(&self.params, &mut self.adam, lr, grad_clip, scaler)
    }
    fn zero_grad(&mut self) {
        // Buckets already launched still complete on every rank; their results are dropped.
        let _ = self.finish_reduction();
        self.adam.zero_grad();
    }
    fn all_reduce_sum(&mut self, values: &mut [f64]) -> Result<()> {
        let t = Tensor::from_vec(values.to_vec(), vec![values.len()], &Device::Cpu)?;
        let out = self
            .comm
            .submit("all_reduce", move |c| {
                c.all_reduce(&t, ReduceOp::Sum)?;
                t.to_vec::<f64>()
            })?
            .wait()?;
        values.copy_from_slice(&out);
        self.update_stats(|s| s.other_collectives += 1);
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
    fn abort(&mut self, reason: &str) {
        // Queued behind any collective still in flight; the thread runs it before it ends (dropping the engine joins it).
        let reason = reason.to_string();
        let _ = self.comm.submit("abort", move |c| {
            c.abort(&reason);
            Ok(())
        });
    }
}
