//! The kernel build: every `cuda/*.cu` is compiled and embedded for the
//! default architectures (asserted when `CI` is set, where scripts/test.sh
//! installs nvcc), and without a usable GPU asking for one is a clear error.

use asrforge::backend::cuda;
use asrforge::{Device, Error};

fn cu_stems() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda");
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
    println!("cuda/*.cu: {stems:?}\nembedded: {embedded:?} for archs {:?}", cuda::archs());
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
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_asrforge")).arg("info").output().unwrap();
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
            // No driver here: the line says why.
            Err(_) => assert!(driver.contains("not found") || driver.contains("failed"), "{driver}"),
            Ok(n) => assert!(text.contains(&format!("GPUs: {n} visible")), "{text}"),
        }
        for lib in ["cuBLAS:", "cuBLASLt:", "NVRTC:", "NCCL:"] {
            assert!(text.lines().any(|l| l.starts_with(lib) && (l.contains("found"))), "{lib} line missing in:\n{text}");
        }
    }
}
