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
