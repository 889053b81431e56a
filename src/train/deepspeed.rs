//! The `deepspeed` train engine's set-up: the `--deepspeed_config` JSON read
//! once per step that needs it, WeNet's checks against train.yaml, the ZeRO
//! engine, the fp16 loss scaler the JSON asks for (`--use_amp` is for
//! torch_ddp) and `--deepspeed.save_states`.

use super::{DistInfo, Distributed, Resume, TrainArgs, TrainConfig};
use crate::engine::deepspeed::{parse_deepspeed_config, DeepSpeedConfig, Precision, TrainYamlKeys};
use crate::engine::{Engine, ZeroEngine};
use crate::error::{Error, Result};
use crate::models::AsrModel;
use crate::nn::Module;
use crate::optim::{AdamConfig, GradScaler};
use crate::tensor::DType;

/// Whether the run uses the deepspeed engine.
pub fn is_deepspeed(args: &TrainArgs) -> bool {
    args.train_engine == "deepspeed"
}

/// Reads and parses `--deepspeed_config`, with its warnings.
pub fn read_deepspeed_config(args: &TrainArgs) -> Result<(DeepSpeedConfig, Vec<String>)> {
    let path = args
        .deepspeed_config
        .as_ref()
        .ok_or_else(|| Error::config("--deepspeed_config", "--train_engine deepspeed needs a DeepSpeed JSON config, found none"))?;
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: p.clone(), source })?;
    parse_deepspeed_config(&text, &p)
}

/// Whether checkpoints carry the optimizer state: `--deepspeed.save_states`
/// is `model+optimizer` (always, for torch_ddp).
pub fn saves_optimizer_state(args: &TrainArgs) -> Result<bool> {
    if !is_deepspeed(args) {
        return Ok(true);
    }
    match args.deepspeed_save_states.as_str() {
        "model_only" => Ok(false),
        "model+optimizer" => Ok(true),
        other => Err(Error::config("--deepspeed.save_states", format!("expected model_only or model+optimizer, found {other:?}"))),
    }
}

/// WeNet's deepspeed checks in `check_modify_and_save_config`: the JSON's
/// accumulation, clip and print interval equal train.yaml's; warnings
/// (unknown keys, ignored flags) printed on rank 0.
pub fn check_deepspeed_config(args: &TrainArgs, cfg: &TrainConfig, dist: &DistInfo) -> Result<()> {
    if !is_deepspeed(args) {
        return Ok(());
    }
    let (ds, warnings) = read_deepspeed_config(args)?;
    saves_optimizer_state(args)?;
    ds.check_against(
        &TrainYamlKeys { accum_grad: cfg.accum_grad, grad_clip: cfg.grad_clip, log_interval: cfg.log_interval },
        &args.config.display().to_string(),
    )?;
    if dist.is_main() {
        warnings.iter().for_each(|w| eprintln!("warning: {w}"));
        if args.use_amp {
            eprintln!("warning: --use_amp is ignored with --train_engine deepspeed; {}'s fp16/bf16 sections decide the precision", ds.path);
        }
        match ds.precision()? {
            Precision::Bf16 => eprintln!("warning: {}: bf16 is enabled but the CPU backend trains in f32", ds.path),
            Precision::Fp16 if args.device != "cuda" => {
                eprintln!("warning: {}: fp16 is enabled but the CPU backend trains in f32 (its loss scaler still runs)", ds.path)
            }
            _ => {}
        }
    }
    Ok(())
}

/// The type the ZeRO engine's gradient reduce-scatter travels in (`None`:
/// f32). `--fp16_grad_sync` asks for the half type of the JSON's precision
/// (bf16 when `bf16.enabled`, else f16, as for torch_ddp); without the flag
/// DeepSpeed's rule decides ([`DeepSpeedConfig::grad_comm_dtype`]:
/// `communication_data_type`, else the fp16/bf16 section). The flag and an
/// explicit `communication_data_type` of another type are an error.
pub fn zero_grad_sync_dtype(args: &TrainArgs, ds: &DeepSpeedConfig) -> Result<Option<DType>> {
    if !args.fp16_grad_sync {
        return ds.grad_comm_dtype();
    }
    let want = if ds.precision()? == Precision::Bf16 { DType::BF16 } else { DType::F16 };
    match ds.communication_data_type {
        Some(d) if d != want => Err(Error::config(
            "--fp16_grad_sync",
            format!(
                "asks for the gradient reduce-scatter in {} but {} sets communication_data_type to {}; drop one of them",
                want.as_str(),
                ds.path,
                d.as_str()
            ),
        )),
        _ => Ok(Some(want)),
    }
}

/// The ZeRO engine (stage 1 or 2) over the job's communicator; stage 0 is plain data parallelism, which is torch_ddp.
pub fn deepspeed_engine(model: &AsrModel, args: &TrainArgs, dist: &mut Distributed, adam: AdamConfig) -> Result<Box<dyn Engine>> {
    let (ds, _) = read_deepspeed_config(args)?;
    let opts = ds.zero_options();
    if opts.stage == 0 {
        return Err(Error::ConfigFile {
            path: ds.path.clone(),
            msg: "zero_optimization.stage 0 (no ZeRO) is plain data parallelism: use --train_engine torch_ddp, or stage 1 or 2".into(),
        });
    }
    let adam = ds.adam_config(adam);
    super::setup::check_lr(adam.lr, &format!("{}: optimizer.params.lr", ds.path))?;
    let half = zero_grad_sync_dtype(args, &ds)?;
    let engine = match dist.comm.take() {
        Some(comm) => ZeroEngine::new(model.named_parameters(), comm, opts, adam)?,
        None if dist.info.world_size == 1 => ZeroEngine::single(model.named_parameters(), opts, adam)?,
        None => {
            return Err(Error::dist(
                "wrap_model",
                dist.info.rank,
                format!("deepspeed over {} processes needs the communicator init_distributed opens (was it taken already?)", dist.info.world_size),
            ))
        }
    };
    let engine = engine.with_half_grad_sync(half)?;
    if let (Some(d), 0) = (half, dist.info.rank) {
        eprintln!("deepspeed: gradients are reduce-scattered in {}", d.as_str());
    }
    Ok(Box::new(engine))
}

/// The fp16 loss scaler of the JSON (none without fp16), restored from a resume state.
pub fn deepspeed_scaler(args: &TrainArgs, resume: &Resume) -> Result<Option<GradScaler>> {
    let (ds, _) = read_deepspeed_config(args)?;
    Ok(ds.scaler_config().map(|c| {
        let mut s = GradScaler::new(c);
        if let Some((scale, growth)) = resume.state.as_ref().and_then(|s| s.scaler) {
            s.scale = scale;
            s.growth_tracker = growth;
        }
        s
    }))
}
