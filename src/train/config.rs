//! Reading a WeNet train.yaml for training: overrides, the training keys
//! (grad_clip, accum_grad, max_epoch, optimizer, scheduler), the sanity
//! checks and the resolved copy saved into `model_dir`.

use crate::data::config::DataConfig;
use crate::data::tokenizer::Tokenizer;
use crate::error::{Error, Result};
use crate::models::config::{apply_override, load_yaml};
use serde_yaml_ng::Value;
use std::path::Path;

/// Everything a run reads from its config, with the YAML it came from.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// The whole config after overrides and the trainer's additions.
    pub root: Value,
    /// The data sections.
    pub data: DataConfig,
    /// Global gradient-norm bound.
    pub grad_clip: f64,
    /// Batches per optimizer step.
    pub accum_grad: usize,
    /// Epochs to train.
    pub max_epoch: u64,
    /// Batches between log lines.
    pub log_interval: usize,
    /// Optimizer steps between `step_N` checkpoints (none when absent).
    pub save_interval: Option<u64>,
    /// `tf32: true`: allow TF32 tensor cores for f32 products on the GPU (as `--tf32`).
    pub tf32: bool,
    /// `cublaslt_workspace_mib`: cuBLASLt's workspace per GPU (default 32).
    pub cublaslt_workspace_mib: Option<u64>,
    /// `fusion`: which fused kernels run (`all`, `none` or family words, see
    /// [`crate::ops::fusion`]); `ASRFORGE_FUSION` overrides it.
    pub fusion: Option<String>,
}

fn num(root: &Value, key: &str, default: f64) -> Result<f64> {
    match root.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.as_f64().ok_or_else(|| Error::config(key, format!("expected a number, found {}", crate::models::config::describe(v)))),
    }
}

fn flag(root: &Value, key: &str) -> Result<bool> {
    match root.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(v) => v.as_bool().ok_or_else(|| Error::config(key, format!("expected true or false, found {}", crate::models::config::describe(v)))),
    }
}

fn count(root: &Value, key: &str, default: u64) -> Result<u64> {
    match root.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.as_u64().ok_or_else(|| Error::config(key, format!("expected a non-negative integer, found {}", crate::models::config::describe(v)))),
    }
}

/// Reads `path` and applies each `"a.b.c value"` override (missing key or type mismatch is an error naming it).
pub fn read_config(path: &Path, overrides: &[String]) -> Result<Value> {
    let mut root = load_yaml(path)?;
    if !root.is_mapping() {
        return Err(Error::ConfigFile { path: path.display().to_string(), msg: "expected a YAML mapping at the top level".into() });
    }
    for o in overrides {
        apply_override(&mut root, o)?;
    }
    Ok(root)
}

/// Reads the training keys of a (resolved) config.
pub fn parse_train_config(root: &Value) -> Result<TrainConfig> {
    let data: DataConfig = serde_yaml_ng::from_value(root.clone())
        .map_err(|e| Error::ConfigFile { path: "train.yaml".into(), msg: format!("dataset_conf / tokenizer_conf: {e}") })?;
    data.dataset_conf.validate("train.yaml")?;
    let accum_grad = count(root, "accum_grad", 1)? as usize;
    if accum_grad == 0 {
        return Err(Error::config("accum_grad", "expected >= 1, found 0"));
    }
    let grad_clip = num(root, "grad_clip", 50.0)?;
    if grad_clip.is_nan() || grad_clip <= 0.0 {
        return Err(Error::config("grad_clip", format!("expected > 0, found {grad_clip}")));
    }
    let save_interval = match count(root, "save_interval", 0)? {
        0 => None,
        n => Some(n),
    };
    Ok(TrainConfig {
        root: root.clone(),
        data,
        grad_clip,
        accum_grad,
        max_epoch: count(root, "max_epoch", 100)?,
        log_interval: (count(root, "log_interval", 100)? as usize).max(1),
        save_interval,
        tf32: flag(root, "tf32")?,
        cublaslt_workspace_mib: match root.get("cublaslt_workspace_mib") {
            None | Some(Value::Null) => None,
            Some(_) => Some(count(root, "cublaslt_workspace_mib", 0)?),
        },
        fusion: match root.get("fusion") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(v) => {
                return Err(Error::config(
                    "fusion",
                    format!("expected all, none or a comma-separated list of families, found {}", crate::models::config::describe(v)),
                ))
            }
        },
    })
}

fn set(root: &mut Value, key: &str, v: Value) {
    if let Some(m) = root.as_mapping_mut() {
        m.insert(Value::String(key.into()), v);
    }
}

/// WeNet's `check_modify_and_save_config`: fills `input_dim` from the fbank
/// size and `output_dim` from the symbol table (a config value that
/// disagrees is an error), records the data paths, removes the temporary
/// files of interrupted saves, refuses a `model_dir` holding another run's
/// checkpoints (see [`super::model_dir`]), and writes the resolved
/// config to `model_dir/train.yaml` (rank 0 only).
pub fn check_modify_and_save_config(root: Value, args: &super::TrainArgs, dist: &super::DistInfo) -> Result<TrainConfig> {
    let mut root = root;
    let pre = parse_train_config(&root)?;
    super::deepspeed::check_deepspeed_config(args, &pre, dist)?;
    let mel = pre.data.dataset_conf.fbank_conf.num_mel_bins;
    match root.get("input_dim").and_then(Value::as_u64) {
        Some(d) if d as usize != mel => return Err(Error::config("input_dim", format!("expected {mel} (dataset_conf.fbank_conf.num_mel_bins), found {d}"))),
        _ => set(&mut root, "input_dim", Value::from(mel as u64)),
    }
    let tok = Tokenizer::from_conf(pre.data.tokenizer.as_deref(), &pre.data.tokenizer_conf, args.symbol_table.as_deref())?;
    let vocab = tok.table().len();
    match root.get("output_dim").and_then(Value::as_u64) {
        Some(d) if d as usize != vocab => {
            return Err(Error::config("output_dim", format!("expected {vocab} (the size of the symbol table {}), found {d}", tok.table().path())))
        }
        _ => set(&mut root, "output_dim", Value::from(vocab as u64)),
    }
    if let Some(st) = &args.symbol_table {
        let mut tc = root.get("tokenizer_conf").cloned().unwrap_or(Value::Mapping(Default::default()));
        set(&mut tc, "symbol_table_path", Value::String(st.display().to_string()));
        set(&mut root, "tokenizer_conf", tc);
    }
    set(&mut root, "train_data", Value::String(args.train_data.display().to_string()));
    set(&mut root, "cv_data", Value::String(args.cv_data.display().to_string()));
    set(&mut root, "model_dir", Value::String(args.model_dir.display().to_string()));
    if dist.is_main() {
        for p in super::model_dir::remove_stale_temporaries(&args.model_dir)? {
            eprintln!("removed {}: the temporary file of a save that was interrupted", p.display());
        }
    }
    super::model_dir::claim_model_dir(&args.model_dir, args.checkpoint.as_deref(), args.overwrite, dist.is_main())?;
    std::fs::create_dir_all(&args.model_dir).map_err(|source| Error::Io { path: args.model_dir.display().to_string(), source })?;
    if dist.is_main() {
        let yaml = serde_yaml_ng::to_string(&root).map_err(|e| Error::Msg(format!("cannot serialize the config: {e}")))?;
        crate::models::checkpoint::write_atomic(&args.model_dir.join("train.yaml"), yaml.as_bytes())?;
    }
    parse_train_config(&root)
}
