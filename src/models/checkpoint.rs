//! Checkpoints: every parameter and buffer as safetensors under WeNet's
//! `state_dict` keys, plus a YAML of infos beside it (`x.safetensors` →
//! `x.yaml`, as WeNet pairs `x.pt` with `x.yaml`). Loading validates the
//! whole file before touching the model: every key, shape and dtype, with
//! missing and unexpected keys reported as PyTorch's strict
//! `load_state_dict` does. Files are written atomically (a temp file in the
//! same directory, fsync, rename), so a crash never leaves half a checkpoint.

use crate::backend::cpu::CpuStorage;
use crate::error::{Error, Result};
use crate::nn::{format_shape, Module, NamedTensor, TensorKind};
use crate::tensor::{DType, Tensor};
use safetensors::{Dtype, SafeTensors};
use serde_yaml_ng::Value;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What a load did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Keys the model has and the file lacks (not loaded).
    pub missing: Vec<String>,
    /// Keys the file has and the model lacks (skipped).
    pub unexpected: Vec<String>,
    /// Keys loaded.
    pub loaded: Vec<String>,
}

/// The infos file that sits beside a checkpoint.
pub fn infos_path(path: &Path) -> PathBuf {
    path.with_extension("yaml")
}

fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I64 => Dtype::I64,
        DType::U8 => Dtype::U8,
    }
}

fn to_le_bytes(s: &CpuStorage) -> Vec<u8> {
    match s {
        CpuStorage::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        CpuStorage::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        CpuStorage::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        CpuStorage::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        CpuStorage::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        CpuStorage::U8(v) => v.clone(),
    }
}

fn from_le_bytes(d: Dtype, b: &[u8]) -> Option<CpuStorage> {
    Some(match d {
        Dtype::F32 => CpuStorage::F32(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()),
        Dtype::F64 => CpuStorage::F64(b.chunks_exact(8).map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect()),
        Dtype::F16 => CpuStorage::F16(b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]])).collect()),
        Dtype::BF16 => CpuStorage::BF16(b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]])).collect()),
        Dtype::I64 => CpuStorage::I64(b.chunks_exact(8).map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect()),
        Dtype::U8 => CpuStorage::U8(b.to_vec()),
        _ => return None,
    })
}

/// Writes `bytes` to `path` atomically: temp file in the same dir, fsync, rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |source| Error::Io { path: path.display().to_string(), source };
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "checkpoint".into());
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let r = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // Make the rename itself durable; not every filesystem can sync a directory.
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r.map_err(io)
}

/// Saves every parameter and buffer of `model` to `path`, and `infos` (a
/// YAML mapping, e.g. epoch, step, lr, cv_loss) to the YAML beside it.
pub fn save_checkpoint(model: &dyn Module, path: &Path, infos: &Value) -> Result<()> {
    let entries = model.state_dict();
    let blobs: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = entries
        .iter()
        .map(|e| Ok((e.name.clone(), st_dtype(e.tensor.dtype()), e.tensor.dims().to_vec(), to_le_bytes(&e.tensor.to_cpu_storage()?))))
        .collect::<Result<_>>()?;
    let views = blobs
        .iter()
        .map(|(n, d, s, b)| safetensors::tensor::TensorView::new(*d, s.clone(), b).map(|v| (n.clone(), v)))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::checkpoint(path.display().to_string(), format!("cannot describe a tensor: {e}")))?;
    let bytes = safetensors::serialize(views, None).map_err(|e| Error::checkpoint(path.display().to_string(), format!("cannot serialize: {e}")))?;
    write_atomic(path, &bytes)?;
    let yaml =
        serde_yaml_ng::to_string(infos).map_err(|e| Error::checkpoint(infos_path(path).display().to_string(), format!("cannot write the infos: {e}")))?;
    write_atomic(&infos_path(path), yaml.as_bytes())
}

/// Reads the infos YAML beside a checkpoint (an empty mapping when absent).
pub fn read_infos(path: &Path) -> Result<Value> {
    let p = infos_path(path);
    if !p.exists() {
        return Ok(Value::Mapping(Default::default()));
    }
    super::yaml::load_yaml(&p)
}

/// Which keys of the file a load takes.
enum Select<'a> {
    All { strict: bool },
    Prefixes(&'a [String]),
}

fn load(model: &dyn Module, path: &Path, sel: Select) -> Result<LoadReport> {
    let p = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| Error::Io { path: p.clone(), source })?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| Error::checkpoint(&p, format!("not a valid safetensors file (corrupt header?): {e}")))?;
    let names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
    let wanted = |k: &str| match &sel {
        Select::All { .. } => true,
        Select::Prefixes(ps) => ps.iter().any(|m| k.starts_with(m.as_str())),
    };
    if let Select::Prefixes(ps) = &sel {
        let bad: Vec<&String> = ps.iter().filter(|m| !names.iter().any(|n| n.starts_with(m.as_str()))).collect();
        if !bad.is_empty() {
            return Err(Error::checkpoint(&p, format!("no key starts with the module prefix(es) {bad:?}")));
        }
    }
    let entries: Vec<NamedTensor> = model.state_dict();
    let mut report = LoadReport::default();
    let mut staged: Vec<(Tensor, Tensor)> = Vec::new();
    for e in &entries {
        if !wanted(&e.name) {
            continue;
        }
        let view = match st.tensor(&e.name) {
            Ok(v) => v,
            Err(_) => {
                // A derived table (positional encoding) may be absent from older checkpoints.
                if e.kind != TensorKind::Constant {
                    report.missing.push(e.name.clone());
                }
                continue;
            }
        };
        if view.shape() != e.tensor.dims() {
            return Err(Error::checkpoint(
                &p,
                format!("key {}: expected shape {}, found {}", e.name, format_shape(e.tensor.dims()), format_shape(view.shape())),
            ));
        }
        let data =
            from_le_bytes(view.dtype(), view.data()).ok_or_else(|| Error::checkpoint(&p, format!("key {}: unsupported dtype {:?}", e.name, view.dtype())))?;
        let want = e.tensor.dtype();
        if data.dtype().is_float() != want.is_float() {
            return Err(Error::checkpoint(&p, format!("key {}: expected dtype {}, found {}", e.name, want.as_str(), data.dtype().as_str())));
        }
        let t = Tensor::from_cpu(data.to_dtype(want), e.tensor.shape().clone())?;
        staged.push((e.tensor.clone(), t));
        report.loaded.push(e.name.clone());
    }
    report.unexpected = names.iter().filter(|n| wanted(n) && !entries.iter().any(|e| &e.name == *n)).cloned().collect();
    if let Select::All { strict: true } = sel {
        if !report.missing.is_empty() || !report.unexpected.is_empty() {
            return Err(Error::checkpoint(&p, format!("missing keys {:?}, unexpected keys {:?}", report.missing, report.unexpected)));
        }
    }
    for (dst, src) in staged {
        dst.assign(&src)?;
    }
    Ok(report)
}

/// Loads a checkpoint into `model`. With `strict`, any missing or unexpected
/// key is an error naming it (and nothing is loaded); without, they are
/// returned in the report. A wrong shape or dtype is always an error.
pub fn load_checkpoint(model: &dyn Module, path: &Path, strict: bool) -> Result<LoadReport> {
    load(model, path, Select::All { strict })
}

/// Loads only the keys that start with one of `prefixes` (WeNet's
/// `--enc_init` with `--enc_init_mods encoder.`); each prefix must match
/// some key of the file.
pub fn load_prefixes(model: &dyn Module, path: &Path, prefixes: &[String]) -> Result<LoadReport> {
    load(model, path, Select::Prefixes(prefixes))
}
