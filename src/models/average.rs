//! `asrforge average`: the element-wise mean of several checkpoints, as
//! WeNet's `average_model.py`. With `--val_best` the `num` checkpoints with
//! the lowest validation loss in their infos YAML (`cv_loss`, or
//! `loss_dict.loss`) are taken, else the `num` latest by epoch (then step);
//! either way only epochs in `min_epoch..=max_epoch` count, and `init`,
//! `final` (a copy of the last epoch) and `avg*` are never candidates. A
//! candidate is an `x.safetensors` whose `x.yaml` gives its epoch (or
//! whose name is a number, `N` or `epoch_N`).
//!
//! Float tensors are averaged in f64 and stored in their own dtype. Integer
//! buffers (BatchNorm's `num_batches_tracked`) get the floor of the mean:
//! WeNet sums them, divides (giving a float) and loading that into the
//! integer buffer truncates it, which is the same number.

use std::path::{Path, PathBuf};

use clap::Args;
use safetensors::{Dtype, SafeTensors};
use serde_yaml_ng::Value;

use super::checkpoint::{read_infos, write_atomic};
use crate::error::{Error, Result};

/// Arguments of `average`.
#[derive(Args, Debug, Clone)]
pub struct AverageArgs {
    /// Where to write the averaged safetensors.
    #[arg(long = "dst_model", alias = "dst-model")]
    pub dst_model: PathBuf,
    /// The model directory holding the checkpoints and their YAMLs.
    #[arg(long = "src_path", alias = "src-path")]
    pub src_path: PathBuf,
    /// How many checkpoints to average.
    #[arg(long = "num", default_value_t = 5)]
    pub num: usize,
    /// Take the checkpoints with the lowest validation loss instead of the latest.
    #[arg(long = "val_best", alias = "val-best")]
    pub val_best: bool,
    /// Ignore checkpoints of earlier epochs.
    #[arg(long = "min_epoch", alias = "min-epoch", default_value_t = 0)]
    pub min_epoch: i64,
    /// Ignore checkpoints of later epochs.
    #[arg(long = "max_epoch", alias = "max-epoch", default_value_t = 65536)]
    pub max_epoch: i64,
}

/// A checkpoint that may be averaged.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// The safetensors file.
    pub path: PathBuf,
    /// Its epoch.
    pub epoch: i64,
    /// Its step (0 when the YAML has none).
    pub step: i64,
    /// Its validation loss, when the YAML has one.
    pub cv_loss: Option<f64>,
}

fn num(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// The number in a checkpoint name `N` or `epoch_N`.
fn epoch_from_name(stem: &str) -> Option<i64> {
    stem.strip_prefix("epoch_").unwrap_or(stem).parse().ok()
}

/// Every checkpoint of `dir` with a known epoch, except `init` and `exclude`.
pub fn list_candidates(dir: &Path, exclude: Option<&Path>) -> Result<Vec<Candidate>> {
    let io = |source| Error::Io { path: dir.display().to_string(), source };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("safetensors") {
            continue;
        }
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("").to_string();
        if stem == "init" || stem == "final" || stem.starts_with("avg") || exclude.is_some_and(|x| x.file_name() == path.file_name()) {
            continue;
        }
        let infos = read_infos(&path)?;
        let epoch = infos.get("epoch").and_then(num).map(|e| e as i64).or_else(|| epoch_from_name(&stem));
        let Some(epoch) = epoch else { continue };
        let step = infos.get("step").and_then(num).map_or(0, |s| s as i64);
        let cv_loss = infos.get("cv_loss").and_then(num).or_else(|| infos.get("loss_dict").and_then(|d| d.get("loss")).and_then(num));
        out.push(Candidate { path, epoch, step, cv_loss });
    }
    Ok(out)
}

/// Picks the `num` checkpoints to average from `candidates` (see the module docs).
pub fn select(mut candidates: Vec<Candidate>, num: usize, val_best: bool, min_epoch: i64, max_epoch: i64, dir: &str) -> Result<Vec<Candidate>> {
    candidates.retain(|c| c.epoch >= min_epoch && c.epoch <= max_epoch);
    if val_best {
        candidates.retain(|c| c.cv_loss.is_some_and(f64::is_finite));
        candidates.sort_by(|a, b| {
            a.cv_loss.unwrap_or(f64::INFINITY).total_cmp(&b.cv_loss.unwrap_or(f64::INFINITY)).then(a.epoch.cmp(&b.epoch)).then(a.step.cmp(&b.step))
        });
        candidates.truncate(num);
    } else {
        candidates.sort_by(|a, b| a.epoch.cmp(&b.epoch).then(a.step.cmp(&b.step)));
        let skip = candidates.len().saturating_sub(num);
        candidates.drain(..skip);
    }
    if candidates.len() != num || num == 0 {
        let what = if val_best { "with a cv_loss in their YAML" } else { "with a known epoch" };
        return Err(Error::Data {
            path: dir.to_string(),
            msg: format!("expected {num} checkpoints {what} in epochs {min_epoch}..={max_epoch}, found {}", candidates.len()),
        });
    }
    Ok(candidates)
}

/// One tensor being summed: dtype, shape and f64 (float) or i128 (integer) sums.
struct Acc {
    dtype: Dtype,
    shape: Vec<usize>,
    float: Vec<f64>,
    int: Vec<i128>,
}

fn is_int(d: Dtype) -> bool {
    matches!(d, Dtype::I64 | Dtype::I32 | Dtype::U8 | Dtype::I8 | Dtype::I16 | Dtype::U16 | Dtype::U32 | Dtype::U64 | Dtype::BOOL)
}

fn decode_float(d: Dtype, b: &[u8]) -> Option<Vec<f64>> {
    Some(match d {
        Dtype::F32 => b.chunks_exact(4).map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
        Dtype::F64 => b.chunks_exact(8).map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect(),
        Dtype::F16 => b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        Dtype::BF16 => b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        _ => return None,
    })
}

fn decode_int(d: Dtype, b: &[u8]) -> Option<Vec<i128>> {
    Some(match d {
        Dtype::I64 => b.chunks_exact(8).map(|c| i128::from(i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))).collect(),
        Dtype::I32 => b.chunks_exact(4).map(|c| i128::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
        Dtype::U8 | Dtype::BOOL => b.iter().map(|&x| i128::from(x)).collect(),
        _ => return None,
    })
}

fn encode(d: Dtype, float: &[f64], int: &[i128]) -> Option<Vec<u8>> {
    Some(match d {
        Dtype::F32 => float.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect(),
        Dtype::F64 => float.iter().flat_map(|&x| x.to_le_bytes()).collect(),
        Dtype::F16 => float.iter().flat_map(|&x| crate::tensor::halfconv::f16_from_f64(x).to_le_bytes()).collect(),
        Dtype::BF16 => float.iter().flat_map(|&x| crate::tensor::halfconv::bf16_from_f64(x).to_le_bytes()).collect(),
        Dtype::I64 => int.iter().flat_map(|&x| (x as i64).to_le_bytes()).collect(),
        Dtype::I32 => int.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
        Dtype::U8 | Dtype::BOOL => int.iter().map(|&x| x as u8).collect(),
        _ => return None,
    })
}

/// Averages the safetensors files `paths` (same keys, shapes and dtypes) and writes `dst` atomically.
pub fn average_files(paths: &[PathBuf], dst: &Path) -> Result<()> {
    let mut accs: Vec<(String, Acc)> = Vec::new();
    for (k, path) in paths.iter().enumerate() {
        let p = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| Error::Io { path: p.clone(), source })?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| Error::checkpoint(&p, format!("not a valid safetensors file: {e}")))?;
        let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
        names.sort();
        if k > 0 && (names.len() != accs.len() || names.iter().zip(&accs).any(|(n, (a, _))| n != a)) {
            let first = paths[0].display();
            return Err(Error::checkpoint(&p, format!("expected the {} keys of {first}, found {} keys that differ", accs.len(), names.len())));
        }
        for (i, name) in names.iter().enumerate() {
            let view = st.tensor(name).map_err(|e| Error::checkpoint(&p, format!("key {name}: {e}")))?;
            let (d, shape, data) = (view.dtype(), view.shape().to_vec(), view.data());
            let unsupported = || Error::checkpoint(&p, format!("key {name}: unsupported dtype {d:?}"));
            if k == 0 {
                let n: usize = shape.iter().product();
                accs.push((
                    name.clone(),
                    Acc { dtype: d, shape: shape.clone(), float: vec![0.0; if is_int(d) { 0 } else { n }], int: vec![0; if is_int(d) { n } else { 0 }] },
                ));
            }
            let acc = &mut accs[i].1;
            if acc.dtype != d || acc.shape != shape {
                return Err(Error::checkpoint(
                    &p,
                    format!("key {name}: expected {:?} {:?} as in {}, found {d:?} {shape:?}", acc.dtype, acc.shape, paths[0].display()),
                ));
            }
            if is_int(d) {
                for (a, x) in acc.int.iter_mut().zip(decode_int(d, data).ok_or_else(unsupported)?) {
                    *a += x;
                }
            } else {
                for (a, x) in acc.float.iter_mut().zip(decode_float(d, data).ok_or_else(unsupported)?) {
                    *a += x;
                }
            }
        }
    }
    let n = paths.len().max(1);
    let mut blobs = Vec::with_capacity(accs.len());
    for (name, acc) in &accs {
        let float: Vec<f64> = acc.float.iter().map(|s| s / n as f64).collect();
        let int: Vec<i128> = acc.int.iter().map(|s| s.div_euclid(n as i128)).collect();
        let bytes = encode(acc.dtype, &float, &int)
            .ok_or_else(|| Error::checkpoint(dst.display().to_string(), format!("key {name}: unsupported dtype {:?}", acc.dtype)))?;
        blobs.push((name.clone(), acc.dtype, acc.shape.clone(), bytes));
    }
    let views = blobs
        .iter()
        .map(|(nm, d, s, b)| safetensors::tensor::TensorView::new(*d, s.clone(), b).map(|v| (nm.clone(), v)))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::checkpoint(dst.display().to_string(), format!("cannot describe a tensor: {e}")))?;
    let bytes = safetensors::serialize(views, None).map_err(|e| Error::checkpoint(dst.display().to_string(), format!("cannot serialize: {e}")))?;
    write_atomic(dst, &bytes)
}

/// The first key (dotted path) where two configs differ, `None` when equal.
fn first_difference(a: &Value, b: &Value, at: &str) -> Option<String> {
    if a == b {
        return None;
    }
    let here = || if at.is_empty() { "the whole config".to_string() } else { at.to_string() };
    let (Value::Mapping(x), Value::Mapping(y)) = (a, b) else { return Some(here()) };
    let null = Value::Null;
    let found = x.keys().chain(y.keys()).find_map(|k| {
        let name = k.as_str().map(str::to_string).unwrap_or_else(|| serde_yaml_ng::to_string(k).unwrap_or_default().trim().to_string());
        let path = if at.is_empty() { name } else { format!("{at}.{name}") };
        first_difference(x.get(k).unwrap_or(&null), y.get(k).unwrap_or(&null), &path)
    });
    found.or_else(|| Some(here()))
}

/// Refuses to average checkpoints of different runs: the `config` (the
/// run's train.yaml) in their infos YAMLs must be the same (checkpoints
/// without one, such as WeNet's, are compared as having none).
pub fn check_same_config(paths: &[PathBuf]) -> Result<()> {
    let Some(first) = paths.first() else { return Ok(()) };
    let config = |p: &Path| -> Result<Value> { Ok(read_infos(p)?.get("config").cloned().unwrap_or(Value::Null)) };
    let want = config(first)?;
    for p in &paths[1..] {
        let got = config(p)?;
        if let Some(key) = first_difference(&want, &got, "") {
            return Err(Error::checkpoint(
                p.display().to_string(),
                format!(
                    "expected the train.yaml of {} (the same run), found a different one (first at `{key}`) in {}: refusing to average checkpoints of different runs",
                    first.display(),
                    super::checkpoint::infos_path(p).display()
                ),
            ));
        }
    }
    Ok(())
}

/// Runs `average`, returning the report to print (which files, where written).
pub fn run_average(args: &AverageArgs) -> Result<String> {
    let cands = list_candidates(&args.src_path, Some(&args.dst_model))?;
    let chosen = select(cands, args.num, args.val_best, args.min_epoch, args.max_epoch, &args.src_path.display().to_string())?;
    let paths: Vec<PathBuf> = chosen.iter().map(|c| c.path.clone()).collect();
    check_same_config(&paths)?;
    average_files(&paths, &args.dst_model)?;
    let mut out = String::new();
    for c in &chosen {
        let loss = c.cv_loss.map_or("-".to_string(), |l| format!("{l:.6}"));
        out.push_str(&format!("averaged {} (epoch {}, step {}, cv_loss {loss})\n", c.path.display(), c.epoch, c.step));
    }
    out.push_str(&format!("saved {} checkpoints' average to {}\n", chosen.len(), args.dst_model.display()));
    Ok(out)
}
