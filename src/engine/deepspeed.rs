//! DeepSpeed JSON configs (`--deepspeed_config`): the keys asrforge acts on,
//! with DeepSpeed's defaults and spellings, `"auto"` where DeepSpeed allows
//! it (taken from train.yaml), a warning per unknown key path, and WeNet's
//! consistency checks against train.yaml (`check_modify_and_save_config`):
//! `train_micro_batch_size_per_gpu` must be 1 (the data pipeline batches),
//! `gradient_accumulation_steps == accum_grad`,
//! `gradient_clipping == grad_clip`, `steps_per_print == log_interval`, and
//! at most one of fp16 and bf16 enabled; the JSON's fp16/bf16 decides the
//! deepspeed engine's precision (`--use_amp` is for torch_ddp).

use super::zero::ZeroOptions;
use crate::error::{Error, Result};
use crate::optim::{AdamConfig, ScalerConfig};
use serde_json::{Map, Value};
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
const NO_EFFECT: [&str; 12] = [
    "activation_checkpointing",
    "flops_profiler",
    "tensorboard",
    "wall_clock_breakdown",
    "zero_force_ds_cpu_optimizer",
    "zero_allow_untested_optimizer",
    "train_batch_size",
    "prescale_gradients",
    "gradient_predivide_factor",
    "communication_data_type",
    "comms_logger",
    "dump_state",
];

struct Reader<'a> {
    path: &'a str,
    warnings: Vec<String>,
}

fn kind_of(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

impl<'a> Reader<'a> {
    fn err(&self, key: &str, msg: String) -> Error {
        Error::ConfigFile { path: self.path.to_string(), msg: format!("key {key}: {msg}") }
    }

    /// The object at `key` (None when absent), warning about keys outside `known`.
    fn object<'v>(&mut self, v: Option<&'v Value>, key: &str, known: &[&str]) -> Result<Option<&'v Map<String, Value>>> {
        match v {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(m)) => {
                for k in m.keys() {
                    if !known.contains(&k.as_str()) {
                        self.warnings.push(format!("deepspeed config {}: unknown key {} (ignored)", self.path, join(key, k)));
                    }
                }
                Ok(Some(m))
            }
            Some(other) => Err(self.err(key, format!("expected an object, found {}", kind_of(other)))),
        }
    }

    fn bool(&self, m: Option<&Map<String, Value>>, prefix: &str, key: &str, default: bool) -> Result<bool> {
        match m.and_then(|m| m.get(key)) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(self.err(&join(prefix, key), format!("expected true or false, found {}", kind_of(other)))),
        }
    }

    fn num(&self, m: Option<&Map<String, Value>>, prefix: &str, key: &str, auto: bool) -> Result<Option<Setting<f64>>> {
        let k = join(prefix, key);
        match m.and_then(|m| m.get(key)) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => n.as_f64().map(|x| Some(Setting::Value(x))).ok_or_else(|| self.err(&k, format!("expected a number, found {n}"))),
            Some(Value::String(s)) if auto && s == "auto" => Ok(Some(Setting::Auto)),
            Some(other) => Err(self.err(&k, format!("expected a number{}, found {}", if auto { " or \"auto\"" } else { "" }, kind_of(other)))),
        }
    }

    fn count(&self, m: Option<&Map<String, Value>>, prefix: &str, key: &str, auto: bool) -> Result<Option<Setting<u64>>> {
        let k = join(prefix, key);
        match self.num(m, prefix, key, auto)? {
            None => Ok(None),
            Some(Setting::Auto) => Ok(Some(Setting::Auto)),
            // DeepSpeed's own files write counts as 1e8; any integral value is a count.
            Some(Setting::Value(x)) if x >= 0.0 && x.fract() == 0.0 && x < 1.8e19 => Ok(Some(Setting::Value(x as u64))),
            Some(Setting::Value(x)) => Err(self.err(&k, format!("expected a non-negative integer, found {x}"))),
        }
    }

    fn fixed<T>(&self, s: Option<Setting<T>>, key: &str) -> Result<Option<T>> {
        match s {
            Some(Setting::Auto) => Err(self.err(key, "\"auto\" is not allowed here".into())),
            Some(Setting::Value(v)) => Ok(Some(v)),
            None => Ok(None),
        }
    }

    fn string(&self, m: Option<&Map<String, Value>>, prefix: &str, key: &str) -> Result<Option<String>> {
        match m.and_then(|m| m.get(key)) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.err(&join(prefix, key), format!("expected a string, found {}", kind_of(other)))),
        }
    }
}

/// Parses a DeepSpeed JSON config's text; returns it with one warning per unknown key path.
pub fn parse_deepspeed_config(text: &str, path: &str) -> Result<(DeepSpeedConfig, Vec<String>)> {
    let root: Value = serde_json::from_str(text).map_err(|e| Error::ConfigFile { path: path.to_string(), msg: format!("not valid JSON: {e}") })?;
    let mut r = Reader { path, warnings: Vec::new() };
    const TOP: [&str; 10] = [
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
        "steps_per_print",
        "zero_optimization",
        "fp16",
        "bf16",
        "optimizer",
        "scheduler",
        "bfloat16",
    ];
    let top = match &root {
        Value::Object(m) => m,
        other => return Err(Error::ConfigFile { path: path.to_string(), msg: format!("expected a JSON object at the top level, found {}", kind_of(other)) }),
    };
    for k in top.keys() {
        if NO_EFFECT.contains(&k.as_str()) {
            r.warnings.push(format!("deepspeed config {path}: key {k} has no effect in asrforge (ignored)"));
        } else if !TOP.contains(&k.as_str()) {
            r.warnings.push(format!("deepspeed config {path}: unknown key {k} (ignored)"));
        }
    }
    let t = Some(top);
    let zk = [
        "stage",
        "reduce_bucket_size",
        "allgather_bucket_size",
        "overlap_comm",
        "contiguous_gradients",
        "reduce_scatter",
        "allgather_partitions",
        "offload_optimizer",
        "offload_param",
        "round_robin_gradients",
    ];
    let zm = r.object(top.get("zero_optimization"), "zero_optimization", &zk)?;
    let mut zero = ZeroSection::default();
    if let Some(stage) = r.count(zm, "zero_optimization", "stage", false)? {
        let stage = r.fixed(Some(stage), "zero_optimization.stage")?.unwrap_or(0);
        zero.stage = match stage {
            0..=2 => stage as u8,
            3 => return Err(r.err("zero_optimization.stage", "ZeRO stage 3 is not supported (use stage 1 or 2)".into())),
            s => return Err(r.err("zero_optimization.stage", format!("expected 0, 1 or 2, found {s}"))),
        };
    }
    for (key, slot) in [("reduce_bucket_size", &mut zero.reduce_bucket_size), ("allgather_bucket_size", &mut zero.allgather_bucket_size)] {
        match r.count(zm, "zero_optimization", key, true)? {
            Some(Setting::Value(0)) => return Err(r.err(&join("zero_optimization", key), "expected at least 1 element, found 0".into())),
            Some(Setting::Value(v)) => *slot = v as usize,
            Some(Setting::Auto) | None => {}
        }
    }
    zero.overlap_comm = r.bool(zm, "zero_optimization", "overlap_comm", false)?;
    zero.contiguous_gradients = r.bool(zm, "zero_optimization", "contiguous_gradients", true)?;
    zero.reduce_scatter = r.bool(zm, "zero_optimization", "reduce_scatter", true)?;
    zero.allgather_partitions = r.bool(zm, "zero_optimization", "allgather_partitions", true)?;
    for off in ["offload_optimizer", "offload_param"] {
        let key = join("zero_optimization", off);
        let om = r.object(zm.and_then(|m| m.get(off)), &key, &["device", "pin_memory", "nvme_path", "buffer_count", "fast_init", "ratio"])?;
        let device = r.string(om, &key, "device")?.unwrap_or_else(|| "none".into());
        if device != "none" {
            return Err(r.err(&format!("{key}.device"), format!("offloading is not supported, expected \"none\", found {device:?}")));
        }
    }
    let fk = ["enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis", "min_loss_scale"];
    let fm = r.object(top.get("fp16"), "fp16", &fk)?;
    let d = Fp16Config::default();
    let f16n = |r: &Reader, key: &str, def: f64| -> Result<f64> { Ok(r.fixed(r.num(fm, "fp16", key, false)?, &join("fp16", key))?.unwrap_or(def)) };
    let f16c = |r: &Reader, key: &str, def: u64| -> Result<u64> { Ok(r.fixed(r.count(fm, "fp16", key, false)?, &join("fp16", key))?.unwrap_or(def)) };
    let fp16 = Fp16Config {
        enabled: r.bool(fm, "fp16", "enabled", false)?,
        auto_cast: r.bool(fm, "fp16", "auto_cast", false)?,
        loss_scale: f16n(&r, "loss_scale", d.loss_scale)?,
        initial_scale_power: u32::try_from(f16c(&r, "initial_scale_power", d.initial_scale_power as u64)?)
            .map_err(|_| r.err("fp16.initial_scale_power", "expected at most 127".into()))?,
        loss_scale_window: f16c(&r, "loss_scale_window", d.loss_scale_window)?,
        hysteresis: f16c(&r, "hysteresis", d.hysteresis)?,
        consecutive_hysteresis: r.bool(fm, "fp16", "consecutive_hysteresis", false)?,
        min_loss_scale: f16n(&r, "min_loss_scale", d.min_loss_scale)?,
    };
    if fp16.loss_scale < 0.0 || fp16.initial_scale_power > 127 || fp16.loss_scale_window == 0 {
        return Err(r.err(
            "fp16",
            format!(
                "expected loss_scale >= 0, initial_scale_power <= 127 and loss_scale_window >= 1, found {}, {} and {}",
                fp16.loss_scale, fp16.initial_scale_power, fp16.loss_scale_window
            ),
        ));
    }
    let mut bf16 = false;
    for key in ["bf16", "bfloat16"] {
        let bm = r.object(top.get(key), key, &["enabled", "immediate_grad_update", "check_grad_overflow"])?;
        bf16 |= r.bool(bm, key, "enabled", false)?;
    }
    let om = r.object(top.get("optimizer"), "optimizer", &["type", "params"])?;
    let optimizer = match om {
        None => None,
        Some(m) => {
            let kind = r.string(Some(m), "optimizer", "type")?.ok_or_else(|| r.err("optimizer.type", "missing (expected Adam or AdamW)".into()))?;
            if !matches!(kind.to_ascii_lowercase().as_str(), "adam" | "adamw") {
                return Err(r.err("optimizer.type", format!("expected Adam or AdamW, found {kind:?}")));
            }
            let pm = r.object(m.get("params"), "optimizer.params", &["lr", "betas", "eps", "weight_decay", "adam_w_mode", "torch_adam"])?;
            let betas = match pm.and_then(|p| p.get("betas")) {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) if s == "auto" => Some(Setting::Auto),
                Some(Value::Array(a)) if a.len() == 2 && a.iter().all(Value::is_number) => {
                    Some(Setting::Value((a[0].as_f64().unwrap_or(0.9), a[1].as_f64().unwrap_or(0.999))))
                }
                Some(other) => return Err(r.err("optimizer.params.betas", format!("expected a list of two numbers or \"auto\", found {}", kind_of(other)))),
            };
            Some(OptimizerSection {
                kind,
                lr: r.num(pm, "optimizer.params", "lr", true)?,
                betas,
                eps: r.num(pm, "optimizer.params", "eps", true)?,
                weight_decay: r.num(pm, "optimizer.params", "weight_decay", true)?,
                adam_w_mode: match pm.and_then(|p| p.get("adam_w_mode")) {
                    None => None,
                    Some(_) => Some(r.bool(pm, "optimizer.params", "adam_w_mode", true)?),
                },
            })
        }
    };
    let sm = r.object(top.get("scheduler"), "scheduler", &["type", "params"])?;
    let scheduler = match sm {
        None => None,
        Some(m) => {
            let kind = r.string(Some(m), "scheduler", "type")?.ok_or_else(|| r.err("scheduler.type", "missing (expected WarmupLR)".into()))?;
            if kind != "WarmupLR" {
                return Err(r.err("scheduler.type", format!("expected WarmupLR, found {kind:?}")));
            }
            let pm =
                r.object(m.get("params"), "scheduler.params", &["warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"])?;
            let warmup_type = r.string(pm, "scheduler.params", "warmup_type")?;
            if let Some(w) = &warmup_type {
                if w != "log" && w != "linear" {
                    return Err(r.err("scheduler.params.warmup_type", format!("expected log or linear, found {w:?}")));
                }
            }
            Some(SchedulerSection {
                kind,
                warmup_min_lr: r.num(pm, "scheduler.params", "warmup_min_lr", true)?,
                warmup_max_lr: r.num(pm, "scheduler.params", "warmup_max_lr", true)?,
                warmup_num_steps: r.num(pm, "scheduler.params", "warmup_num_steps", true)?,
                warmup_type,
            })
        }
    };
    let cfg = DeepSpeedConfig {
        path: path.to_string(),
        train_micro_batch_size_per_gpu: r.count(t, "", "train_micro_batch_size_per_gpu", true)?,
        gradient_accumulation_steps: r.count(t, "", "gradient_accumulation_steps", true)?,
        gradient_clipping: r.num(t, "", "gradient_clipping", true)?,
        steps_per_print: r.fixed(r.count(t, "", "steps_per_print", false)?, "steps_per_print")?,
        zero,
        fp16,
        bf16,
        optimizer,
        scheduler,
    };
    Ok((cfg, r.warnings))
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
