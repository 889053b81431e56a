//! Helpers of the ZeRO tests: a tiny two-layer model whose 53 parameters
//! (not divisible by 2 or 3) include a 1-element `gain`, a deterministic
//! global batch of 6 rows per micro-batch that ranks split evenly, a loop
//! that drives any `Engine`, and an in-process communicator (threads as
//! ranks) for checks that need no network.
#![allow(dead_code)]

use asrforge::dist::{Communicator, ReduceOp};
use asrforge::engine::{Engine, StepOutcome};
use asrforge::optim::GradScaler;
use asrforge::tensor::{DType, Device, Rng, Tensor};
use asrforge::{ops, Result};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

/// Rows of every micro-batch over all ranks (divisible by 1, 2 and 3).
pub const GLOBAL_BATCH: usize = 6;
const IN: usize = 7;
const HID: usize = 5;
const OUT: usize = 2;

/// The model's parameters (the same on every rank for the same seed).
pub fn make_params(seed: u64) -> Vec<(String, Tensor)> {
    let mut rng = Rng::new(seed);
    let mut p = |name: &str, dims: Vec<usize>, std: f64| {
        let t = Tensor::randn(dims, 0.0, std, DType::F32, &mut rng, &Device::Cpu).expect("randn").requires_grad_();
        (name.to_string(), t)
    };
    vec![p("w1", vec![HID, IN], 0.5), p("b1", vec![HID], 0.1), p("w2", vec![OUT, HID], 0.5), p("b2", vec![OUT], 0.1), p("gain", vec![1], 0.3)]
}

/// The global micro-batch `micro` of step `step`: inputs (6, 7) and targets (6, 2).
pub fn global_batch(step: u64, micro: usize) -> (Vec<f32>, Vec<f32>) {
    let mut rng = Rng::new(10_000 + step * 16 + micro as u64);
    let x = rng.normal(GLOBAL_BATCH * IN).into_iter().map(|v| v as f32).collect();
    let t = rng.normal(GLOBAL_BATCH * OUT).into_iter().map(|v| v as f32).collect();
    (x, t)
}

/// Mean squared error of `gain · (w2 · tanh(w1 · x + b1) + b2)` against the
/// targets, over this rank's rows of the global micro-batch, on the
/// parameters' device.
pub fn local_loss(params: &[(String, Tensor)], step: u64, micro: usize, rank: usize, world: usize) -> Result<Tensor> {
    let (x, t) = global_batch(step, micro);
    let rows = GLOBAL_BATCH / world;
    // The batch lives where the parameters do (the CPU, or a GPU).
    let dev = params[0].1.device();
    let x = Tensor::from_vec(x[rank * rows * IN..(rank + 1) * rows * IN].to_vec(), vec![rows, IN], &Device::Cpu)?.to_device(&dev)?;
    let t = Tensor::from_vec(t[rank * rows * OUT..(rank + 1) * rows * OUT].to_vec(), vec![rows, OUT], &Device::Cpu)?.to_device(&dev)?;
    let h = ops::tanh(&ops::linear(&x, &params[0].1, Some(&params[1].1))?)?;
    let y = ops::mul(&ops::linear(&h, &params[2].1, Some(&params[3].1))?, &params[4].1)?;
    ops::mean_all(&ops::pow(&ops::sub(&y, &t)?, 2.0)?)
}

/// How a run trains.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    /// The first step's index (a resumed run starts later).
    pub first_step: u64,
    /// Optimizer steps to take.
    pub steps: u64,
    /// Micro-batches per step.
    pub accum: usize,
    /// Gradient-norm bound (0: none).
    pub clip: f64,
    /// Learning rate.
    pub lr: f64,
}

/// Drives `engine` through `run`: per micro-batch the loss divided by
/// `accum` (times the loss scale) goes to `backward`, then one `step`.
/// `poison(step)` may set a gradient before the last micro-batch's backward.
pub fn train(engine: &mut dyn Engine, run: Run, mut scaler: Option<&mut GradScaler>, poison: &dyn Fn(u64, &[(String, Tensor)])) -> Result<Vec<StepOutcome>> {
    let (rank, world) = (engine.rank(), engine.world_size());
    let mut out = Vec::new();
    for step in run.first_step..run.first_step + run.steps {
        for micro in 0..run.accum {
            let params = engine.parameters().to_vec();
            let mut loss = ops::mul_scalar(&local_loss(&params, step, micro, rank, world)?, 1.0 / run.accum as f64)?;
            if let Some(s) = scaler.as_deref() {
                loss = s.scale_loss(&loss)?;
            }
            let last = micro + 1 == run.accum;
            if last {
                poison(step, &params);
            }
            engine.backward(&loss, last)?;
        }
        let o = engine.step(run.lr, run.clip, scaler.as_deref_mut())?;
        if let Some(s) = scaler.as_deref_mut() {
            s.update();
        }
        out.push(o);
    }
    Ok(out)
}

/// Every parameter's values, flat in order.
pub fn flat_values(params: &[(String, Tensor)]) -> Vec<f32> {
    params.iter().flat_map(|(_, p)| p.to_vec::<f32>().expect("f32 parameter")).collect()
}

/// The largest |a − b| / max(|b|, 1e-3) over two equally long vectors.
pub fn max_rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(&x, &y)| ((x as f64 - y as f64).abs()) / (y as f64).abs().max(1e-3)).fold(0.0, f64::max)
}

struct Hub {
    slots: Mutex<Vec<Vec<f64>>>,
    barrier: Barrier,
}

/// Ranks as threads of one process: every collective is an exchange of all
/// ranks' values through shared memory, reduced in rank order in f64.
pub struct LocalComm {
    rank: usize,
    world: usize,
    hub: Arc<Hub>,
    timeout: Duration,
}

impl LocalComm {
    /// One communicator per rank of a group of `world`.
    pub fn group(world: usize) -> Vec<LocalComm> {
        let hub = Arc::new(Hub { slots: Mutex::new(vec![Vec::new(); world]), barrier: Barrier::new(world) });
        (0..world).map(|rank| LocalComm { rank, world, hub: hub.clone(), timeout: Duration::from_secs(30) }).collect()
    }

    fn exchange(&self, v: Vec<f64>) -> Vec<Vec<f64>> {
        self.hub.slots.lock().expect("slots")[self.rank] = v;
        self.hub.barrier.wait();
        let all = self.hub.slots.lock().expect("slots").clone();
        self.hub.barrier.wait();
        all
    }
}

fn write(t: &Tensor, v: Vec<f64>) -> Result<()> {
    let src = match t.dtype() {
        DType::F64 => Tensor::from_vec(v, t.dims().to_vec(), &Device::Cpu)?,
        _ => Tensor::from_vec(v.into_iter().map(|x| x as f32).collect::<Vec<f32>>(), t.dims().to_vec(), &Device::Cpu)?,
    };
    t.assign(&src)
}

fn reduce(all: &[Vec<f64>], op: ReduceOp) -> Vec<f64> {
    let n = all[0].len();
    (0..n)
        .map(|i| {
            let xs = all.iter().map(|v| v[i]);
            match op {
                ReduceOp::Sum => xs.sum(),
                ReduceOp::Avg => xs.sum::<f64>() / all.len() as f64,
                ReduceOp::Max => xs.fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Min => xs.fold(f64::INFINITY, f64::min),
            }
        })
        .collect()
}

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }
    fn all_reduce(&mut self, t: &Tensor, op: ReduceOp) -> Result<()> {
        let all = self.exchange(t.to_f64_vec()?);
        write(t, reduce(&all, op))
    }
    fn broadcast(&mut self, t: &Tensor, root: usize) -> Result<()> {
        let all = self.exchange(t.to_f64_vec()?);
        write(t, all[root].clone())
    }
    fn all_gather(&mut self, input: &Tensor, output: &Tensor) -> Result<()> {
        let all = self.exchange(input.to_f64_vec()?);
        write(output, all.concat())
    }
    fn reduce_scatter(&mut self, input: &Tensor, output: &Tensor, op: ReduceOp) -> Result<()> {
        let n = output.elem_count();
        let all = self.exchange(input.to_f64_vec()?);
        write(output, reduce(&all, op)[self.rank * n..(self.rank + 1) * n].to_vec())
    }
    fn barrier(&mut self) -> Result<()> {
        self.exchange(Vec::new());
        Ok(())
    }
}

/// The unit roundoff of a half type: half the distance from 1 to the next
/// value (f16 has 11 significant bits, bf16 8).
pub fn unit_roundoff(half: DType) -> f64 {
    match half {
        DType::BF16 => 2f64.powi(-8),
        _ => 2f64.powi(-11),
    }
}

/// How much Adam can amplify a relative error of its gradients into its
/// update, over the first `steps` steps: with bias-corrected moments
/// m̂ = Σ a_k g_k and v̂ = Σ b_k g_k² (a_k, b_k ≥ 0 each summing to 1),
/// Cauchy–Schwarz gives Σ a_k |g_k| / √v̂ ≤ √(Σ a_k² / b_k); the largest
/// value of that over t ≤ `steps`.
pub fn adam_gain(betas: (f64, f64), steps: u64) -> f64 {
    let (b1, b2) = betas;
    (1..=steps as i32)
        .map(|t| {
            (1..=t)
                .map(|k| {
                    let a = (1.0 - b1) * b1.powi(t - k) / (1.0 - b1.powi(t));
                    let b = (1.0 - b2) * b2.powi(t - k) / (1.0 - b2.powi(t));
                    a * a / b
                })
                .sum::<f64>()
                .sqrt()
        })
        .fold(0.0, f64::max)
}

/// The largest change of any parameter that DDP's half-precision gradient
/// all-reduce (`--fp16_grad_sync`) may cause after `run` at `world` ranks,
/// derived from the half type's rounding, first order:
///
/// - the reduced gradient: each rank's share g_r/w is rounded once to the
///   half type and the w shares are summed with w − 1 roundings, each
///   within u of a partial sum no larger than Σ|g_r|/w, so the average is
///   off by at most w·u·mean|g_r| (≈ w·u·|ḡ| where the ranks' gradients do
///   not cancel; their rows come from one distribution);
/// - the clip: the global norm, and so the clip coefficient, moves by the
///   same relative amount, which doubles the relative error ε = 2·w·u;
/// - Adam: relative errors ε in every gradient move m̂ by at most
///   ε·Σ a_k|g_k| and v̂ by at most 2ε·v̂, so the update lr·m̂/√v̂ moves by at
///   most 2·lr·ε·[`adam_gain`] per step, accumulated over the steps.
///
/// A factor 2 covers what first order leaves out (the trajectories part, so
/// later gradients are taken at slightly different parameters).
pub fn half_sync_bound(half: DType, world: usize, run: Run, betas: (f64, f64)) -> f64 {
    let eps = 2.0 * world as f64 * unit_roundoff(half);
    2.0 * 2.0 * run.lr * eps * adam_gain(betas, run.steps) * run.steps as f64
}

/// The largest |a − b| over two equally long vectors.
pub fn max_abs(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(&x, &y)| (x as f64 - y as f64).abs()).fold(0.0, f64::max)
}

/// Checks a DDP run with `--fp16_grad_sync` in `half` (`got`) against one
/// process on the whole batch (`want`) and against the same DDP with the
/// all-reduce in f32 (`full`): within [`half_sync_bound`] of the first, and
/// off the second by clearly more than f32 rounding (the cast happened).
#[allow(clippy::too_many_arguments)]
pub fn check_half_sync(label: &str, half: DType, world: usize, run: Run, betas: (f64, f64), got: &[f32], want: &[f32], full: &[f32]) {
    let bound = half_sync_bound(half, world, run, betas);
    let (vs_single, vs_full, full_vs_single) = (max_abs(got, want), max_abs(got, full), max_abs(full, want));
    println!(
        "HALF {label} {} world {world}: max |Δθ| vs one process {vs_single:.3e} (bound {bound:.3e}), vs the f32 all-reduce {vs_full:.3e}; f32 all-reduce vs one process {full_vs_single:.3e}",
        half.as_str()
    );
    assert!(vs_single <= bound, "{label} in {}: max |Δθ| {vs_single:e} vs one process exceeds the bound {bound:e} derived from its rounding", half.as_str());
    assert!(got != full, "{label} in {}: bitwise equal to the f32 all-reduce: the buckets were not rounded", half.as_str());
    assert!(
        vs_full > 10.0 * full_vs_single,
        "{label} in {}: off the f32 all-reduce by {vs_full:e}, not clearly more than f32 rounding ({full_vs_single:e})",
        half.as_str()
    );
}

/// Checks a half-precision DDP run's gradient norms (before clipping)
/// against one process's: the averaged gradient is off by at most w·u
/// relative ([`half_sync_bound`]), and so is its norm; twice that leaves
/// room for the parameters having drifted apart by then.
pub fn check_half_norms(label: &str, half: DType, world: usize, got: &[StepOutcome], want: &[StepOutcome]) {
    let bound = 2.0 * world as f64 * unit_roundoff(half);
    let worst = got.iter().zip(want).map(|(g, w)| (g.grad_norm - w.grad_norm).abs() / w.grad_norm).fold(0.0, f64::max);
    println!("HALF {label} {} world {world}: gradient norms vs one process, max relative difference {worst:.3e} (bound {bound:.3e})", half.as_str());
    assert_eq!(got.len(), want.len());
    assert!(worst <= bound, "{label} in {}: gradient norm off one process's by {worst:e} relative, more than {bound:e}", half.as_str());
}

/// Trains `steps` steps of one micro-batch each; on rank `bad_rank`, before
/// the backward of step `bad_step`, parameter 0 gets the gradient
/// `bad_grad(param)` (one the engine cannot reduce), and that backward must
/// fail. Every rank still steps after it, so the collectives of every rank
/// stay matched only if the failing backward issued all of its own.
/// Returns that backward's error (on `bad_rank`).
pub fn train_with_failing_backward(
    engine: &mut dyn Engine,
    steps: u64,
    bad_step: u64,
    bad_rank: usize,
    clip: f64,
    bad_grad: &dyn Fn(&Tensor) -> Tensor,
) -> Result<Option<String>> {
    let (rank, world) = (engine.rank(), engine.world_size());
    let mut failure = None;
    for step in 0..steps {
        let params = engine.parameters().to_vec();
        let loss = local_loss(&params, step, 0, rank, world)?;
        let bad = step == bad_step && rank == bad_rank;
        if bad {
            params[0].1.set_grad(Some(bad_grad(&params[0].1)))?;
        }
        match (engine.backward(&loss, true), bad) {
            (Ok(()), false) => {}
            (Err(e), true) => failure = Some(e.to_string()),
            (Ok(()), true) => return Err(asrforge::Error::Msg(format!("rank {rank} step {step}: the poisoned backward succeeded"))),
            (Err(e), false) => return Err(e),
        }
        engine.step(0.01, clip, None)?;
    }
    Ok(failure)
}
