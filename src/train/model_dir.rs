//! The model directory belongs to one run: training into a directory that
//! holds another run's checkpoints refuses (they would mix, and `average`
//! would pick the old run's epochs under the new `train.yaml`) unless
//! `--checkpoint` resumes from one of them or `--overwrite` removes them;
//! and the temporary files of saves that a kill interrupted are removed.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// Whether `name` is a temporary file of `write_atomic` (`.{file}.tmp.{pid}`).
pub fn is_save_temporary(name: &str) -> bool {
    name.starts_with('.') && name.rsplit_once(".tmp.").is_some_and(|(_, pid)| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

/// The files directly in `dir` whose names pass `keep`, sorted (none when
/// `dir` does not exist).
fn files(dir: &Path, keep: impl Fn(&str) -> bool) -> Result<Vec<PathBuf>> {
    let io = |source| Error::Io { path: dir.display().to_string(), source };
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(e)),
    };
    let mut out = Vec::new();
    for entry in rd {
        let entry = entry.map_err(io)?;
        if entry.file_type().map_err(io)?.is_file() && keep(&entry.file_name().to_string_lossy()) {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

fn remove(paths: &[PathBuf]) -> Result<()> {
    for p in paths {
        std::fs::remove_file(p).map_err(|source| Error::Io { path: p.display().to_string(), source })?;
    }
    Ok(())
}

/// Removes the temporary files that interrupted saves left in `dir`;
/// returns them. Run before the job writes anything there.
pub fn remove_stale_temporaries(dir: &Path) -> Result<Vec<PathBuf>> {
    let stale = files(dir, is_save_temporary)?;
    remove(&stale)?;
    Ok(stale)
}

/// Whether `checkpoint` lies directly in `dir` (both resolved).
fn resumes_from(dir: &Path, checkpoint: &Path) -> bool {
    let parent = checkpoint.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    match (std::fs::canonicalize(dir), std::fs::canonicalize(parent)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Checks that `dir` may take this run's checkpoints: it holds none, or
/// `checkpoint` is one of them (a resume), or `overwrite` is set, in which
/// case (on the rank that writes, `writer`) the old run's checkpoints and
/// YAMLs are removed. Every rank checks, before any rank saves.
pub fn claim_model_dir(dir: &Path, checkpoint: Option<&Path>, overwrite: bool, writer: bool) -> Result<()> {
    let old = files(dir, |n| n.ends_with(".safetensors"))?;
    if old.is_empty() || checkpoint.is_some_and(|c| resumes_from(dir, c)) {
        return Ok(());
    }
    if overwrite {
        if writer {
            let mut gone = files(dir, |n| n.ends_with(".safetensors") || n.ends_with(".yaml"))?;
            gone.extend(files(dir, is_save_temporary)?);
            remove(&gone)?;
            eprintln!("--overwrite: removed {} files of the previous run from {}", gone.len(), dir.display());
        }
        return Ok(());
    }
    let d = dir.display();
    let name = old[0].file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let from = match checkpoint {
        Some(c) => format!(" (--checkpoint {} is not one of them)", c.display()),
        None => String::new(),
    };
    Err(Error::config(
        "--model_dir",
        format!(
            "expected a directory without checkpoints, found {} checkpoint files of another run in {d} (e.g. {name}){from}; resume with --checkpoint {d}/<tag>.safetensors, pass --overwrite to remove them, or choose another --model_dir",
            old.len()
        ),
    ))
}
