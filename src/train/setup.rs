//! The set-up steps of a run: loaders, model, printed summary, TensorBoard
//! writer, optimizer and scheduler, each restoring its part of a resume.

use super::checkpoint::{load_state, state_path, Position, TrainState};
use super::{DistInfo, TrainArgs, TrainConfig};
use crate::data::list::{DataList, ListFormat};
use crate::data::loader::{DataLoader, LoaderConf};
use crate::data::process::Processor;
use crate::data::tokenizer::Tokenizer;
use crate::error::{Error, Result};
use crate::models::checkpoint::{load_checkpoint, load_prefixes, read_infos};
use crate::models::{AsrModel, ModelConfig};
use crate::nn::Module;
use crate::optim::{AdamConfig, GradScaler, NoamHoldAnnealing, ScalerConfig, Scheduler, WarmupLR};
use crate::tensor::{DType, Rng};
use crate::train::tensorboard::SummaryWriter;
use serde_yaml_ng::Value;
use std::sync::Arc;

/// The optimizer's settings (the engine owns the Adam built from them) and
/// the learning-rate schedule.
pub struct Optim {
    /// Adam or AdamW hyper-parameters, for the engine.
    pub adam: AdamConfig,
    /// The schedule, stepped once per optimizer step.
    pub scheduler: Box<dyn Scheduler>,
}

/// WeNet's `init_dataset_and_dataloader`: the train loader and the cv loader
/// (no augmentation, no shuffling). Both lists are partitioned across ranks
/// as WeNet does, so the cv loss reduced over ranks is the loss over the
/// whole cv list.
pub fn init_dataset_and_dataloader(args: &TrainArgs, cfg: &TrainConfig, dist: &DistInfo) -> Result<(DataLoader, DataLoader)> {
    let format = ListFormat::parse(&args.data_type)?;
    let tok = Arc::new(Tokenizer::from_conf(cfg.data.tokenizer.as_deref(), &cfg.data.tokenizer_conf, args.symbol_table.as_deref())?);
    let base = LoaderConf {
        num_workers: args.num_workers,
        prefetch: args.prefetch,
        seed: args.seed,
        rank: dist.rank,
        world_size: dist.world_size,
        partition: true,
        log: dist.is_main(),
    };
    let train_conf = &cfg.data.dataset_conf;
    // What the model cannot take (more encoder frames than its positional
    // table, a CTC target longer than its subsampled input) is skipped and
    // counted by the loader, before batching.
    let limits = crate::models::limits::data_limits(&ModelConfig::from_yaml(&cfg.root)?.0);
    let train_proc = Processor::new(train_conf, Some(tok.clone()))?.with_limits(limits.clone());
    let cv_proc = Processor::new(&train_conf.for_cv(), Some(tok))?.with_limits(limits);
    let train = DataLoader::new(DataList::read(&args.train_data, format)?, train_proc, base.clone())?;
    let cv = DataLoader::new(DataList::read(&args.cv_data, format)?, cv_proc, base)?;
    Ok((train, cv))
}

/// What `init_model` found in `--checkpoint`.
#[derive(Clone, Debug, Default)]
pub struct Resume {
    /// The resume state, when the checkpoint has one beside it.
    pub state: Option<TrainState>,
    /// The checkpoint's infos YAML.
    pub infos: Value,
}

impl Resume {
    /// Where training continues: the state's position, else (a checkpoint
    /// without its state) the epoch after an `epoch_N` or the start of the
    /// epoch a `step_N` was taken in.
    pub fn position(&self) -> Position {
        if let Some(s) = &self.state {
            return s.position;
        }
        let epoch = self.infos.get("epoch").and_then(Value::as_u64);
        let step = self.infos.get("step").and_then(Value::as_u64).unwrap_or(0);
        let finished = self.infos.get("tag").and_then(Value::as_str).is_some_and(|t| t.starts_with("epoch_"));
        match epoch {
            Some(e) => Position { epoch: if finished { e + 1 } else { e }, batches: 0, step },
            None => Position::default(),
        }
    }
}

/// WeNet's `init_model`: builds the model from the config, then loads
/// `--checkpoint` (all keys, with its resume state when present) or the
/// `--enc_init_mods` prefixes of `--enc_init`.
pub fn init_model(args: &TrainArgs, cfg: &TrainConfig) -> Result<(AsrModel, Resume)> {
    let (mcfg, warnings) = ModelConfig::from_yaml(&cfg.root)?;
    for w in warnings {
        eprintln!("warning: {w}");
    }
    let mut model = AsrModel::new(&mcfg, DType::F32, &mut Rng::new(args.seed))?;
    let mut resume = Resume::default();
    if let Some(ck) = &args.checkpoint {
        load_checkpoint(&model, ck, true)?;
        resume.infos = read_infos(ck)?;
        let sp = state_path(ck);
        if sp.exists() {
            resume.state = Some(load_state(&sp)?);
        }
        eprintln!("loaded checkpoint {}{}", ck.display(), if resume.state.is_some() { " with its training state" } else { "" });
    } else if let Some(init) = &args.enc_init {
        let r = load_prefixes(&model, init, &args.enc_init_mods)?;
        eprintln!("initialised {} tensors from {} ({:?})", r.loaded.len(), init.display(), args.enc_init_mods);
    }
    model.train(true);
    Ok((model, resume))
}

/// WeNet's print of the model: its tree and parameter count.
pub fn print_model(model: &AsrModel, dist: &DistInfo) {
    if dist.is_main() {
        eprint!("{}", crate::models::summary::model_summary(model));
    }
}

/// WeNet's `init_summary_writer`: a TensorBoard writer on rank 0, writing to
/// `tensorboard_dir/<basename of model_dir>` as WeNet does, so runs do not mix.
pub fn init_summary_writer(args: &TrainArgs, dist: &DistInfo) -> Result<Option<SummaryWriter>> {
    if !dist.is_main() {
        return Ok(None);
    }
    SummaryWriter::new(&summary_dir(&args.tensorboard_dir, &args.model_dir)).map(Some)
}

/// `tensorboard_dir/<basename of model_dir>` (the model dir itself when it has no basename, e.g. `.`).
pub fn summary_dir(tensorboard_dir: &std::path::Path, model_dir: &std::path::Path) -> std::path::PathBuf {
    let run = model_dir.canonicalize().ok().and_then(|p| p.file_name().map(|n| n.to_owned())).or_else(|| model_dir.file_name().map(|n| n.to_owned()));
    match run {
        Some(name) => tensorboard_dir.join(name),
        None => tensorboard_dir.to_path_buf(),
    }
}

fn conf_f64(conf: Option<&Value>, section: &str, key: &str, default: Option<f64>) -> Result<f64> {
    match conf.and_then(|c| c.get(key)) {
        Some(v) => {
            v.as_f64().ok_or_else(|| Error::config(format!("{section}.{key}"), format!("expected a number, found {}", crate::models::config::describe(v))))
        }
        None => default.ok_or_else(|| Error::config(format!("{section}.{key}"), "missing")),
    }
}

fn conf_steps(conf: Option<&Value>, section: &str, key: &str) -> Result<Option<u64>> {
    match conf.and_then(|c| c.get(key)) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| Error::config(format!("{section}.{key}"), format!("expected a step count, found {}", crate::models::config::describe(v)))),
    }
}

/// A learning rate must be finite and non-negative: a negative one trains by
/// gradient ascent, a NaN or infinite one destroys the model on the first step.
pub fn check_lr(lr: f64, key: &str) -> Result<()> {
    if !lr.is_finite() || lr < 0.0 {
        return Err(Error::config(key, format!("expected a finite learning rate >= 0, found {lr}")));
    }
    Ok(())
}

/// WeNet's `init_optimizer_and_scheduler`: Adam/AdamW settings from
/// `optim_conf` (the engine builds the optimizer, see `wrap_model`) and
/// WarmupLR or NoamHoldAnnealing from `scheduler_conf`, the schedule's step
/// restored from a resume state.
pub fn init_optimizer_and_scheduler(cfg: &TrainConfig, resume: &Resume) -> Result<Optim> {
    let root = &cfg.root;
    let oc = root.get("optim_conf");
    let decoupled = match root.get("optim").and_then(Value::as_str).unwrap_or("adam") {
        "adam" => false,
        "adamw" => true,
        other => return Err(Error::config("optim", format!("expected adam or adamw, found {other:?}"))),
    };
    let lr = conf_f64(oc, "optim_conf", "lr", None)?;
    check_lr(lr, "optim_conf.lr")?;
    let weight_decay = conf_f64(oc, "optim_conf", "weight_decay", Some(if decoupled { 0.01 } else { 0.0 }))?;
    let adam = AdamConfig { lr, weight_decay, decoupled, ..Default::default() };
    let sc = root.get("scheduler_conf");
    let mut scheduler: Box<dyn Scheduler> = match root.get("scheduler").and_then(Value::as_str).unwrap_or("warmuplr") {
        "warmuplr" => Box::new(WarmupLR {
            base_lr: lr,
            warmup_steps: conf_f64(sc, "scheduler_conf", "warmup_steps", Some(25000.0))?,
            min_lr: conf_f64(sc, "scheduler_conf", "min_lr", Some(0.0))?,
            steps: 0,
        }),
        "NoamHoldAnnealing" => {
            let max_steps = conf_steps(sc, "scheduler_conf", "max_steps")?
                .ok_or_else(|| Error::config("scheduler_conf.max_steps", "missing (NoamHoldAnnealing needs it)"))?;
            Box::new(NoamHoldAnnealing::new(
                lr,
                max_steps,
                conf_steps(sc, "scheduler_conf", "warmup_steps")?,
                conf_f64(sc, "scheduler_conf", "warmup_ratio", Some(0.0))?,
                conf_steps(sc, "scheduler_conf", "hold_steps")?,
                conf_f64(sc, "scheduler_conf", "hold_ratio", Some(0.0))?,
                conf_f64(sc, "scheduler_conf", "decay_rate", Some(1.0))?,
                conf_f64(sc, "scheduler_conf", "min_lr", Some(0.0))?,
            ))
        }
        other => return Err(Error::config("scheduler", format!("expected warmuplr or NoamHoldAnnealing, found {other:?}"))),
    };
    if let Some(s) = &resume.state {
        scheduler.set_steps(s.scheduler_steps);
    } else if let Some(step) = resume.infos.get("step").and_then(Value::as_u64) {
        // A checkpoint without its state: continue the schedule where it was.
        scheduler.set_steps(step);
    }
    Ok(Optim { adam, scheduler })
}

/// The loss scaler of `--use_amp` (none without it), restored from a resume state.
pub fn init_scaler(args: &TrainArgs, resume: &Resume) -> Option<GradScaler> {
    if super::device::amp_dtype(args).ok().flatten() != Some(DType::F16) {
        return None;
    }
    let mut s = GradScaler::new(ScalerConfig::default());
    if let Some((scale, growth)) = resume.state.as_ref().and_then(|s| s.scaler) {
        s.scale = scale;
        s.growth_tracker = growth;
    }
    Some(s)
}
