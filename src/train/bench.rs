//! `asrforge bench-train`: a fixed number of training steps of a config's
//! model on synthetic features, through the trainer's own executor (the
//! same forward, loss scaling, unscale, clipping, Adam and schedule as
//! `asrforge train`), reporting the loss at initialisation, the first and
//! last step's loss, frames per second and peak memory. It is how the GPU
//! check compares f32, fp16-AMP and bf16 training with the CPU.

use super::bench_stats::StepStats;
use super::{
    amp_dtype, init_device, init_optimizer_and_scheduler, parse_train_config, read_config, DistInfo, Executor, ExecutorParts, Resume, SingleProcess, TrainArgs,
};
use crate::autograd;
use crate::autograd::no_grad;
use crate::data::batch::IGNORE_ID;
use crate::data::Batch;
use crate::error::{Error, Result};
use crate::models::{AsrModel, ModelConfig};
use crate::nn::Module;
use crate::tensor::{peak_bytes, reset_peak_bytes, DType, Device, Rng, Tensor};
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `bench-train`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchTrainArgs {
    /// The train.yaml whose model is trained (input_dim and output_dim required).
    #[arg(long)]
    pub config: PathBuf,
    /// Overrides a nested config key, e.g. "scheduler_conf.warmup_steps 10" (repeatable).
    #[arg(long = "override_config", alias = "override-config", value_name = "KEY VALUE")]
    pub override_config: Vec<String>,
    /// Optimizer steps to run.
    #[arg(long, default_value_t = 50)]
    pub steps: u64,
    /// cpu or cuda (the GPU numbered LOCAL_RANK).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    pub device: String,
    /// fp32, fp16 (autocast with the loss scaler) or bf16 (autocast, no scaler).
    #[arg(long, default_value = "fp32", value_parser = ["fp32", "f32", "fp16", "bf16"])]
    pub dtype: String,
    /// Utterances per batch.
    #[arg(long = "batch_size", alias = "batch-size", default_value_t = 16)]
    pub batch_size: usize,
    /// Frames of the longest utterance (the others are shorter, down to 3/4 of it).
    #[arg(long, default_value_t = 512)]
    pub frames: usize,
    /// Seed of the model and of the synthetic batch.
    #[arg(long, default_value_t = 777)]
    pub seed: u64,
    /// Warm-up steps left out of the step-time statistics (the first allocates and fills caches).
    #[arg(long, default_value_t = 1)]
    pub warmup: u64,
    /// Prints a per-op table (forward and backward per op kind: calls, time, bytes) of the timed steps,
    /// and on a GPU a per-kernel-family table of the last step (launches, bytes, GEMM FLOPs, a modelled
    /// H200 time, and on a real GPU the time CUDA events measured).
    #[arg(long)]
    pub profile: bool,
    /// Allows TF32 tensor cores for f32 matrix products on the GPU (as `train --tf32`).
    #[arg(long)]
    pub tf32: bool,
}

/// What a bench run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchReport {
    /// The device trained on.
    pub device: Device,
    /// The autocast half type (none: f32).
    pub autocast: Option<DType>,
    /// The loss of the initial model in eval mode (no dropout), under the run's autocast:
    /// comparable across devices.
    pub init_loss: f64,
    /// Every step's loss (train mode, before that step's update).
    pub losses: Vec<f64>,
    /// Steps skipped for an inf/NaN gradient.
    pub skipped: u64,
    /// Valid (unpadded) feature frames per second at the median step time.
    pub frames_per_s: f64,
    /// Median, min and max time of the steps after the warm-up (all steps when there are no more).
    pub step: StepStats,
    /// Number of trained parameter elements.
    pub params: usize,
    /// The per-op profile of the timed steps (with `--profile`).
    pub profile: Option<crate::autograd::Profile>,
    /// The most memory live at once, in bytes: tensor storage during the
    /// steps on the CPU, the allocator's peak in use since the GPU opened on a GPU.
    pub peak_bytes: u64,
    /// On a GPU (real or emulated): the driver seam's counters over the
    /// steady-state steps (after the first) and how many steps they cover.
    pub counters: Option<(crate::backend::cuda::Counters, u64)>,
    /// On a GPU with `--profile`: the per-kernel-family profile of the last
    /// step, and the seam's counters over that same step.
    pub kernel_profile: Option<(crate::backend::cuda::profile::KernelProfile, crate::backend::cuda::Counters)>,
    /// The fused families that ran (`none`, `all` or a list; see [`crate::ops::fusion`]).
    pub fusion: String,
}

impl BenchReport {
    /// One `key=value` line, for scripts.
    pub fn line(&self) -> String {
        let dt = match self.autocast {
            None => "fp32",
            Some(DType::F16) => "fp16",
            Some(_) => "bf16",
        };
        let first = self.losses.first().copied().unwrap_or(f64::NAN);
        let last = self.losses.last().copied().unwrap_or(f64::NAN);
        format!(
            "bench-train device={:?} dtype={dt} fusion={} steps={} init_loss={:.6} first_loss={first:.6} last_loss={last:.6} skipped={} frames_per_s={:.1} step_ms_median={:.1} step_ms_min={:.1} step_ms_max={:.1} timed_steps={} params={} peak_mib={:.1}",
            self.device,
            self.fusion,
            self.losses.len(),
            self.init_loss,
            self.skipped,
            self.frames_per_s,
            self.step.median_ms,
            self.step.min_ms,
            self.step.max_ms,
            self.step.steps,
            self.params,
            self.peak_bytes as f64 / (1 << 20) as f64
        ) + &match &self.counters {
            Some((c, n)) => format!(" per_step(steady, {n} steps): {}", c.per_step_line(*n)),
            None => String::new(),
        }
    }
}

/// A synthetic batch for a model of `input_dim` features and `vocab`
/// symbols: standard normal features, lengths from `frames` down to 3/4 of
/// it, and random tokens (never blank, unk or sos/eos) about one per 40 frames.
pub fn synthetic_batch(batch_size: usize, frames: usize, input_dim: usize, vocab: usize, seed: u64) -> Result<Batch> {
    if batch_size == 0 || frames < 16 || vocab < 4 {
        return Err(Error::invalid(
            "bench-train",
            format!("expected batch_size >= 1, frames >= 16 and a vocabulary of >= 4, found {batch_size}, {frames} and {vocab}"),
        ));
    }
    let mut rng = Rng::new(seed);
    let lens: Vec<usize> = (0..batch_size).map(|i| frames - (frames / 4) * i / batch_size.max(2).saturating_sub(1).max(1)).collect();
    let tlens: Vec<usize> = lens.iter().map(|&l| (l / 40).max(1)).collect();
    let l_max = tlens.iter().copied().max().unwrap_or(1);
    let mut feats = vec![0f32; batch_size * frames * input_dim];
    for (b, &l) in lens.iter().enumerate() {
        let x = rng.normal(l * input_dim);
        for (d, v) in feats[b * frames * input_dim..][..l * input_dim].iter_mut().zip(x) {
            *d = v as f32;
        }
    }
    let mut target = vec![IGNORE_ID; batch_size * l_max];
    for (b, &tl) in tlens.iter().enumerate() {
        for t in 0..tl {
            target[b * l_max + t] = 2 + rng.below(vocab - 3) as i64;
        }
    }
    Ok(Batch {
        keys: (0..batch_size).map(|i| format!("synthetic{i}")).collect(),
        feats: Tensor::from_vec(feats, [batch_size, frames, input_dim], &Device::Cpu)?,
        feats_lengths: lens,
        target: Tensor::from_vec(target, [batch_size, l_max], &Device::Cpu)?,
        target_lengths: tlens,
    })
}

/// Runs the bench and returns its report (the steps are logged to stderr).
pub fn run_bench_train(a: &BenchTrainArgs) -> Result<BenchReport> {
    let root = read_config(&a.config, &a.override_config)?;
    let cfg = parse_train_config(&root)?;
    let dtype = if a.dtype == "f32" { "fp32" } else { a.dtype.as_str() };
    let targs = TrainArgs { device: a.device.clone(), dtype: dtype.to_string(), tf32: a.tf32, ..Default::default() };
    super::device::init_gemm(&targs, &cfg);
    super::device::init_fusion(&cfg)?;
    let autocast = amp_dtype(&targs)?;
    let device = init_device(&targs, &super::dist::dist_info_from(&|k| std::env::var(k).ok()).unwrap_or_else(|_| DistInfo::single()))?;
    let (mcfg, _) = ModelConfig::from_yaml(&root)?;
    let mut model = AsrModel::new(&mcfg, DType::F32, &mut Rng::new(a.seed))?;
    super::device::move_model(&model, &device)?;
    let batch = synthetic_batch(a.batch_size, a.frames, mcfg.input_dim, mcfg.output_dim, a.seed + 1)?.to_device(&device)?;
    crate::tensor::rng::manual_seed(a.seed);
    model.train(false);
    let init_loss = no_grad(|| {
        crate::ops::autocast_params_packed(autocast, &model.layer_groups(), &model.weight_packs(), || {
            model.forward(&batch.feats, &batch.feats_lengths, &batch.target, &batch.target_lengths)
        })
    })?
    .loss
    .to_scalar()?;
    model.train(true);
    let params = model.named_parameters();
    let n_params = params.iter().map(|(_, p)| p.elem_count()).sum();
    let optim = init_optimizer_and_scheduler(&cfg, &Resume::default())?;
    let scaler = super::init_scaler(&targs, &Resume::default());
    let engine = SingleProcess::new(params, optim.adam)?;
    let mut exec = Executor::new(ExecutorParts { scaler, device, autocast, ..ExecutorParts::new(model, Box::new(engine), optim, cfg) });
    let frames: usize = batch.feats_lengths.iter().sum();
    let mut losses = Vec::new();
    reset_peak_bytes();
    let warmup = if a.steps > a.warmup { a.warmup } else { 0 };
    let mut times = Vec::new();
    let mut profile = a.profile.then(autograd::Profile::default);
    let mut kernel_profile = None;
    let counters_now = || match device {
        Device::Cuda(n) => crate::backend::cuda::counters(n).map(Some),
        Device::Cpu => Ok(None),
    };
    // The warm-up steps fill the allocator and load the modules: count the timed steps only.
    let mut start = counters_now()?;
    let mut prev = start;
    for step in 1..=a.steps {
        let timed = step > warmup;
        if step == warmup + 1 {
            start = counters_now()?;
        }
        if timed && profile.is_some() {
            autograd::start_profile(None);
        }
        // The kernel profile covers the last step, a steady-state one when there was a warm-up.
        let kernel_step = match device {
            Device::Cuda(n) if a.profile && step == a.steps => {
                crate::backend::cuda::start_profile(n)?;
                Some((n, counters_now()?))
            }
            _ => None,
        };
        let t0 = Instant::now();
        exec.engine.zero_grad();
        autograd::profile_reset_clock();
        exec.train_batch(&batch)?;
        autograd::profile_mark("losses queued for the host", 0);
        let rep = exec.optimizer_step()?;
        autograd::profile_mark("optimizer step and losses read", 0);
        if timed {
            times.push(t0.elapsed());
            if let (Some(p), Some(mut got)) = (profile.as_mut(), autograd::stop_profile()) {
                got.steps = 1;
                p.merge(&got);
            }
        }
        if let Some((n, Some(before))) = kernel_step {
            let step_counts = crate::backend::cuda::counters(n)?.since(&before);
            kernel_profile = Some((crate::backend::cuda::stop_profile(n)?, step_counts));
        }
        // Read by the step already: no wait here.
        let bl = exec.last_batch()?.unwrap_or_default();
        losses.push(bl.loss);
        // On a GPU: what this step cost the host (launches, waits, copies, allocations).
        let step_counts = match (counters_now()?, prev) {
            (Some(now), Some(p)) => {
                prev = Some(now);
                format!(" | {}", now.since(&p).per_step_line(1))
            }
            _ => String::new(),
        };
        eprintln!(
            "step {step}: loss {:.6} grad_norm {:.4} lr {:.3e}{}{step_counts}",
            bl.loss,
            rep.grad_norm,
            rep.lr,
            if rep.skipped { " (skipped)" } else { "" }
        );
    }
    let step_stats = StepStats::of(&times);
    let counters = match (counters_now()?, start) {
        (Some(end), Some(start)) => Some((end.since(&start), times.len() as u64)),
        _ => None,
    };
    // On a GPU: the caching allocator's peak of bytes in use (size classes).
    let peak = match device {
        Device::Cuda(n) => crate::backend::cuda::device(n)?.pool_stats().peak as u64,
        Device::Cpu => peak_bytes(),
    };
    Ok(BenchReport {
        device,
        autocast,
        init_loss,
        losses,
        skipped: exec.skipped_steps,
        frames_per_s: step_stats.frames_per_s(frames),
        step: step_stats,
        params: n_params,
        profile,
        peak_bytes: peak,
        counters,
        kernel_profile,
        fusion: crate::ops::fusion::describe(),
    })
}
