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
//! With a half type for the gradients ([`ZeroEngine::with_half_grad_sync`]:
//! `--fp16_grad_sync`, or DeepSpeed's `communication_data_type`) each
//! bucket is divided by the world size in f32, rounded once to f16 or bf16,
//! reduce-scattered as a sum (half the bytes) and converted back exactly
//! into the f32 shard gradient, as DDP's half all-reduce does.
//!
//! Stage 1 reduces the full gradients once, on the accumulation's last
//! micro-batch. Stage 2 reduce-scatters after every micro-batch's backward,
//! adds the result into this rank's shard gradient and frees each
//! parameter's full gradient as soon as the last bucket that reads it is
//! done, so between micro-batches only the shard gradient is held.
//!
//! Without `overlap_comm` the buckets are reduced after backward returns,
//! in ascending order, on the training thread. With it (DeepSpeed's
//! `zero_optimization.overlap_comm`, which the JSON parser turns on by
//! default for stage 2; `ZeroOptions::default` leaves it off) the
//! communicator lives on a communication thread (`comm_thread.rs`, as
//! DDP's) and every reducing backward runs with autograd's gradient-ready
//! hook: a bucket is read (its slice of every shard) and handed to the
//! thread as soon as every parameter it reads has its final gradient,
//! while backward goes on. Buckets are launched strictly in descending
//! order (backward finishes the last parameters first, and the last bucket
//! holds the end of every shard), so every rank
//! issues the same collectives in the same order whatever order its
//! gradients arrive in; a bucket whose parameters got no gradient waits
//! for the end of backward, when every remaining bucket is launched, even
//! after an error (a bucket that cannot be read then travels as zeros and
//! the error is returned), so a failing rank never leaves the others
//! waiting. Stage 2 frees a parameter's full gradient once its last bucket
//! has been read. The results are added into the shard gradient after
//! backward: each bucket owns disjoint shard elements and gets the same one
//! addition per reduction as without overlap, so both are bitwise equal.
//! Since bucket k is the k-th slice of every shard, it also waits for a
//! slice of shard 0 (the first layers): at N ranks no bucket is ready
//! before backward reaches the first 1/N of the parameters, so only that
//! last part of backward can hide communication (DeepSpeed instead fills
//! its buckets in the order gradients arrive).
//! With the parameters on a GPU each bucket comes to the host in one copy
//! when it is launched (one host synchronisation per bucket instead of one
//! per reduction).
//!
//! With the parameters on a GPU the master shard, both moments and the
//! shard gradient live on that GPU, and the update is the device's Adam
//! kernel. The communicator is host-side (TCP: the emulated device, or
//! `gloo` on a GPU), so each collective phase crosses once: the full flat
//! gradient is concatenated on the device and copied to the host in one
//! piece (then reduce-scattered bucket by bucket there) and the averaged
//! shard goes back in one copy; the shard's squared norm is one scalar read;
//! the updated master shard comes to the host once and the gathered
//! parameters go back in one copy. Three host synchronisations per step, on
//! the training thread. Stage 2 then holds the flat gradient copy (not each
//! parameter's) while it reduces: every parameter's full gradient is freed
//! as soon as the flat copy exists.
//!
//! With a communicator whose collectives take device tensors
//! (`Communicator::device_collectives`: NCCL) nothing crosses to the host
//! but the step's one scalar (the global squared norm, all-reduced on the
//! device and read once): each bucket's input (its slice of every shard) is
//! read from the gradients in one concatenation on the device (stage 2 frees
//! each gradient after its last bucket), the reduce-scatter outputs stay there and are joined
//! into the shard gradient, and each all-gather's output is cut into the
//! parameters there. With `overlap_comm` the buckets read during backward
//! are device tensors too. The reductions are the same, in the same order,
//! so the result is bitwise the host-staged engine's.

use super::comm_thread::{CommThread, Pending};
use super::flat::FlatLayout;
use super::{Engine, OptimizerState, StepOutcome};
use crate::backend::cpu::optim::{adam as adam_kernel, AdamStep};
use crate::backend::cpu::CpuStorage;
use crate::dist::{Communicator, ReduceOp};
use crate::error::{Error, Result};
use crate::optim::{AdamConfig, GradScaler};
use crate::tensor::TensorId;
use crate::tensor::{DType, Device, Tensor};
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// What the ZeRO engine communicated, for tests and diagnostics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ZeroStats {
    /// Gradient reduce-scatter calls (one per bucket per reduction).
    pub reduce_scatters: u64,
    /// Bytes this rank handed to those reduce-scatters (its whole input:
    /// every rank's slice of each bucket, in the type that travels).
    pub reduce_scatter_bytes: u64,
    /// Reduce-scatters handed to the communication thread from the
    /// gradient-ready hook while backward was still running (stage 2 with `overlap_comm`).
    pub launched_during_backward: u64,
}

/// The ZeRO settings the engine uses (from the DeepSpeed JSON's `zero_optimization`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ZeroOptions {
    /// 1 (optimizer state sharded) or 2 (gradients sharded too).
    pub stage: u8,
    /// Elements per reduce-scatter call.
    pub reduce_bucket_size: usize,
    /// Elements per all-gather call.
    pub allgather_bucket_size: usize,
    /// DeepSpeed's overlap of the gradient reduce-scatter with backward: each
    /// bucket is launched from the gradient-ready hook on a communication thread.
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
    comm: Comm,
    rank: usize,
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
    /// The shard state on the GPU when the parameters live there (the host
    /// vectors above are then empty).
    gpu: Option<DeviceShard>,
    /// The half type the gradient reduce-scatter travels in, or none (f32).
    grad_sync: Option<DType>,
    /// The shard lives on a GPU and the communicator runs its collectives
    /// on device tensors (NCCL): buckets and parameters never cross to the host.
    device_comm: bool,
    stats: Arc<Mutex<ZeroStats>>,
}

/// Copies flat gradient elements `range` into the slice it is given.
type FlatReader<'a> = &'a dyn Fn(std::ops::Range<usize>, &mut [f32]) -> Result<()>;

/// The engine's communicator: used on the training thread, or (`overlap_comm`)
/// owned by a communication thread that runs the collectives in submission order.
enum Comm {
    Here(Box<dyn Communicator>),
    Thread(CommThread),
}

impl Comm {
    /// Runs one collective and waits for it (behind any bucket still queued on the thread).
    fn run<T: Send + 'static>(&mut self, op: &'static str, f: impl FnOnce(&mut dyn Communicator) -> Result<T> + Send + 'static) -> Result<T> {
        match self {
            Comm::Here(c) => f(c.as_mut()),
            Comm::Thread(t) => t.submit(op, f)?.wait(),
        }
    }
}

/// A gradient bucket handed to the communication thread during backward.
struct Launched {
    /// Its first in-shard element and its length per shard.
    lo: usize,
    n: usize,
    /// The bytes this rank handed to its reduce-scatter.
    bytes: u64,
    /// The reduce-scatter's output (this rank's slice, f32 or the half type).
    output: Pending<Tensor>,
}

/// The ZeRO shard state of a rank whose parameters live on a GPU.
struct DeviceShard {
    dev: Device,
    master: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// The averaged (stage 2: accumulated) shard gradient.
    grad: Option<Tensor>,
}

/// The parameters' values (or gradients, zeros where none) laid out flat on
/// `dev` and padded to `layout.padded()`: one concatenation on the device.
fn flat_on_device(params: &[(String, Tensor)], layout: &FlatLayout, grads: bool, dev: &Device) -> Result<Tensor> {
    crate::autograd::no_grad(|| {
        let mut parts = Vec::with_capacity(params.len() + 1);
        for (name, p) in params {
            let t = if grads { p.grad() } else { Some(p.detach()) };
            let t = match t {
                Some(t) if t.device() != *dev || t.dtype() != DType::F32 => {
                    return Err(Error::invalid("zero", format!("{name}: expected f32 on {dev:?}, found {:?} on {:?}", t.dtype(), t.device())))
                }
                Some(t) => crate::ops::reshape(&t, [t.elem_count()])?,
                None => Tensor::zeros([p.elem_count()], DType::F32, dev)?,
            };
            parts.push(t);
        }
        if layout.padded() > layout.numel {
            parts.push(Tensor::zeros([layout.padded() - layout.numel], DType::F32, dev)?);
        }
        let refs: Vec<&Tensor> = parts.iter().collect();
        crate::ops::cat(&refs, 0)
    })
}

/// Flat gradient elements `ranges`, one after the other, of parameters on
/// `dev` (zeros where a parameter has no gradient and in the padding), in
/// one device tensor (one concatenation).
fn device_grad_slices(params: &[(String, Tensor)], layout: &FlatLayout, ranges: &[Range<usize>], dev: &Device) -> Result<Tensor> {
    crate::autograd::no_grad(|| {
        let mut parts = Vec::new();
        for range in ranges {
            for (e, (name, p)) in layout.entries.iter().zip(params) {
                let (lo, hi) = (range.start.max(e.offset), range.end.min(e.offset + e.numel));
                if lo >= hi {
                    continue;
                }
                parts.push(match p.grad() {
                    Some(g) if g.device() != *dev || g.dtype() != DType::F32 => {
                        return Err(Error::invalid("zero", format!("{name}: expected an f32 gradient on {dev:?}, found {:?} on {:?}", g.dtype(), g.device())))
                    }
                    Some(g) => crate::ops::narrow(&crate::ops::reshape(&g, [e.numel])?, 0, lo - e.offset, hi - lo)?,
                    None => Tensor::zeros([hi - lo], DType::F32, dev)?,
                });
            }
            // The entries are contiguous from 0: only the padding follows the last one.
            let pad_from = range.start.max(layout.numel);
            if range.end > pad_from {
                parts.push(Tensor::zeros([range.end - pad_from], DType::F32, dev)?);
            }
        }
        let refs: Vec<&Tensor> = parts.iter().collect();
        crate::ops::cat(&refs, 0)
    })
}

/// The device's Adam kernel on one shard, in place.
fn device_adam(master: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, h: &AdamStep) -> Result<()> {
    use crate::backend::Storage;
    let gs = g.storage();
    let Storage::Cuda(gc) = &*gs else { return Err(Error::invalid("zero", "expected the shard gradient on the GPU")) };
    master.with_storage_mut(|p| {
        m.with_storage_mut(|ms| {
            v.with_storage_mut(|vs| match (p, ms, vs) {
                (Storage::Cuda(p), Storage::Cuda(ms), Storage::Cuda(vs)) => crate::backend::cuda::optim::adam(p, gc, ms, vs, h),
                _ => Err(Error::invalid("zero", "expected the master shard and both moments on the GPU")),
            })
        })
    })
}

/// The input and output of one bucket's reduce-scatter and its reduction:
/// f32 averaged, or (`half`) the input divided by the world size in f32,
/// rounded once to the half type and summed.
/// The input is f32 on the host or (collectives on the device) on a GPU;
/// the output lives with it.
fn scatter_buffers(input: Tensor, n: usize, world: usize, half: Option<DType>) -> Result<(Tensor, Tensor, ReduceOp)> {
    let dev = input.device();
    match half {
        None => Ok((input, Tensor::zeros([n], DType::F32, &dev)?, ReduceOp::Avg)),
        Some(h) => {
            let shares = crate::autograd::no_grad(|| crate::ops::to_dtype(&crate::ops::mul_scalar(&input, 1.0 / world.max(1) as f64)?, h))?;
            Ok((shares, Tensor::zeros([n], h, &dev)?, ReduceOp::Sum))
        }
    }
}

/// Reduce-scatter outputs on the device, in ascending shard order and
/// covering the shard, joined into one f32 shard gradient (one
/// concatenation; the conversion from a half type is exact).
fn joined_on_device(mut parts: Vec<(usize, Tensor)>) -> Result<Tensor> {
    parts.sort_by_key(|(lo, _)| *lo);
    crate::autograd::no_grad(|| {
        let joined = match parts.as_slice() {
            [(_, one)] => one.clone(),
            _ => crate::ops::cat(&parts.iter().map(|(_, t)| t).collect::<Vec<_>>(), 0)?,
        };
        crate::ops::to_dtype(&joined, DType::F32)
    })
}

/// Adds `part` into the device shard's gradient (or makes it the gradient).
fn add_into_device_grad(gpu: &mut DeviceShard, part: Tensor) -> Result<()> {
    gpu.grad = Some(match gpu.grad.take() {
        Some(acc) => crate::autograd::no_grad(|| crate::ops::add(&acc, &part))?,
        None => part,
    });
    Ok(())
}

/// A reduce-scatter's output as f32 (exact from f16 and bf16).
fn scattered_part(output: &Tensor) -> Result<Vec<f32>> {
    match output.dtype() {
        DType::F32 => output.to_vec::<f32>(),
        _ => Ok(output.to_f64_vec()?.into_iter().map(|x| x as f32).collect()),
    }
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
        let dev = params.first().map_or(Device::Cpu, |(_, p)| p.device());
        for (name, p) in &params {
            if p.dtype() != DType::F32 || p.device() != dev {
                return Err(Error::invalid(
                    "zero",
                    format!("parameter {name}: expected an f32 tensor on {dev:?} like the first parameter, found {:?} on {:?}", p.dtype(), p.device()),
                ));
            }
        }
        let layout = FlatLayout::of_params(&params, comm.world_size())?;
        let mut comm = comm;
        for (name, p) in &params {
            comm.broadcast(p, 0).map_err(|e| Error::dist("broadcast", rank, format!("initial parameter {name}: {e}")))?;
        }
        let device_comm = dev != Device::Cpu && comm.device_collectives();
        let comm = if opts.overlap_comm { Comm::Thread(CommThread::start(comm)?) } else { Comm::Here(comm) };
        let mut engine = ZeroEngine {
            params,
            comm,
            rank,
            opts,
            adam,
            step: 0,
            master: Vec::new(),
            exp_avg: Vec::new(),
            exp_avg_sq: Vec::new(),
            shard_grad: None,
            layout,
            gpu: None,
            grad_sync: None,
            device_comm,
            stats: Arc::new(Mutex::new(ZeroStats::default())),
        };
        let s = engine.layout.shard_len;
        if dev != Device::Cpu {
            let flat = flat_on_device(&engine.params, &engine.layout, false, &dev)?;
            let master = crate::autograd::no_grad(|| crate::ops::narrow(&flat, 0, rank * s, s))?;
            let (exp_avg, exp_avg_sq) = (Tensor::zeros([s], DType::F32, &dev)?, Tensor::zeros([s], DType::F32, &dev)?);
            engine.gpu = Some(DeviceShard { dev, master, exp_avg, exp_avg_sq, grad: None });
            return Ok(engine);
        }
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

    /// Makes every gradient reduce-scatter travel in `half` (f16 or bf16;
    /// `None` keeps f32): `--fp16_grad_sync`, or DeepSpeed's
    /// `communication_data_type`. As DDP's half all-reduce
    /// (`buckets::compress`), each bucket is divided by the world size in
    /// f32, rounded once to `half`, summed over the ranks (so the sum
    /// overflows the half type no sooner than one rank's gradient does) and
    /// converted back, exactly, into the f32 shard gradient.
    pub fn with_half_grad_sync(mut self, half: Option<DType>) -> Result<ZeroEngine> {
        if let Some(d) = half {
            if !matches!(d, DType::F16 | DType::BF16) {
                return Err(Error::invalid(
                    "ZeroEngine::with_half_grad_sync",
                    format!("expected f16 or bf16 for the gradient reduce-scatter, found {}", d.as_str()),
                ));
            }
        }
        self.grad_sync = half;
        Ok(self)
    }

    /// The half type the gradient reduce-scatter travels in (`None`: f32).
    pub fn grad_sync_dtype(&self) -> Option<DType> {
        self.grad_sync
    }

    /// A handle on the engine's counters (stays valid after the engine is boxed).
    pub fn stats(&self) -> Arc<Mutex<ZeroStats>> {
        self.stats.clone()
    }

    fn update_stats(&self, f: impl FnOnce(&mut ZeroStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|e| e.into_inner()));
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

    /// This rank's shard of the master weights and both moments (empty
    /// slices when the shard lives on a GPU; [`OptimizerState`] copies it).
    pub fn shard(&self) -> (&[f32], &[f32], &[f32]) {
        (&self.master, &self.exp_avg, &self.exp_avg_sq)
    }

    /// Whether the shard state (master, moments, shard gradient) lives on a GPU.
    pub fn on_device(&self) -> bool {
        self.gpu.is_some()
    }

    /// This rank's current shard gradient (after a reduction), if any
    /// (`None` when the shard lives on a GPU).
    pub fn shard_grad(&self) -> Option<&[f32]> {
        self.shard_grad.as_deref()
    }

    /// Reduce-scatters the full gradients bucket by bucket and adds the
    /// averaged result into the shard gradient; stage 2 frees each full
    /// gradient after its last bucket, stage 1 after all of them.
    fn reduce_gradients(&mut self) -> Result<()> {
        if let Some(dev) = self.gpu.as_ref().map(|g| g.dev) {
            return self.reduce_gradients_device(&dev);
        }
        let s = self.layout.shard_len;
        let mut acc = self.shard_grad.take().unwrap_or_else(|| vec![0.0; s]);
        let params = self.params.clone();
        let layout = self.layout.clone();
        let r = self.reduce_scatter_buckets(&mut acc, &|range, out| layout.read_grads(&params, range, out), self.opts.stage == 2);
        self.shard_grad = Some(acc);
        r
    }

    /// [`Self::reduce_gradients`] with the parameters on a GPU: the flat
    /// gradient comes to the host in one copy, is reduce-scattered there
    /// bucket by bucket, and the averaged shard goes back in one copy.
    fn reduce_gradients_device(&mut self, dev: &Device) -> Result<()> {
        let s = self.layout.shard_len;
        if self.device_comm {
            let parts = self.reduce_scatter_device(dev)?;
            let part = joined_on_device(parts)?;
            let gpu = self.gpu.as_mut().ok_or_else(|| Error::invalid("zero", "the device shard is missing"))?;
            return add_into_device_grad(gpu, part);
        }
        let flat = flat_on_device(&self.params, &self.layout, true, dev)?;
        // The flat copy holds every gradient now; the parameters' own are freed (both stages).
        self.params.iter().for_each(|(_, p)| p.zero_grad());
        let host = flat.to_vec::<f32>()?;
        drop(flat);
        let mut part = vec![0.0f32; s];
        self.reduce_scatter_buckets(
            &mut part,
            &|range, out| {
                out.copy_from_slice(&host[range]);
                Ok(())
            },
            false,
        )?;
        let part = Tensor::from_vec(part, vec![s], &Device::Cpu)?.to_device(dev)?;
        let gpu = self.gpu.as_mut().ok_or_else(|| Error::invalid("zero", "the device shard is missing"))?;
        add_into_device_grad(gpu, part)
    }

    /// Reduce-scatters the gradients on `dev` bucket by bucket with the
    /// collectives on the device: bucket k's input is its slice of every
    /// shard, read from the parameters' gradients in one concatenation on
    /// the device (`device_grad_slices`, as `overlap_comm` reads a bucket);
    /// stage 2 frees each parameter's gradient after its last bucket, as on
    /// the CPU. Returns each bucket's output (this rank's slice, f32 or the
    /// half type) with its first in-shard element.
    fn reduce_scatter_device(&mut self, dev: &Device) -> Result<Vec<(usize, Tensor)>> {
        let (world, s) = (self.layout.world_size, self.layout.shard_len);
        let chunk = (self.opts.reduce_bucket_size / world).max(1);
        let last = self.layout.last_bucket(chunk);
        let mut parts = Vec::new();
        let mut k = 0usize;
        while k * chunk < s {
            let lo = k * chunk;
            let n = chunk.min(s - lo);
            let input = device_grad_slices(&self.params, &self.layout, &self.bucket_ranges(lo, n), dev)?;
            parts.push((lo, self.reduce_scatter_bucket(k, n, input)?));
            if self.opts.stage == 2 {
                self.params.iter().zip(&last).filter(|(_, l)| **l == k).for_each(|((_, p), _)| p.zero_grad());
            }
            k += 1;
        }
        self.params.iter().for_each(|(_, p)| p.zero_grad());
        Ok(parts)
    }

    /// Flat elements of bucket `[lo, lo + n)` in every shard, in rank order.
    fn bucket_ranges(&self, lo: usize, n: usize) -> Vec<Range<usize>> {
        let s = self.layout.shard_len;
        (0..self.layout.world_size).map(|r| r * s + lo..r * s + lo + n).collect()
    }

    /// Reduce-scatters bucket `k` (`n` elements per shard; `input` its slice
    /// of every shard in f32, on the host or, for device collectives, on the
    /// device) on the training thread and counts it; returns this rank's
    /// slice, f32 or the half type.
    fn reduce_scatter_bucket(&mut self, k: usize, n: usize, input: Tensor) -> Result<Tensor> {
        let (rank, world) = (self.rank, self.layout.world_size);
        let (input, output, op) = scatter_buffers(input, n, world, self.grad_sync)?;
        let bytes = (input.elem_count() * input.dtype().size_in_bytes()) as u64;
        let output = self
            .comm
            .run("reduce_scatter", move |c| c.reduce_scatter(&input, &output, op).map(|()| output))
            .map_err(|e| Error::dist("reduce_scatter", rank, format!("gradient bucket {k} ({} elements): {e}", world * n)))?;
        self.update_stats(|st| {
            st.reduce_scatters += 1;
            st.reduce_scatter_bytes += bytes;
        });
        Ok(output)
    }

    /// Reduce-scatters flat gradient elements (read through `read`) bucket
    /// by bucket and adds the averaged shard into `acc`; with `free_early`
    /// (stage 2 on the CPU) each parameter's full gradient is freed after the
    /// last bucket that reads it.
    fn reduce_scatter_buckets(&mut self, acc: &mut [f32], read: FlatReader, free_early: bool) -> Result<()> {
        let (world, s) = (self.layout.world_size, self.layout.shard_len);
        let chunk = (self.opts.reduce_bucket_size / world).max(1);
        let last = self.layout.last_bucket(chunk);
        let mut k = 0usize;
        while k * chunk < s {
            let lo = k * chunk;
            let n = chunk.min(s - lo);
            let mut input = vec![0.0f32; world * n];
            for r in 0..world {
                let base = r * s + lo;
                read(base..base + n, &mut input[r * n..(r + 1) * n])?;
            }
            let part = scattered_part(&self.reduce_scatter_bucket(k, n, f32_tensor(input)?)?)?;
            for (a, g) in acc[lo..lo + n].iter_mut().zip(&part) {
                *a += *g;
            }
            if free_early {
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

    /// Backward with the gradient-ready hook (`overlap_comm`): each bucket
    /// is read and handed to the communication thread as soon as every
    /// parameter it reads is final, in descending bucket order; the rest are
    /// launched after backward whatever happened, then every result is
    /// added into the shard gradient (see the module docs).
    fn overlapped_backward(&mut self, loss: &Tensor) -> Result<()> {
        let (world, s) = (self.layout.world_size, self.layout.shard_len);
        let chunk = (self.opts.reduce_bucket_size / world).max(1);
        let nb = s.div_ceil(chunk);
        let reads = self.layout.buckets_reading(chunk);
        // Per bucket: how many of its parameters are not final yet, and which they are.
        let mut missing = vec![0usize; nb];
        let mut readers: Vec<Vec<usize>> = vec![Vec::new(); nb];
        for (i, ks) in reads.iter().enumerate() {
            for &k in ks {
                missing[k] += 1;
                readers[k].push(i);
            }
        }
        // Per parameter: how many of its buckets are not launched yet (stage 2 frees its gradient at 0).
        let mut unlaunched: Vec<usize> = reads.iter().map(Vec::len).collect();
        let index: HashMap<TensorId, usize> = self.params.iter().enumerate().map(|(i, (_, p))| (p.id(), i)).collect();
        let mut marked = vec![false; self.params.len()];
        let (mut next, mut launched, mut read_err) = (nb, Vec::with_capacity(nb), None);
        let r = {
            let this = &*self;
            crate::autograd::backward_with_hooks(loss, &mut |leaf: &Tensor| {
                let Some(&i) = index.get(&leaf.id()) else { return Ok(()) };
                if std::mem::replace(&mut marked[i], true) {
                    return Ok(());
                }
                for &k in &reads[i] {
                    missing[k] -= 1;
                }
                while next > 0 && missing[next - 1] == 0 {
                    launched.push(this.launch_bucket(next - 1, chunk, &mut read_err)?);
                    next -= 1;
                    this.release(&readers[next], &mut unlaunched);
                }
                Ok(())
            })
        };
        let in_hook = launched.len() as u64;
        // Whatever happened, every remaining bucket is launched so that this rank issues the same collectives as the others.
        let mut rest = Ok(());
        while next > 0 {
            match self.launch_bucket(next - 1, chunk, &mut read_err) {
                Ok(l) => launched.push(l),
                Err(e) => {
                    rest = Err(e);
                    break;
                }
            }
            next -= 1;
            self.release(&readers[next], &mut unlaunched);
        }
        self.params.iter().for_each(|(_, p)| p.zero_grad());
        let mut acc = match self.gpu {
            Some(_) => vec![0.0f32; s],
            None => self.shard_grad.take().unwrap_or_else(|| vec![0.0; s]),
        };
        let mut failed = None;
        // Collectives on the device: the outputs stay there and are joined there.
        let mut on_device = Vec::new();
        for l in launched {
            let got = l.output.wait().and_then(|out| {
                if self.device_comm {
                    on_device.push((l.lo, out));
                    return Ok(());
                }
                let part = scattered_part(&out)?;
                for (a, g) in acc[l.lo..l.lo + l.n].iter_mut().zip(&part) {
                    *a += *g;
                }
                Ok(())
            });
            match got {
                Ok(()) => {
                    self.update_stats(|st| {
                        st.reduce_scatters += 1;
                        st.reduce_scatter_bytes += l.bytes;
                    });
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        self.update_stats(|st| st.launched_during_backward += in_hook);
        let stored = match self.gpu.as_mut() {
            None => {
                self.shard_grad = Some(acc);
                Ok(())
            }
            // Every bucket's output on the device: joined there (after a failure the shard is incomplete and the step fails anyway).
            Some(gpu) if self.device_comm => match failed {
                None => joined_on_device(on_device).and_then(|part| add_into_device_grad(gpu, part)),
                Some(_) => Ok(()),
            },
            // As `reduce_gradients_device`: the reduced shard goes to the device in one copy.
            Some(gpu) => Tensor::from_vec(acc, vec![s], &Device::Cpu).and_then(|t| t.to_device(&gpu.dev)).and_then(|part| add_into_device_grad(gpu, part)),
        };
        r.and(rest).and(read_err.map_or(Ok(()), Err)).and(failed.map_or(Ok(()), Err)).and(stored)
    }

    /// Reads bucket `k` (in-shard elements `[k·chunk, k·chunk + n)` of every
    /// shard) and hands its reduce-scatter to the communication thread. A
    /// bucket that cannot be read travels as zeros (so the collectives stay
    /// matched across ranks) and the first such error lands in `read_err`.
    fn launch_bucket(&self, k: usize, chunk: usize, read_err: &mut Option<Error>) -> Result<Launched> {
        let (rank, world, s) = (self.rank, self.layout.world_size, self.layout.shard_len);
        let lo = k * chunk;
        let n = chunk.min(s - lo);
        let ranges = self.bucket_ranges(lo, n);
        // Where the collective runs: the bucket stays on the device for device collectives.
        let dev = match &self.gpu {
            Some(g) if self.device_comm => g.dev,
            _ => Device::Cpu,
        };
        let input = match &self.gpu {
            Some(g) if self.device_comm => device_grad_slices(&self.params, &self.layout, &ranges, &g.dev),
            Some(g) => device_grad_slices(&self.params, &self.layout, &ranges, &g.dev).and_then(|t| t.to_vec::<f32>()).and_then(f32_tensor),
            None => {
                let mut input = vec![0.0f32; world * n];
                ranges
                    .iter()
                    .zip(input.chunks_mut(n))
                    .try_for_each(|(range, out)| self.layout.read_grads(&self.params, range.clone(), out))
                    .and_then(|()| f32_tensor(input))
            }
        };
        let input = match input {
            Ok(t) => t,
            Err(e) => {
                read_err.get_or_insert(Error::dist(
                    "reduce_scatter",
                    rank,
                    format!("gradient bucket {k}: cannot read the gradients ({e}); it was sent as zeros"),
                ));
                Tensor::zeros([world * n], DType::F32, &dev)?
            }
        };
        let (input, output, op) = scatter_buffers(input, n, world, self.grad_sync)?;
        let bytes = (input.elem_count() * input.dtype().size_in_bytes()) as u64;
        let Comm::Thread(t) = &self.comm else {
            return Err(Error::invalid("zero", "overlap_comm expected the communicator on its communication thread"));
        };
        let output = t.submit("reduce_scatter", move |c| {
            c.reduce_scatter(&input, &output, op)
                .map(|()| output)
                .map_err(|e| Error::dist("reduce_scatter", rank, format!("gradient bucket {k} ({} elements): {e}", world * n)))
        })?;
        Ok(Launched { lo, n, bytes, output })
    }

    /// Counts one more launched bucket for each of `readers`; stage 2 frees
    /// a parameter's full gradient once its last bucket has been read.
    fn release(&self, readers: &[usize], unlaunched: &mut [usize]) {
        for &i in readers {
            unlaunched[i] -= 1;
            if unlaunched[i] == 0 && self.opts.stage == 2 {
                self.params[i].1.zero_grad();
            }
        }
    }

    /// All-gathers every rank's master shard into the parameters, bucket by bucket.
    fn gather_parameters(&mut self) -> Result<()> {
        if self.device_comm {
            return self.gather_parameters_device();
        }
        let (rank, world, s) = (self.rank, self.layout.world_size, self.layout.shard_len);
        let chunk = (self.opts.allgather_bucket_size / world).max(1);
        let mut flat = vec![0.0f32; self.layout.padded()];
        // On a GPU the updated master shard comes to the host in one copy.
        let device_master = match &self.gpu {
            Some(g) => Some(g.master.to_vec::<f32>()?),
            None => None,
        };
        let master = device_master.as_deref().unwrap_or(&self.master);
        let mut lo = 0usize;
        while lo < s {
            let n = chunk.min(s - lo);
            let input = f32_tensor(master[lo..lo + n].to_vec())?;
            let output = f32_tensor(vec![0.0; world * n])?;
            let output = self
                .comm
                .run("all_gather", move |c| c.all_gather(&input, &output).map(|()| output))
                .map_err(|e| Error::dist("all_gather", rank, format!("parameter bucket at shard offset {lo} ({} elements): {e}", world * n)))?;
            let got = output.to_vec::<f32>()?;
            for r in 0..world {
                flat[r * s + lo..r * s + lo + n].copy_from_slice(&got[r * n..(r + 1) * n]);
            }
            lo += n;
        }
        match &self.gpu {
            // The gathered parameters go back in one copy and are cut there.
            Some(g) => self.assign_flat_on_device(&Tensor::from_vec(flat, vec![self.layout.padded()], &Device::Cpu)?.to_device(&g.dev)?),
            None => self.layout.write_values(&self.params, &flat),
        }
    }

    /// [`Self::gather_parameters`] with the collectives on the device: each
    /// bucket's slice of the master shard is all-gathered on the device, the
    /// flat parameters are joined there (the one output itself when one
    /// bucket covers the shard) and cut into the parameters.
    fn gather_parameters_device(&mut self) -> Result<()> {
        let (rank, world, s) = (self.rank, self.layout.world_size, self.layout.shard_len);
        let chunk = (self.opts.allgather_bucket_size / world).max(1);
        let gpu = self.gpu.as_ref().ok_or_else(|| Error::invalid("zero", "the device shard is missing"))?;
        let (master, dev) = (gpu.master.clone(), gpu.dev);
        let mut outputs = Vec::new();
        let mut lo = 0usize;
        while lo < s {
            let n = chunk.min(s - lo);
            let input = if n == s { master.clone() } else { crate::autograd::no_grad(|| crate::ops::narrow(&master, 0, lo, n))? };
            let output = Tensor::zeros([world * n], DType::F32, &dev)?;
            let output = self
                .comm
                .run("all_gather", move |c| c.all_gather(&input, &output).map(|()| output))
                .map_err(|e| Error::dist("all_gather", rank, format!("parameter bucket at shard offset {lo} ({} elements): {e}", world * n)))?;
            outputs.push((n, output));
            lo += n;
        }
        let flat = match outputs.as_slice() {
            [(_, one)] => one.clone(),
            _ => crate::autograd::no_grad(|| {
                // Rank r's shard is bucket by bucket the r-th piece of every output.
                let mut pieces = Vec::with_capacity(world * outputs.len());
                for r in 0..world {
                    for (n, out) in &outputs {
                        pieces.push(crate::ops::narrow(out, 0, r * n, *n)?);
                    }
                }
                crate::ops::cat(&pieces.iter().collect::<Vec<_>>(), 0)
            })?,
        };
        self.assign_flat_on_device(&flat)
    }

    /// Cuts flat parameter values on the device into the parameters.
    fn assign_flat_on_device(&self, all: &Tensor) -> Result<()> {
        crate::autograd::no_grad(|| {
            for (e, (_, p)) in self.layout.entries.iter().zip(&self.params) {
                p.assign(&crate::ops::reshape(&crate::ops::narrow(all, 0, e.offset, e.numel)?, p.dims().to_vec())?)?;
            }
            Ok(())
        })
    }

    /// [`Engine::step`] with the shard on a GPU: the same sequence (unscale,
    /// global inf/NaN check, global norm, clip, Adam, all-gather) with the
    /// shard arithmetic and Adam on the device; one scalar read: the global
    /// squared norm, which is also the inf/NaN check ([`Self::global_squares`]),
    /// summed on the device with device collectives, else the shard's own
    /// read and summed on the host.
    fn step_device(&mut self, lr: f64, grad_clip: f64, scaler: Option<&mut GradScaler>) -> Result<StepOutcome> {
        let rank = self.rank;
        let s = self.layout.shard_len;
        let valid = self.layout.valid_in_shard(rank);
        let gpu = self.gpu.as_mut().ok_or_else(|| Error::invalid("zero", "the device shard is missing"))?;
        let dev = gpu.dev;
        let mut g = match gpu.grad.take() {
            Some(g) => g,
            None => Tensor::zeros([s], DType::F32, &dev)?,
        };
        let local_sq = crate::autograd::no_grad(|| -> Result<Tensor> {
            if let Some(sc) = &scaler {
                g = crate::ops::mul_scalar(&g, 1.0 / sc.scale)?;
            }
            if valid == 0 {
                return Tensor::zeros([1], DType::F64, &dev);
            }
            let x = crate::ops::to_dtype(&crate::ops::narrow(&g, 0, 0, valid)?, DType::F64)?;
            crate::ops::reshape(&crate::ops::sum_all(&crate::ops::mul(&x, &x)?)?, [1])
        })?;
        let global_sq = self.global_squares(local_sq)?;
        let overflow = !global_sq.is_finite();
        if let Some(sc) = scaler {
            sc.set_found_inf(overflow);
        }
        let grad_norm = global_sq.sqrt();
        let skipped = overflow;
        if !skipped {
            if grad_clip > 0.0 && grad_norm > grad_clip {
                let c = grad_clip / (grad_norm + 1e-6);
                g = crate::autograd::no_grad(|| crate::ops::mul_scalar(&g, c))?;
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
            let gpu = self.gpu.as_ref().ok_or_else(|| Error::invalid("zero", "the device shard is missing"))?;
            device_adam(&gpu.master, &g, &gpu.exp_avg, &gpu.exp_avg_sq, &h)?;
            self.gather_parameters()?;
        }
        self.zero_grad();
        Ok(StepOutcome { grad_norm, skipped })
    }

    /// The global squared gradient norm from this rank's `local` one (one
    /// f64 element): one all-reduce (Sum), which is also the global inf/NaN
    /// check, since a sum in f64 of squares of f32 values is finite exactly
    /// when every value is (the squares of f32's largest values sum to
    /// ~1e77 per element, far from f64's overflow). With device
    /// collectives the sum runs on the device and the result is read once;
    /// else the shard's value is read and summed on the host.
    fn global_squares(&mut self, local: Tensor) -> Result<f64> {
        let local = if self.device_comm || local.device() == Device::Cpu { local } else { Tensor::from_vec(vec![local.to_scalar()?], vec![1], &Device::Cpu)? };
        let rank = self.rank;
        let t = self
            .comm
            .run("all_reduce", move |c| c.all_reduce(&local, ReduceOp::Sum).map(|()| local))
            .map_err(|e| Error::dist("all_reduce", rank, format!("squared gradient norm and inf/NaN check: {e}")))?;
        t.to_scalar()
    }

    fn meta(&self) -> BTreeMap<String, String> {
        let l = &self.layout;
        let mut m = BTreeMap::new();
        for (k, v) in [
            ("engine", "zero".to_string()),
            ("zero_stage", self.opts.stage.to_string()),
            ("world_size", l.world_size.to_string()),
            ("rank", self.rank.to_string()),
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
        self.rank
    }

    fn world_size(&self) -> usize {
        self.layout.world_size
    }

    fn backward(&mut self, loss: &Tensor, sync: bool) -> Result<()> {
        let reduce = sync || self.opts.stage == 2;
        if reduce && self.opts.overlap_comm {
            return self.overlapped_backward(loss);
        }
        crate::autograd::backward(loss)?;
        if reduce {
            self.reduce_gradients()?;
        }
        Ok(())
    }

    fn step(&mut self, lr: f64, grad_clip: f64, scaler: Option<&mut GradScaler>) -> Result<StepOutcome> {
        if self.gpu.is_some() {
            return self.step_device(lr, grad_clip, scaler);
        }
        let rank = self.rank;
        let s = self.layout.shard_len;
        let mut g = self.shard_grad.take().unwrap_or_else(|| vec![0.0; s]);
        if let Some(sc) = &scaler {
            let inv = (1.0 / sc.scale) as f32;
            g.iter_mut().for_each(|x| *x *= inv);
        }
        // The padding's gradient is 0: the valid elements decide the inf/NaN check too.
        let valid = self.layout.valid_in_shard(rank);
        let local_sq: f64 = g[..valid].iter().map(|&x| (x as f64) * (x as f64)).sum();
        let global_sq = self.global_squares(Tensor::from_vec(vec![local_sq], vec![1], &Device::Cpu)?)?;
        let overflow = !global_sq.is_finite();
        if let Some(sc) = scaler {
            sc.set_found_inf(overflow);
        }
        let grad_norm = global_sq.sqrt();
        let skipped = overflow;
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
        if let Some(g) = &mut self.gpu {
            g.grad = None;
        }
        self.params.iter().for_each(|(_, p)| p.zero_grad());
    }

    fn all_reduce_sum(&mut self, values: &mut [f64]) -> Result<()> {
        let rank = self.rank;
        let t = Tensor::from_vec(values.to_vec(), vec![values.len()], &Device::Cpu)?;
        let t = self
            .comm
            .run("all_reduce", move |c| c.all_reduce(&t, ReduceOp::Sum).map(|()| t))
            .map_err(|e| Error::dist("all_reduce", rank, format!("values: {e}")))?;
        values.copy_from_slice(&t.to_vec::<f64>()?);
        Ok(())
    }

    fn sharded_state(&self) -> bool {
        true
    }

    fn optimizer_state(&self) -> Result<OptimizerState> {
        if let Some(g) = &self.gpu {
            let host = |t: &Tensor| t.detach().to_device(&Device::Cpu);
            let tensors =
                vec![("exp_avg".to_string(), host(&g.exp_avg)?), ("exp_avg_sq".to_string(), host(&g.exp_avg_sq)?), ("master".to_string(), host(&g.master)?)];
            return Ok(OptimizerState { step: self.step, tensors, meta: self.meta() });
        }
        let tensors = vec![
            ("exp_avg".to_string(), f32_tensor(self.exp_avg.clone())?),
            ("exp_avg_sq".to_string(), f32_tensor(self.exp_avg_sq.clone())?),
            ("master".to_string(), f32_tensor(self.master.clone())?),
        ];
        Ok(OptimizerState { step: self.step, tensors, meta: self.meta() })
    }

    fn load_optimizer_state(&mut self, saved: &[OptimizerState]) -> Result<()> {
        let (rank, step) = (self.rank, super::zero_state::check_step(saved)?);
        let [m, v, p] = super::zero_state::reshard(saved, &self.layout, rank)?;
        if let Some(g) = &mut self.gpu {
            let up = |x: Vec<f32>| f32_tensor(x)?.to_device(&g.dev);
            (g.exp_avg, g.exp_avg_sq, g.master, self.step) = (up(m)?, up(v)?, up(p)?, step);
            return Ok(());
        }
        (self.exp_avg, self.exp_avg_sq, self.master, self.step) = (m, v, p, step);
        Ok(())
    }
    fn abort(&mut self, reason: &str) {
        match &mut self.comm {
            Comm::Here(c) => c.abort(reason),
            Comm::Thread(t) => {
                // Queued behind any bucket still in flight; the thread runs it before it ends (dropping the engine joins it).
                let reason = reason.to_string();
                let _ = t.submit("abort", move |c| {
                    c.abort(&reason);
                    Ok(())
                });
            }
        }
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
