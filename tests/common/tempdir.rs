//! A test's scratch directory (`TempDir`), shared by every test that
//! writes files: `mod common` has it, and a test without `common` includes
//! this file alone (`#[path = "common/tempdir.rs"] mod tempdir;`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A test's scratch directory: fresh and empty when made, removed with
/// everything in it when it drops, unless the test is failing (a panic is
/// unwinding), when it is kept for inspection and its path printed. Without
/// the removal every run of the suite left its corpora, checkpoints and
/// logs in the temp dir (a training test's alone is 220 MB).
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// `asrforge-{name}-{pid}` under the system temp dir, emptied first if
    /// an earlier run left it.
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("asrforge-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept the failing test's directory {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}
