//! DeepSpeed JSON configs (`--deepspeed_config`): the keys asrforge acts on,
//! with DeepSpeed's defaults and spellings, `"auto"` where DeepSpeed allows
//! it (taken from train.yaml), a warning per unknown key path, and WeNet's
//! consistency checks against train.yaml (`check_modify_and_save_config`):
//! `train_micro_batch_size_per_gpu` must be 1 (the data pipeline batches),
//! `gradient_accumulation_steps == accum_grad`,
//! `gradient_clipping == grad_clip`, `steps_per_print == log_interval`, and
//! at most one of fp16 and bf16 enabled; the JSON's fp16/bf16 decides the
//! deepspeed engine's precision (`--use_amp` is for torch_ddp).

use super::deepspeed_json::{kind_of, read_top, CountOrAuto};
use super::zero::ZeroOptions;
use crate::error::{Error, Result};
use crate::optim::{AdamConfig, ScalerConfig};
use crate::tensor::DType;
use serde_json::Value;
use std::path::Path;

/// A value that may be `"auto"` (decided by train.yaml).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Setting<T> {
    /// `"auto"`.
    Auto,
    /// A value written in the file.
    Value(T),
}

/// `fp16`: DeepSpeed's loss scaling settings (defaults as DeepSpeed's).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fp16Config {
    /// Whether fp16 mixed precision is on.
    pub enabled: bool,
    /// DeepSpeed's `auto_cast` of the inputs (accepted, no effect: inputs stay f32).
    pub auto_cast: bool,
    /// A static loss scale; 0 = dynamic.
    pub loss_scale: f64,
    /// The dynamic scale starts at 2^initial_scale_power.
    pub initial_scale_power: u32,
    /// Clean steps before the scale doubles.
    pub loss_scale_window: u64,
    /// Overflows absorbed before the scale halves.
    pub hysteresis: u64,
    /// Whether a clean step restores the hysteresis.
    pub consecutive_hysteresis: bool,
    /// The floor of the dynamic scale.
    pub min_loss_scale: f64,
}

impl Default for Fp16Config {
    fn default() -> Self {
        Fp16Config {
            enabled: false,
            auto_cast: false,
            loss_scale: 0.0,
            initial_scale_power: 16,
            loss_scale_window: 1000,
            hysteresis: 2,
            consecutive_hysteresis: false,
            min_loss_scale: 1.0,
        }
    }
}

/// `zero_optimization`.
#[derive(Clone, Debug, PartialEq)]
pub struct ZeroSection {
    /// 0 (plain data parallel), 1 or 2.
    pub stage: u8,
    /// Elements per gradient reduce-scatter.
    pub reduce_bucket_size: usize,
    /// Elements per parameter all-gather.
    pub allgather_bucket_size: usize,
    /// Reduction overlapping backward.
    pub overlap_comm: bool,
    /// Accepted (gradients are always copied into contiguous buckets).
    pub contiguous_gradients: bool,
    /// Reduce-scatter rather than all-reduce (accepted; always reduce-scatter).
    pub reduce_scatter: bool,
    /// All-gather of the partitions (accepted; always all-gather).
    pub allgather_partitions: bool,
}

impl Default for ZeroSection {
    fn default() -> Self {
        ZeroSection {
            stage: 0,
            reduce_bucket_size: 500_000_000,
            allgather_bucket_size: 500_000_000,
            overlap_comm: false,
            contiguous_gradients: true,
            reduce_scatter: true,
            allgather_partitions: true,
        }
    }
}

/// `optimizer`: Adam or AdamW and its `params`.
#[derive(Clone, Debug, PartialEq)]
pub struct OptimizerSection {
    /// `Adam` or `AdamW` (as written).
    pub kind: String,
    /// Learning rate.
    pub lr: Option<Setting<f64>>,
    /// (β1, β2).
    pub betas: Option<Setting<(f64, f64)>>,
    /// ε.
    pub eps: Option<Setting<f64>>,
    /// Weight decay.
    pub weight_decay: Option<Setting<f64>>,
    /// DeepSpeed's `adam_w_mode` (its Adam is decoupled unless this is false).
    pub adam_w_mode: Option<bool>,
}

/// `scheduler`: DeepSpeed's WarmupLR and its `params`.
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerSection {
    /// `WarmupLR`.
    pub kind: String,
    /// `warmup_min_lr`.
    pub warmup_min_lr: Option<Setting<f64>>,
    /// `warmup_max_lr`.
    pub warmup_max_lr: Option<Setting<f64>>,
    /// `warmup_num_steps`.
    pub warmup_num_steps: Option<Setting<f64>>,
    /// `warmup_type` (log or linear).
    pub warmup_type: Option<String>,
}

/// A parsed DeepSpeed JSON config.
#[derive(Clone, Debug, PartialEq)]
pub struct DeepSpeedConfig {
    /// The file it came from.
    pub path: String,
    /// `train_micro_batch_size_per_gpu`.
    pub train_micro_batch_size_per_gpu: Option<Setting<u64>>,
    /// `gradient_accumulation_steps`.
    pub gradient_accumulation_steps: Option<Setting<u64>>,
    /// `gradient_clipping`.
    pub gradient_clipping: Option<Setting<f64>>,
    /// `steps_per_print`.
    pub steps_per_print: Option<u64>,
    /// `communication_data_type` as written ("fp16", "bf16" or "fp32", any
    /// case, as DeepSpeed lowercases it): f16, bf16 or f32; `None` when
    /// absent (then the precision decides, [`DeepSpeedConfig::grad_comm_dtype`]).
    pub communication_data_type: Option<DType>,
    /// `zero_optimization`.
    pub zero: ZeroSection,
    /// `fp16`.
    pub fp16: Fp16Config,
    /// `bf16.enabled`.
    pub bf16: bool,
    /// `optimizer`.
    pub optimizer: Option<OptimizerSection>,
    /// `scheduler`.
    pub scheduler: Option<SchedulerSection>,
}

/// The precision the JSON asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// Neither fp16 nor bf16.
    Fp32,
    /// fp16 with loss scaling.
    Fp16,
    /// bf16.
    Bf16,
}

/// The train.yaml values WeNet checks a DeepSpeed config against.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainYamlKeys {
    /// `accum_grad`.
    pub accum_grad: usize,
    /// `grad_clip`.
    pub grad_clip: f64,
    /// `log_interval`.
    pub log_interval: usize,
}

/// DeepSpeed keys asrforge reads nothing from; they are warned about as having no effect.
const NO_EFFECT: [&str; 11] = [
    "activation_checkpointing",
    "flops_profiler",
    "tensorboard",
    "wall_clock_breakdown",
    "zero_force_ds_cpu_optimizer",
    "zero_allow_untested_optimizer",
    "train_batch_size",
    "prescale_gradients",
    "gradient_predivide_factor",
    "comms_logger",
    "dump_state",
];

/// The order of the warnings: top-level keys, then each section's in the
/// order of the file format (shallower keys first).
const SECTIONS: [&str; 6] = ["zero_optimization", "fp16", "bf16", "bfloat16", "optimizer", "scheduler"];

/// The warning for a key path no section struct has.
fn unknown_key_warning(path: &str, key: &str) -> String {
    if NO_EFFECT.contains(&key) {
        format!("deepspeed config {path}: key {key} has no effect in asrforge (ignored)")
    } else {
        format!("deepspeed config {path}: unknown key {key} (ignored)")
    }
}

/// Parses a DeepSpeed JSON config's text; returns it with one warning per unknown key path.
pub fn parse_deepspeed_config(text: &str, path: &str) -> Result<(DeepSpeedConfig, Vec<String>)> {
    let err = |key: &str, msg: String| Error::ConfigFile { path: path.to_string(), msg: format!("key {key}: {msg}") };
    let root: Value = serde_json::from_str(text).map_err(|e| Error::ConfigFile { path: path.to_string(), msg: format!("not valid JSON: {e}") })?;
    if !root.is_object() {
        return Err(Error::ConfigFile { path: path.to_string(), msg: format!("expected a JSON object at the top level, found {}", kind_of(&root)) });
    }
    let (top, mut unknown) = read_top(&root).map_err(|(key, msg)| err(&key, msg))?;
    unknown.sort_by_key(|k| {
        let section = k.split('.').next().and_then(|s| SECTIONS.iter().position(|&x| x == s));
        (k.contains('.'), section, k.matches('.').count())
    });
    let warnings = unknown.iter().map(|k| unknown_key_warning(path, k)).collect();

    let d = ZeroSection::default();
    let zero = match top.zero_optimization.0 {
        None => d,
        Some(z) => {
            let stage = match z.stage.0.unwrap_or(0) {
                s @ 0..=2 => s as u8,
                3 => return Err(err("zero_optimization.stage", "ZeRO stage 3 is not supported (use stage 1 or 2)".into())),
                s => return Err(err("zero_optimization.stage", format!("expected 0, 1 or 2, found {s}"))),
            };
            let bucket = |key: &str, s: CountOrAuto, default: usize| match s.0 {
                Some(Setting::Value(0)) => Err(err(&format!("zero_optimization.{key}"), "expected at least 1 element, found 0".into())),
                Some(Setting::Value(v)) => Ok(v as usize),
                Some(Setting::Auto) | None => Ok(default),
            };
            for (key, off) in [("offload_optimizer", &z.offload_optimizer), ("offload_param", &z.offload_param)] {
                let device = off.0.as_ref().and_then(|o| o.device.0.clone()).unwrap_or_else(|| "none".into());
                if device != "none" {
                    return Err(err(&format!("zero_optimization.{key}.device"), format!("offloading is not supported, expected \"none\", found {device:?}")));
                }
            }
            ZeroSection {
                stage,
                reduce_bucket_size: bucket("reduce_bucket_size", z.reduce_bucket_size, d.reduce_bucket_size)?,
                allgather_bucket_size: bucket("allgather_bucket_size", z.allgather_bucket_size, d.allgather_bucket_size)?,
                overlap_comm: z.overlap_comm.0.unwrap_or(d.overlap_comm),
                contiguous_gradients: z.contiguous_gradients.0.unwrap_or(d.contiguous_gradients),
                reduce_scatter: z.reduce_scatter.0.unwrap_or(d.reduce_scatter),
                allgather_partitions: z.allgather_partitions.0.unwrap_or(d.allgather_partitions),
            }
        }
    };

    let d = Fp16Config::default();
    let f = top.fp16.0.unwrap_or_default();
    let fp16 = Fp16Config {
        enabled: f.enabled.0.unwrap_or(d.enabled),
        auto_cast: f.auto_cast.0.unwrap_or(d.auto_cast),
        loss_scale: f.loss_scale.0.unwrap_or(d.loss_scale),
        initial_scale_power: u32::try_from(f.initial_scale_power.0.unwrap_or(d.initial_scale_power.into()))
            .map_err(|_| err("fp16.initial_scale_power", "expected at most 127".into()))?,
        loss_scale_window: f.loss_scale_window.0.unwrap_or(d.loss_scale_window),
        hysteresis: f.hysteresis.0.unwrap_or(d.hysteresis),
        consecutive_hysteresis: f.consecutive_hysteresis.0.unwrap_or(d.consecutive_hysteresis),
        min_loss_scale: f.min_loss_scale.0.unwrap_or(d.min_loss_scale),
    };
    if fp16.loss_scale < 0.0 || fp16.initial_scale_power > 127 || fp16.loss_scale_window == 0 {
        return Err(err(
            "fp16",
            format!(
                "expected loss_scale >= 0, initial_scale_power <= 127 and loss_scale_window >= 1, found {}, {} and {}",
                fp16.loss_scale, fp16.initial_scale_power, fp16.loss_scale_window
            ),
        ));
    }
    let bf16 = [&top.bf16, &top.bfloat16].iter().any(|s| s.0.as_ref().and_then(|b| b.enabled.0).unwrap_or(false));

    let optimizer = match top.optimizer.0 {
        None => None,
        Some(o) => {
            let kind = o.kind.0.ok_or_else(|| err("optimizer.type", "missing (expected Adam or AdamW)".into()))?;
            if !matches!(kind.to_ascii_lowercase().as_str(), "adam" | "adamw") {
                return Err(err("optimizer.type", format!("expected Adam or AdamW, found {kind:?}")));
            }
            let p = o.params.0.unwrap_or_default();
            Some(OptimizerSection { kind, lr: p.lr.0, betas: p.betas.0, eps: p.eps.0, weight_decay: p.weight_decay.0, adam_w_mode: p.adam_w_mode.0 })
        }
    };

    let scheduler = match top.scheduler.0 {
        None => None,
        Some(s) => {
            let kind = s.kind.0.ok_or_else(|| err("scheduler.type", "missing (expected WarmupLR)".into()))?;
            if kind != "WarmupLR" {
                return Err(err("scheduler.type", format!("expected WarmupLR, found {kind:?}")));
            }
            let p = s.params.0.unwrap_or_default();
            if let Some(w) = &p.warmup_type.0 {
                if w != "log" && w != "linear" {
                    return Err(err("scheduler.params.warmup_type", format!("expected log or linear, found {w:?}")));
                }
            }
            Some(SchedulerSection {
                kind,
                warmup_min_lr: p.warmup_min_lr.0,
                warmup_max_lr: p.warmup_max_lr.0,
                warmup_num_steps: p.warmup_num_steps.0,
                warmup_type: p.warmup_type.0,
            })
        }
    };

    let communication_data_type = match top.communication_data_type.0.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None => None,
        Some("fp16") => Some(DType::F16),
        Some("bf16") => Some(DType::BF16),
        Some("fp32") => Some(DType::F32),
        Some(other) => return Err(err("communication_data_type", format!("expected \"fp16\", \"bf16\" or \"fp32\", found {other:?}"))),
    };

    let cfg = DeepSpeedConfig {
        path: path.to_string(),
        communication_data_type,
        train_micro_batch_size_per_gpu: top.train_micro_batch_size_per_gpu.0,
        gradient_accumulation_steps: top.gradient_accumulation_steps.0,
        gradient_clipping: top.gradient_clipping.0,
        steps_per_print: top.steps_per_print.0,
        zero,
        fp16,
        bf16,
        optimizer,
        scheduler,
    };
    Ok((cfg, warnings))
}

/// Reads and parses a DeepSpeed JSON file; the warnings are also printed to stderr.
pub fn load_deepspeed_config(path: &Path) -> Result<(DeepSpeedConfig, Vec<String>)> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: p.clone(), source })?;
    let (cfg, warnings) = parse_deepspeed_config(&text, &p)?;
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    Ok((cfg, warnings))
}

impl DeepSpeedConfig {
    /// WeNet's checks against train.yaml (`train_path` names it in errors).
    pub fn check_against(&self, yaml: &TrainYamlKeys, train_path: &str) -> Result<()> {
        let p = &self.path;
        let mismatch = |ds: &str, dv: String, key: &str, tv: String| Error::ConfigFile {
            path: p.clone(),
            msg: format!("{ds} is {dv} in {p} but {key} is {tv} in {train_path}; they must be equal"),
        };
        if let Some(Setting::Value(b)) = self.train_micro_batch_size_per_gpu {
            if b != 1 {
                return Err(Error::ConfigFile {
                    path: p.clone(),
                    msg: format!("train_micro_batch_size_per_gpu: expected 1 (batches come from dataset_conf.batch_conf in {train_path}), found {b}"),
                });
            }
        }
        if let Some(Setting::Value(g)) = self.gradient_accumulation_steps {
            if g as usize != yaml.accum_grad {
                return Err(mismatch("gradient_accumulation_steps", g.to_string(), "accum_grad", yaml.accum_grad.to_string()));
            }
        }
        if let Some(Setting::Value(c)) = self.gradient_clipping {
            if c != yaml.grad_clip {
                return Err(mismatch("gradient_clipping", c.to_string(), "grad_clip", yaml.grad_clip.to_string()));
            }
        }
        if let Some(s) = self.steps_per_print {
            if s as usize != yaml.log_interval {
                return Err(mismatch("steps_per_print", s.to_string(), "log_interval", yaml.log_interval.to_string()));
            }
        }
        self.precision().map(|_| ())
    }

    /// fp16, bf16 or fp32; both enabled is an error.
    pub fn precision(&self) -> Result<Precision> {
        match (self.fp16.enabled, self.bf16) {
            (true, true) => Err(Error::ConfigFile { path: self.path.clone(), msg: "fp16.enabled and bf16.enabled are both true; enable at most one".into() }),
            (true, false) => Ok(Precision::Fp16),
            (false, true) => Ok(Precision::Bf16),
            (false, false) => Ok(Precision::Fp32),
        }
    }

    /// The loss scaler fp16 asks for (None without fp16): dynamic with
    /// DeepSpeed's semantics when `loss_scale` is 0, else a fixed scale.
    pub fn scaler_config(&self) -> Option<ScalerConfig> {
        let f = &self.fp16;
        if !f.enabled {
            return None;
        }
        Some(if f.loss_scale == 0.0 {
            ScalerConfig {
                init_scale: 2f64.powi(f.initial_scale_power as i32),
                growth_factor: 2.0,
                backoff_factor: 0.5,
                growth_interval: f.loss_scale_window,
                hysteresis: f.hysteresis.max(1),
                consecutive_hysteresis: f.consecutive_hysteresis,
                min_scale: f.min_loss_scale,
            }
        } else {
            ScalerConfig {
                init_scale: f.loss_scale,
                growth_factor: 1.0,
                backoff_factor: 1.0,
                growth_interval: u64::MAX,
                hysteresis: 1,
                consecutive_hysteresis: false,
                min_scale: 0.0,
            }
        })
    }

    /// The type ZeRO's gradient reduce-scatter travels in, by DeepSpeed's
    /// rule (its engine's `communication_data_type` property):
    /// `communication_data_type` when the file sets it, else f16 with fp16
    /// enabled, bf16 with bf16 enabled, f32 otherwise. `None` means f32.
    pub fn grad_comm_dtype(&self) -> Result<Option<DType>> {
        let d = match self.communication_data_type {
            Some(d) => d,
            None => match self.precision()? {
                Precision::Fp16 => DType::F16,
                Precision::Bf16 => DType::BF16,
                Precision::Fp32 => DType::F32,
            },
        };
        Ok((d != DType::F32).then_some(d))
    }

    /// The ZeRO engine's options (stage 1 or 2).
    pub fn zero_options(&self) -> ZeroOptions {
        let z = &self.zero;
        ZeroOptions { stage: z.stage, reduce_bucket_size: z.reduce_bucket_size, allgather_bucket_size: z.allgather_bucket_size, overlap_comm: z.overlap_comm }
    }

    /// The Adam settings: train.yaml's (`base`) with the JSON's `optimizer`
    /// section over them (WeNet lets DeepSpeed build the optimizer when the
    /// JSON names one). DeepSpeed's `Adam` decays decoupled unless `adam_w_mode` is false.
    pub fn adam_config(&self, base: AdamConfig) -> AdamConfig {
        let Some(o) = &self.optimizer else { return base };
        let pick = |s: Option<Setting<f64>>, d: f64| match s {
            Some(Setting::Value(v)) => v,
            _ => d,
        };
        AdamConfig {
            lr: pick(o.lr, base.lr),
            betas: match o.betas {
                Some(Setting::Value(b)) => b,
                _ => base.betas,
            },
            eps: pick(o.eps, base.eps),
            weight_decay: pick(o.weight_decay, base.weight_decay),
            decoupled: o.kind.eq_ignore_ascii_case("adamw") || o.adam_w_mode.unwrap_or(true),
        }
    }
}
