//! The kernel build: every `cuda/*.cu` is compiled and embedded for the
//! default architectures (asserted when `CI` is set, where scripts/test.sh
//! installs nvcc), and without a usable GPU asking for one is a clear error.

use asrforge::backend::cuda;
use asrforge::{Device, Error};
use std::path::{Path, PathBuf};

/// Where a staged copy keeps what it needs: scripts/gpu-check.sh stages
/// this binary as `.device/tests/cuda_build`, the kernel sources' names in
/// `.device/cuda/` and the CLI as `.device/bin/asrforge`. `None` when this
/// binary is not in such a layout (a run on the build machine).
fn staged_root() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let root = exe.parent()?.parent()?.to_path_buf();
    (exe.parent()?.file_name()? == "tests" && root.join("cuda").is_dir()).then_some(root)
}

/// The folder of the kernel sources: the staged copy's on a GPU host, else
/// the build tree's (the build machine's path does not exist elsewhere).
fn cuda_dir() -> PathBuf {
    match staged_root() {
        Some(root) => root.join("cuda"),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda"),
    }
}

/// The asrforge binary: the staged one next to a staged copy, else cargo's.
fn asrforge_bin() -> PathBuf {
    match staged_root() {
        Some(root) => root.join("bin").join("asrforge"),
        None => PathBuf::from(env!("CARGO_BIN_EXE_asrforge")),
    }
}

fn cu_stems() -> Vec<String> {
    let dir = cuda_dir();
    let mut v: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn every_kernel_file_is_embedded_in_ci() {
    let stems = cu_stems();
    let embedded: Vec<String> = cuda::kernels_embedded().iter().map(|s| s.to_string()).collect();
    println!("cuda/*.cu: {stems:?} (in {})\nembedded: {embedded:?} for archs {:?}", cuda_dir().display(), cuda::archs());
    assert!(!stems.is_empty(), "cuda/ holds no .cu file");
    if std::env::var_os("CI").is_none() {
        println!("CI is not set: not requiring the kernels to be embedded");
        return;
    }
    assert!(cfg!(feature = "cuda"), "CI builds with the default `cuda` feature");
    assert_eq!(embedded, stems, "every cuda/*.cu must be compiled and embedded");
    if std::env::var_os("CUDA_ARCHS").is_none() {
        assert_eq!(cuda::archs(), "80,90", "default architectures");
    }
}

#[test]
fn no_gpu_is_a_clear_error_or_a_working_device() {
    match Device::cuda(0) {
        Ok(d) => {
            println!("GPU present: {d:?}");
            assert!(Device::available().contains(&Device::Cuda(0)));
        }
        Err(Error::CudaUnavailable(msg)) => {
            println!("no GPU: {msg}");
            assert!(msg.contains("cuda:0"), "the message names the device: {msg}");
            assert!(!Device::available().contains(&Device::Cuda(0)));
            let e = Device::parse("cuda:3").unwrap_err().to_string();
            assert!(e.contains("cuda:3"), "{e}");
        }
        Err(e) => panic!("expected CudaUnavailable, got {e}"),
    }
}

#[test]
fn info_prints_the_kernels_and_the_driver_state() {
    let bin = asrforge_bin();
    let out = std::process::Command::new(&bin).arg("info").output().unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(out.status.success(), "asrforge info failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(text.starts_with(&format!("asrforge {}", env!("CARGO_PKG_VERSION"))), "{text}");
    let embedded = cuda::kernels_embedded();
    if embedded.is_empty() {
        assert!(text.contains("kernels: none embedded"), "{text}");
    } else {
        let line = format!("kernels: {} modules embedded: {}", embedded.len(), embedded.join(", "));
        assert!(text.contains(&line), "expected {line:?} in:\n{text}");
    }
    if cfg!(feature = "cuda") {
        let driver = text.lines().find(|l| l.starts_with("CUDA driver:")).unwrap_or_else(|| panic!("no driver line in:\n{text}"));
        match cuda::device_count() {
            // The emulated device (ASRFORGE_CUDA_EMU=1) is named as such, never as a GPU.
            Ok(_) if cuda::emulation_requested() => assert!(text.contains("GPUs: cuda:0 is EMULATED on the CPU"), "{text}"),
            // No driver here: the line says why.
            Err(_) => assert!(driver.contains("not found") || driver.contains("failed"), "{driver}"),
            Ok(n) => assert!(text.contains(&format!("GPUs: {n} visible")), "{text}"),
        }
        for lib in ["cuBLAS:", "cuBLASLt:", "NVRTC:", "NCCL:"] {
            assert!(text.lines().any(|l| l.starts_with(lib) && (l.contains("found"))), "{lib} line missing in:\n{text}");
        }
    }
}

/// A copy staged the way scripts/gpu-check.sh stages it, run from another
/// folder: it reads the staged sources and binary, not the build tree's
/// (which a GPU host does not have). The staged `cuda/` here names one
/// kernel file fewer than the tree, so reading the tree's would show.
#[test]
fn a_staged_copy_reads_its_own_files_not_the_build_trees() {
    if staged_root().is_some() {
        println!("running as a staged copy already: nothing to stage");
        return;
    }
    let root = std::env::temp_dir().join(format!("asrforge-staged-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for d in ["tests", "cuda", "bin"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let tree = cu_stems();
    assert!(tree.len() >= 2, "cuda/ holds {tree:?}");
    let staged = &tree[1..];
    for s in staged {
        std::fs::write(root.join("cuda").join(format!("{s}.cu")), "").unwrap();
    }
    let exe = root.join("tests").join("cuda_build");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_asrforge"), root.join("bin").join("asrforge")).unwrap();
    let elsewhere = std::env::temp_dir();
    let run = |filter: &str| {
        let out = std::process::Command::new(&exe).args([filter, "--exact", "--nocapture"]).current_dir(&elsewhere).env_remove("CI").output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
    };
    let (ok, text) = run("every_kernel_file_is_embedded_in_ci");
    assert!(ok, "the staged build test failed:\n{text}");
    let want = format!("cuda/*.cu: {staged:?} (in {})", root.join("cuda").display());
    assert!(text.contains(&want), "expected {want:?} in:\n{text}");
    let (ok, text) = run("info_prints_the_kernels_and_the_driver_state");
    assert!(ok, "the staged info test failed:\n{text}");
    std::fs::remove_dir_all(&root).unwrap();
}
