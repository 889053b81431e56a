//! Training checkpoints: `model_dir/{tag}.safetensors` + `{tag}.yaml`
//! (epoch, step, lr, cv_loss and the config) from the models' checkpoint
//! writer, and `{tag}.state.safetensors` with everything an exact resume
//! needs: Adam's moments as tensors, and the scaler, scheduler step, RNG
//! state and data position as metadata. An engine with sharded optimizer
//! state (ZeRO) has every rank write its shard to
//! `{tag}.state.rank{R}.safetensors` (tensors + `adam_step` + its metadata
//! under `optim.`), and the main state file then records only
//! `optimizer_shards = N` in place of the tensors. Every file is written
//! atomically.

use crate::engine::OptimizerState;
use crate::error::{Error, Result};
use crate::models::checkpoint::{save_checkpoint, write_atomic};
use crate::models::AsrModel;
use crate::tensor::rng::Rng;
use crate::tensor::{Device, Tensor};
use safetensors::{Dtype, SafeTensors};
use serde_yaml_ng::{Mapping, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Where training stands: the next batch to train is batch `batches` of epoch `epoch`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Position {
    /// The epoch in progress (or the next one).
    pub epoch: u64,
    /// Batches of that epoch already consumed.
    pub batches: usize,
    /// Optimizer steps taken (including skipped ones).
    pub step: u64,
}

/// The resumable state beside a checkpoint.
#[derive(Clone, Debug)]
pub struct TrainState {
    /// The data position to continue from.
    pub position: Position,
    /// The engine's optimizer state: one entry when it is stored inline (a
    /// replicated engine), or one per saving rank in rank order (sharded).
    pub optimizer: Vec<OptimizerState>,
    /// `Some(N)` when the optimizer state lives in N per-rank shard files
    /// beside the state file rather than in it.
    pub optimizer_shards: Option<usize>,
    /// The scheduler's step count.
    pub scheduler_steps: u64,
    /// The loss scaler's scale and growth tracker.
    pub scaler: Option<(f64, u64)>,
    /// The default generator (dropout) at that point, on the saving rank 0.
    pub rng: Rng,
    /// Every rank's default generator, in rank order (several processes;
    /// empty for one): each rank resumes its own dropout stream.
    pub rank_rngs: Vec<Rng>,
}

impl TrainState {
    /// The generator rank `rank` resumes with: its own when saved, else rank 0's.
    pub fn rng_for(&self, rank: usize) -> Rng {
        self.rank_rngs.get(rank).copied().unwrap_or(self.rng)
    }
}

/// The checkpoint path of `tag` in `dir`.
pub fn checkpoint_path(dir: &Path, tag: &str) -> PathBuf {
    dir.join(format!("{tag}.safetensors"))
}

/// The state file beside a checkpoint (`x.safetensors` → `x.state.safetensors`).
pub fn state_path(ckpt: &Path) -> PathBuf {
    ckpt.with_extension("state.safetensors")
}

/// The shard file rank `rank` writes beside a checkpoint (`x.safetensors` → `x.state.rank{R}.safetensors`).
pub fn shard_path(ckpt: &Path, rank: usize) -> PathBuf {
    ckpt.with_extension(format!("state.rank{rank}.safetensors"))
}

/// Saves the model, its infos YAML (the given mapping plus `config`) and, when given, the resume state.
pub fn save_model(model: &AsrModel, dir: &Path, tag: &str, infos: Mapping, config: &Value, state: Option<&TrainState>) -> Result<PathBuf> {
    let path = checkpoint_path(dir, tag);
    if let Some(s) = state {
        save_state(&state_path(&path), s)?;
    }
    let mut infos = infos;
    infos.insert("tag".into(), Value::String(tag.into()));
    infos.insert("config".into(), config.clone());
    save_checkpoint(model, &path, &Value::Mapping(infos))?;
    Ok(path)
}

fn meta(s: &TrainState) -> HashMap<String, String> {
    let p = s.position;
    let mut m = HashMap::new();
    for (k, v) in [
        ("epoch", p.epoch.to_string()),
        ("batches", p.batches.to_string()),
        ("step", p.step.to_string()),
        ("scheduler_steps", s.scheduler_steps.to_string()),
        ("rng_seed", s.rng.seed.to_string()),
        ("rng_offset", s.rng.offset.to_string()),
    ] {
        m.insert(k.to_string(), v);
    }
    if !s.rank_rngs.is_empty() {
        m.insert("rank_rngs".into(), s.rank_rngs.len().to_string());
    }
    for (r, g) in s.rank_rngs.iter().enumerate() {
        m.insert(format!("rng_seed.rank{r}"), g.seed.to_string());
        m.insert(format!("rng_offset.rank{r}"), g.offset.to_string());
    }
    match s.optimizer_shards {
        Some(n) => {
            m.insert("optimizer_shards".into(), n.to_string());
        }
        None => {
            if let Some(o) = s.optimizer.first() {
                m.extend(optimizer_meta(o));
            }
        }
    }
    if let Some((scale, growth)) = s.scaler {
        // The scale is stored by its bits so it comes back exactly.
        m.insert("scaler_scale_bits".into(), scale.to_bits().to_string());
        m.insert("scaler_growth_tracker".into(), growth.to_string());
    }
    m
}

fn optimizer_meta(o: &OptimizerState) -> HashMap<String, String> {
    let mut m: HashMap<String, String> = o.meta.iter().map(|(k, v)| (format!("optim.{k}"), v.clone())).collect();
    m.insert("adam_step".into(), o.step.to_string());
    m
}

/// Writes the resume state to `path` atomically.
pub fn save_state(path: &Path, s: &TrainState) -> Result<()> {
    let inline: &[(String, Tensor)] = match (s.optimizer_shards, s.optimizer.as_slice()) {
        (None, [o]) => &o.tensors,
        (None, other) => return Err(Error::checkpoint(path.display().to_string(), format!("an inline optimizer state is one state, found {}", other.len()))),
        (Some(_), _) => &[],
    };
    write_tensors(path, inline, meta(s))
}

/// Writes rank `rank`'s optimizer shard beside checkpoint `ckpt` atomically.
pub fn save_optimizer_shard(ckpt: &Path, rank: usize, o: &OptimizerState) -> Result<()> {
    write_tensors(&shard_path(ckpt, rank), &o.tensors, optimizer_meta(o))
}

fn write_tensors(path: &Path, tensors: &[(String, Tensor)], meta: HashMap<String, String>) -> Result<()> {
    let p = path.display().to_string();
    let blobs: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, t)| Ok((n.clone(), t.dims().to_vec(), t.to_vec::<f32>()?.iter().flat_map(|x| x.to_le_bytes()).collect())))
        .collect::<Result<_>>()?;
    let views = blobs
        .iter()
        .map(|(n, shape, b)| safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), b).map(|v| (n.clone(), v)))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::checkpoint(&p, format!("cannot describe a tensor: {e}")))?;
    let bytes = safetensors::serialize(views, Some(meta)).map_err(|e| Error::checkpoint(&p, format!("cannot serialize: {e}")))?;
    write_atomic(path, &bytes)
}

fn get<T: std::str::FromStr>(m: &HashMap<String, String>, key: &str, p: &str) -> Result<T> {
    let v = m.get(key).ok_or_else(|| Error::checkpoint(p, format!("state metadata: missing key {key}")))?;
    v.parse().map_err(|_| Error::checkpoint(p, format!("state metadata {key}: expected an integer, found {v:?}")))
}

/// Reads a state file written by [`save_state`], with its optimizer shards when it has them.
pub fn load_state(path: &Path) -> Result<TrainState> {
    let p = path.display().to_string();
    let (m, tensors) = read_tensors(path)?;
    let scaler = match m.get("scaler_scale_bits") {
        None => None,
        Some(_) => Some((f64::from_bits(get(&m, "scaler_scale_bits", &p)?), get(&m, "scaler_growth_tracker", &p)?)),
    };
    let (optimizer, optimizer_shards) = match m.get("optimizer_shards") {
        None => (vec![optimizer_from(&m, tensors, &p)?], None),
        Some(_) => {
            let n: usize = get(&m, "optimizer_shards", &p)?;
            let ckpt = path.with_file_name(path.file_name().map(|f| f.to_string_lossy().replace(".state.safetensors", ".safetensors")).unwrap_or_default());
            let mut shards = Vec::with_capacity(n);
            for r in 0..n {
                let sp = shard_path(&ckpt, r);
                let (sm, st) = read_tensors(&sp)?;
                shards.push(optimizer_from(&sm, st, &sp.display().to_string())?);
            }
            (shards, Some(n))
        }
    };
    Ok(TrainState {
        position: Position { epoch: get(&m, "epoch", &p)?, batches: get(&m, "batches", &p)?, step: get(&m, "step", &p)? },
        optimizer,
        optimizer_shards,
        scheduler_steps: get(&m, "scheduler_steps", &p)?,
        scaler,
        rng: Rng { seed: get(&m, "rng_seed", &p)?, offset: get(&m, "rng_offset", &p)? },
        rank_rngs: match m.get("rank_rngs") {
            None => Vec::new(),
            Some(_) => {
                let n: usize = get(&m, "rank_rngs", &p)?;
                (0..n)
                    .map(|r| Ok(Rng { seed: get(&m, &format!("rng_seed.rank{r}"), &p)?, offset: get(&m, &format!("rng_offset.rank{r}"), &p)? }))
                    .collect::<Result<_>>()?
            }
        },
    })
}

fn optimizer_from(m: &HashMap<String, String>, tensors: Vec<(String, Tensor)>, p: &str) -> Result<OptimizerState> {
    let meta = m.iter().filter_map(|(k, v)| k.strip_prefix("optim.").map(|k| (k.to_string(), v.clone()))).collect();
    Ok(OptimizerState { step: get(m, "adam_step", p)?, tensors, meta })
}

type Tensors = Vec<(String, Tensor)>;

fn read_tensors(path: &Path) -> Result<(HashMap<String, String>, Tensors)> {
    let p = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| Error::Io { path: p.clone(), source })?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| Error::checkpoint(&p, format!("not a valid safetensors file (corrupt header?): {e}")))?;
    let (_, md) = SafeTensors::read_metadata(&bytes).map_err(|e| Error::checkpoint(&p, format!("unreadable metadata: {e}")))?;
    let m = md.metadata().clone().ok_or_else(|| Error::checkpoint(&p, "no state metadata"))?;
    let mut tensors = Vec::new();
    for (name, view) in st.tensors() {
        if view.dtype() != Dtype::F32 {
            return Err(Error::checkpoint(&p, format!("key {name}: expected dtype F32, found {:?}", view.dtype())));
        }
        let v: Vec<f32> = view.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        tensors.push((name, Tensor::from_vec(v, view.shape().to_vec(), &Device::Cpu)?));
    }
    Ok((m, tensors))
}
