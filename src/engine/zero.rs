//! The ZeRO engine (DeepSpeed's stage 1 and 2) over a `Communicator`.
//!
//! Every parameter lies in one flat f32 buffer padded to a multiple of the
//! world size (`engine::flat`); rank r owns shard r and keeps only that
//! shard's f32 master copy and Adam moments. After an accumulation:
//!   g_shard = reduce_scatter_avg(g_flat)          (bucketed, `reduce_bucket_size`)
//!   g_shard /= loss_scale; overflow = all_reduce_max(any non-finite in g_shard)
//!   ‖g‖² = all_reduce_sum(Σ g_shard² over the shard's non-padding elements)
//!   g_shard *= max_norm / (‖g‖ + 1e-6)   when ‖g‖ > max_norm
//!   Adam on (master_shard, g_shard, m_shard, v_shard)  unless overflow
//!   params = all_gather(master_shard)             (bucketed, `allgather_bucket_size`)
//! A bucket of `b` elements is the same `b / world_size`-element slice of
//! every shard, so one reduce-scatter (or all-gather) call moves it.
//!
//! Stage 1 reduces the full gradients once, on the accumulation's last
//! micro-batch. Stage 2 reduce-scatters after every micro-batch's backward,
//! adds the result into this rank's shard gradient and frees each
//! parameter's full gradient as soon as the last bucket that reads it is
//! done, so between micro-batches only the shard gradient is held. The
//! buckets are reduced after backward returns (there is no backward hook to
//! reduce them while it runs); `overlap_comm` is accepted and has no effect.

use super::flat::FlatLayout;
use super::{Engine, OptimizerState, StepOutcome};
use crate::backend::cpu::optim::{adam as adam_kernel, AdamStep};
use crate::backend::cpu::CpuStorage;
use crate::dist::{Communicator, ReduceOp};
use crate::error::{Error, Result};
use crate::optim::{AdamConfig, GradScaler};
use crate::tensor::{DType, Device, Tensor};
use std::collections::BTreeMap;

/// The ZeRO settings the engine uses (from the DeepSpeed JSON's `zero_optimization`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ZeroOptions {
    /// 1 (optimizer state sharded) or 2 (gradients sharded too).
    pub stage: u8,
    /// Elements per reduce-scatter call.
    pub reduce_bucket_size: usize,
    /// Elements per all-gather call.
    pub allgather_bucket_size: usize,
    /// DeepSpeed's overlap of reduction with backward (no effect here: buckets are reduced after backward).
    pub overlap_comm: bool,
}

impl Default for ZeroOptions {
    /// DeepSpeed's defaults (5e8-element buckets), stage 1.
    fn default() -> Self {
        ZeroOptions { stage: 1, reduce_bucket_size: 500_000_000, allgather_bucket_size: 500_000_000, overlap_comm: false }
    }
}

/// DeepSpeed-style ZeRO stage 1/2 over this rank's shard.
pub struct ZeroEngine {
    params: Vec<(String, Tensor)>,
    comm: Box<dyn Communicator>,
    opts: ZeroOptions,
    adam: AdamConfig,
    /// Adam's step count (steps taken, not skipped ones).
    step: u64,
    layout: FlatLayout,
    master: Vec<f32>,
    exp_avg: Vec<f32>,
    exp_avg_sq: Vec<f32>,
    /// This rank's averaged (and, for stage 2, accumulated) shard gradient.
    shard_grad: Option<Vec<f32>>,
}

fn f32_tensor(v: Vec<f32>) -> Result<Tensor> {
    let n = v.len();
    Tensor::from_vec(v, vec![n], &Device::Cpu)
}

impl ZeroEngine {
    /// An engine over `params` (the same names and shapes on every rank):
    /// broadcasts rank 0's parameters, lays them out flat and keeps this
    /// rank's shard of master weights with zero moments.
    pub fn new(params: Vec<(String, Tensor)>, comm: Box<dyn Communicator>, opts: ZeroOptions, adam: AdamConfig) -> Result<ZeroEngine> {
        let rank = comm.rank();
        if opts.stage != 1 && opts.stage != 2 {
            return Err(Error::config("zero_optimization.stage", format!("the ZeRO engine runs stage 1 or 2, found {}", opts.stage)));
        }
        for (key, v) in
            [("zero_optimization.reduce_bucket_size", opts.reduce_bucket_size), ("zero_optimization.allgather_bucket_size", opts.allgather_bucket_size)]
        {
            if v == 0 {
                return Err(Error::config(key, "expected a bucket of at least 1 element, found 0"));
            }
        }
        for (name, p) in &params {
            if p.dtype() != DType::F32 || p.device() != Device::Cpu {
                return Err(Error::invalid("zero", format!("parameter {name}: expected an f32 CPU tensor, found {:?} on {:?}", p.dtype(), p.device())));
            }
        }
        let layout = FlatLayout::of_params(&params, comm.world_size())?;
        let mut engine =
            ZeroEngine { params, comm, opts, adam, step: 0, master: Vec::new(), exp_avg: Vec::new(), exp_avg_sq: Vec::new(), shard_grad: None, layout };
        for (name, p) in &engine.params {
            engine.comm.broadcast(p, 0).map_err(|e| Error::dist("broadcast", rank, format!("initial parameter {name}: {e}")))?;
        }
        let s = engine.layout.shard_len;
        let mut master = vec![0.0f32; s];
        engine.layout.read_values(&engine.params, engine.layout.shard_range(rank), &mut master)?;
        engine.master = master;
        engine.exp_avg = vec![0.0; s];
        engine.exp_avg_sq = vec![0.0; s];
        Ok(engine)
    }

    /// The engine of a one-process job (no network: every collective is the identity).
    pub fn single(params: Vec<(String, Tensor)>, opts: ZeroOptions, adam: AdamConfig) -> Result<ZeroEngine> {
        ZeroEngine::new(params, Box::new(SoloComm), opts, adam)
    }

    /// The flat layout (shard length, padding, parameter order).
    pub fn layout(&self) -> &FlatLayout {
        &self.layout
    }

    /// The settings.
    pub fn options(&self) -> ZeroOptions {
        self.opts
    }

    /// Adam's step count.
    pub fn adam_step(&self) -> u64 {
        self.step
    }

    /// This rank's shard of the master weights and both moments.
    pub fn shard(&self) -> (&[f32], &[f32], &[f32]) {
        (&self.master, &self.exp_avg, &self.exp_avg_sq)
    }

    /// This rank's current shard gradient (after a reduction), if any.
    pub fn shard_grad(&self) -> Option<&[f32]> {
        self.shard_grad.as_deref()
    }

    /// Reduce-scatters the full gradients bucket by bucket and adds the
    /// averaged result into the shard gradient; stage 2 frees each full
    /// gradient after its last bucket, stage 1 after all of them.
    fn reduce_gradients(&mut self) -> Result<()> {
        let (rank, world, s) = (self.comm.rank(), self.layout.world_size, self.layout.shard_len);
        let chunk = (self.opts.reduce_bucket_size / world).max(1);
        let last = self.layout.last_bucket(chunk);
        let acc = self.shard_grad.get_or_insert_with(|| vec![0.0; s]);
        let mut k = 0usize;
        while k * chunk < s {
            let lo = k * chunk;
            let n = chunk.min(s - lo);
            let mut input = vec![0.0f32; world * n];
            for r in 0..world {
                let base = r * s + lo;
                self.layout.read_grads(&self.params, base..base + n, &mut input[r * n..(r + 1) * n])?;
            }
            let input = f32_tensor(input)?;
            let output = f32_tensor(vec![0.0; n])?;
            self.comm
                .reduce_scatter(&input, &output, ReduceOp::Avg)
                .map_err(|e| Error::dist("reduce_scatter", rank, format!("gradient bucket {k} ({} elements): {e}", world * n)))?;
            drop(input);
            let part = output.to_vec::<f32>()?;
            for (a, g) in acc[lo..lo + n].iter_mut().zip(&part) {
                *a += *g;
            }
            if self.opts.stage == 2 {
                for (i, (_, p)) in self.params.iter().enumerate() {
                    if last[i] == k {
                        p.zero_grad();
                    }
                }
            }
            k += 1;
        }
        self.params.iter().for_each(|(_, p)| p.zero_grad());
        Ok(())
    }

    /// All-gathers every rank's master shard into the parameters, bucket by bucket.
    fn gather_parameters(&mut self) -> Result<()> {
        let (rank, world, s) = (self.comm.rank(), self.layout.world_size, self.layout.shard_len);
        let chunk = (self.opts.allgather_bucket_size / world).max(1);
        let mut flat = vec![0.0f32; self.layout.padded()];
        let mut lo = 0usize;
        while lo < s {
            let n = chunk.min(s - lo);
            let input = f32_tensor(self.master[lo..lo + n].to_vec())?;
            let output = f32_tensor(vec![0.0; world * n])?;
            self.comm
                .all_gather(&input, &output)
                .map_err(|e| Error::dist("all_gather", rank, format!("parameter bucket at shard offset {lo} ({} elements): {e}", world * n)))?;
            let got = output.to_vec::<f32>()?;
            for r in 0..world {
                flat[r * s + lo..r * s + lo + n].copy_from_slice(&got[r * n..(r + 1) * n]);
            }
            lo += n;
        }
        self.layout.write_values(&self.params, &flat)
    }

    fn all_reduce_scalar(&mut self, v: f64, op: ReduceOp, what: &str) -> Result<f64> {
        let rank = self.comm.rank();
        let t = Tensor::from_vec(vec![v], vec![1], &Device::Cpu)?;
        self.comm.all_reduce(&t, op).map_err(|e| Error::dist("all_reduce", rank, format!("{what}: {e}")))?;
        t.to_vec::<f64>()?.first().copied().ok_or_else(|| Error::dist("all_reduce", rank, format!("{what}: empty result")))
    }

    fn meta(&self) -> BTreeMap<String, String> {
        let l = &self.layout;
        let mut m = BTreeMap::new();
        for (k, v) in [
            ("engine", "zero".to_string()),
            ("zero_stage", self.opts.stage.to_string()),
            ("world_size", l.world_size.to_string()),
            ("rank", self.comm.rank().to_string()),
            ("numel", l.numel.to_string()),
            ("padded_numel", l.padded().to_string()),
            ("layout", l.describe()),
        ] {
            m.insert(k.to_string(), v);
        }
        m
    }
}

impl Engine for ZeroEngine {
    fn parameters(&self) -> &[(String, Tensor)] {
        &self.params
    }

    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn world_size(&self) -> usize {
        self.layout.world_size
    }

    fn backward(&mut self, loss: &Tensor, sync: bool) -> Result<()> {
        crate::autograd::backward(loss)?;
        if sync || self.opts.stage == 2 {
            self.reduce_gradients()?;
        }
        Ok(())
    }

    fn step(&mut self, lr: f64, grad_clip: f64, scaler: Option<&mut GradScaler>) -> Result<StepOutcome> {
        let rank = self.comm.rank();
        let s = self.layout.shard_len;
        let mut g = self.shard_grad.take().unwrap_or_else(|| vec![0.0; s]);
        if let Some(sc) = &scaler {
            let inv = (1.0 / sc.scale) as f32;
            g.iter_mut().for_each(|x| *x *= inv);
        }
        let local_bad = g.iter().any(|x| !x.is_finite());
        let overflow = self.all_reduce_scalar(if local_bad { 1.0 } else { 0.0 }, ReduceOp::Max, "inf/NaN check")? > 0.0;
        if let Some(sc) = scaler {
            sc.set_found_inf(overflow);
        }
        let valid = self.layout.valid_in_shard(rank);
        let local_sq: f64 = g[..valid].iter().map(|&x| (x as f64) * (x as f64)).sum();
        let grad_norm = self.all_reduce_scalar(local_sq, ReduceOp::Sum, "squared gradient norm")?.sqrt();
        let skipped = overflow || !grad_norm.is_finite();
        if !skipped {
            if grad_clip > 0.0 && grad_norm > grad_clip {
                let c = (grad_clip / (grad_norm + 1e-6)) as f32;
                g.iter_mut().for_each(|x| *x *= c);
            }
            self.step += 1;
            let h = AdamStep {
                lr,
                beta1: self.adam.betas.0,
                beta2: self.adam.betas.1,
                eps: self.adam.eps,
                weight_decay: self.adam.weight_decay,
                decoupled: self.adam.decoupled,
                t: self.step,
            };
            let mut p = CpuStorage::F32(std::mem::take(&mut self.master));
            let mut m = CpuStorage::F32(std::mem::take(&mut self.exp_avg));
            let mut v = CpuStorage::F32(std::mem::take(&mut self.exp_avg_sq));
            let r = adam_kernel(&mut p, &CpuStorage::F32(g), &mut m, &mut v, &h);
            if let (CpuStorage::F32(p), CpuStorage::F32(m), CpuStorage::F32(v)) = (p, m, v) {
                (self.master, self.exp_avg, self.exp_avg_sq) = (p, m, v);
            }
            r?;
            self.gather_parameters()?;
        }
        self.zero_grad();
        Ok(StepOutcome { grad_norm, skipped })
    }

    fn zero_grad(&mut self) {
        self.shard_grad = None;
        self.params.iter().for_each(|(_, p)| p.zero_grad());
    }

    fn all_reduce_sum(&mut self, values: &mut [f64]) -> Result<()> {
        let rank = self.comm.rank();
        let t = Tensor::from_vec(values.to_vec(), vec![values.len()], &Device::Cpu)?;
        self.comm.all_reduce(&t, ReduceOp::Sum).map_err(|e| Error::dist("all_reduce", rank, format!("values: {e}")))?;
        values.copy_from_slice(&t.to_vec::<f64>()?);
        Ok(())
    }

    fn sharded_state(&self) -> bool {
        true
    }

    fn optimizer_state(&self) -> Result<OptimizerState> {
        let tensors = vec![
            ("exp_avg".to_string(), f32_tensor(self.exp_avg.clone())?),
            ("exp_avg_sq".to_string(), f32_tensor(self.exp_avg_sq.clone())?),
            ("master".to_string(), f32_tensor(self.master.clone())?),
        ];
        Ok(OptimizerState { step: self.step, tensors, meta: self.meta() })
    }

    fn load_optimizer_state(&mut self, saved: &[OptimizerState]) -> Result<()> {
        let (rank, step) = (self.comm.rank(), super::zero_state::check_step(saved)?);
        let [m, v, p] = super::zero_state::reshard(saved, &self.layout, rank)?;
        (self.exp_avg, self.exp_avg_sq, self.master, self.step) = (m, v, p, step);
        Ok(())
    }
    fn abort(&mut self, reason: &str) {
        self.comm.abort(reason);
    }
}

/// The group of one process: reductions, broadcasts and gathers leave the data as it is.
struct SoloComm;

impl Communicator for SoloComm {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn timeout(&self) -> std::time::Duration {
        std::time::Duration::MAX
    }
    fn set_timeout(&mut self, _timeout: std::time::Duration) {}
    fn all_reduce(&mut self, _t: &Tensor, _op: ReduceOp) -> Result<()> {
        Ok(())
    }
    fn broadcast(&mut self, _t: &Tensor, _root: usize) -> Result<()> {
        Ok(())
    }
    fn all_gather(&mut self, input: &Tensor, output: &Tensor) -> Result<()> {
        output.assign(input)
    }
    fn reduce_scatter(&mut self, input: &Tensor, output: &Tensor, _op: ReduceOp) -> Result<()> {
        output.assign(input)
    }
    fn barrier(&mut self) -> Result<()> {
        Ok(())
    }
}
