//! The CUDA backend: kernels compiled by build.rs from `cuda/*.cu` and
//! embedded, a driver seam (`driver/`: the real driver through cudarc, or
//! the CPU emulator under `ASRFORGE_CUDA_EMU=1`, with counters of what each
//! step costs), one context and compute stream per GPU, modules loaded by
//! file stem, checked launches, a caching allocator, host↔device and pinned
//! copies, and cuBLAS for matrix products. All of the project's `unsafe` for
//! the GPU lives here, each block with its reason.
//!
//! Each op family has a file named like its CPU twin
//! (`elementwise.rs` ↔ `cpu/elementwise.rs` ↔ `cuda/elementwise.cu`) whose
//! public functions take `&CudaStorage` where the CPU's take `&CpuStorage`.
//!
//! Without the `cuda` feature the same names exist (`stub.rs`) but no device
//! can be opened, so every GPU path is unreachable.

pub mod cast;
mod counters;
pub mod ctc;
pub mod elementwise;
pub mod fastdiv;
pub mod info;
pub mod kernels;
pub mod lab;
pub mod launch;
pub mod loss;
pub mod optim;
pub mod profile;
pub mod reduce;

#[cfg(feature = "cuda")]
mod alloc;
#[cfg(feature = "cuda")]
pub mod blas;
#[cfg(feature = "cuda")]
pub mod blaslt;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
pub mod driver;
#[cfg(feature = "cuda")]
pub mod nccl;
#[cfg(feature = "cuda")]
mod pinned;
#[cfg(feature = "cuda")]
mod storage;
#[cfg(not(feature = "cuda"))]
mod stub;

#[cfg(feature = "cuda")]
pub use alloc::size_class;
pub use counters::Counters;
#[cfg(feature = "cuda")]
pub use device::{CudaDevice, DeviceEvent};
#[cfg(feature = "cuda")]
pub use driver::DriverKind;
#[cfg(feature = "cuda")]
pub use pinned::{upload_staged, upload_words, PinnedBuffer, ScalarReadback};
#[cfg(feature = "cuda")]
pub use storage::CudaStorage;
#[cfg(not(feature = "cuda"))]
pub use stub::DriverKind;
#[cfg(not(feature = "cuda"))]
pub use stub::{blas, blaslt, upload_staged, upload_words, CudaDevice, CudaStorage, PinnedBuffer, ScalarReadback};

pub use launch::{dtype_suffix, LaunchConfig};

pub mod attention;
pub mod conv;
pub mod conv_module;
pub mod dropout;
pub mod glu;
pub mod index;
pub mod layout;
mod nn_common;
pub mod norm;
pub mod softmax;

use crate::error::{Error, Result};
use std::sync::Arc;

/// The pip recipe that installs nvcc without the CUDA toolkit.
pub const NVCC_RECIPE: &str = "pip install nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 (or run scripts/install-nvcc.sh), then rebuild with NVCC=<venv>/lib/python3.*/site-packages/nvidia/cu13/bin/nvcc";

/// A snapshot of a device allocator's counters (bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Bytes held by live storages (size classes, not requests).
    pub in_use: usize,
    /// Bytes of freed blocks kept for reuse.
    pub cached: usize,
    /// Bytes obtained from the driver and not yet returned (`in_use + cached`).
    pub reserved: usize,
    /// The highest `in_use` since the device opened or `reset_peak`.
    pub peak: usize,
    /// cuMemAlloc calls so far (a steady-state training step adds none).
    pub driver_allocs: u64,
    /// Bytes of freed blocks waiting for other streams' events before any
    /// request may get them (part of `cached`; see `alloc.rs`).
    pub pending: usize,
}

/// The embedded kernel modules (file stems, sorted).
pub fn kernels_embedded() -> Vec<&'static str> {
    kernels::KERNELS.iter().map(|(s, _)| *s).collect()
}

/// The architectures the embedded kernels were built for (`80,90`; empty without kernels).
pub fn archs() -> &'static str {
    kernels::ARCHS
}

/// Whether `ASRFORGE_CUDA_EMU=1` asks for the emulated CUDA device (read
/// once). It is an explicit request: it wins over a real GPU, and without
/// it nothing ever runs on the emulator.
pub fn emulation_requested() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("ASRFORGE_CUDA_EMU").is_some_and(|v| v == "1"))
}

/// Starts the step profile on device `ordinal` (see [`profile`]).
pub fn start_profile(ordinal: usize) -> Result<()> {
    #[cfg(feature = "cuda")]
    {
        device(ordinal)?.start_profile();
        Ok(())
    }
    #[cfg(not(feature = "cuda"))]
    device(ordinal).map(|_| ())
}

/// Stops the step profile on device `ordinal` and returns it per kernel family.
pub fn stop_profile(ordinal: usize) -> Result<profile::KernelProfile> {
    #[cfg(feature = "cuda")]
    {
        device(ordinal)?.stop_profile()
    }
    #[cfg(not(feature = "cuda"))]
    device(ordinal).map(|_| profile::KernelProfile::default())
}

/// The driver seam's counters of device `ordinal` (opening it if needed).
pub fn counters(ordinal: usize) -> Result<Counters> {
    Ok(device(ordinal)?.counters())
}

/// The arrival counters device `ordinal` keeps for the kernels whose last
/// block folds the others' partials (layer norm's backward, the tiled
/// sums, the channels-last batch norm): each such block sets its counter
/// back to 0, so between kernels every one is 0. None before a kernel made
/// them. A copy to the host (a synchronisation): for tests.
#[doc(hidden)]
pub fn kept_arrivals(ordinal: usize) -> Result<Option<Vec<i64>>> {
    #[cfg(feature = "cuda")]
    {
        device(ordinal)?.kept_arrivals()
    }
    #[cfg(not(feature = "cuda"))]
    device(ordinal).map(|_| None)
}

/// Whether GPU `ordinal` can be used; the error says why not.
pub fn check_available(ordinal: usize) -> Result<()> {
    device(ordinal).map(|_| ())
}

#[cfg(not(feature = "cuda"))]
/// The device handle of GPU `ordinal` (never, in this build).
pub fn device(ordinal: usize) -> Result<Arc<CudaDevice>> {
    Err(Error::CudaUnavailable(format!("cannot open cuda:{ordinal}: asrforge was built without the `cuda` feature")))
}

#[cfg(feature = "cuda")]
static DEVICES: std::sync::Mutex<Vec<Option<Arc<CudaDevice>>>> = std::sync::Mutex::new(Vec::new());

#[cfg(feature = "cuda")]
/// Why no GPU can be used at all (no kernels, no driver, no device), probed once.
fn driver_problem() -> Option<&'static str> {
    static PROBE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    PROBE
        .get_or_init(|| {
            if kernels::KERNELS.is_empty() {
                return Some(format!("this build embeds no CUDA kernels (nvcc was not found when it was compiled); install nvcc: {NVCC_RECIPE}"));
            }
            // SAFETY: only tries to dlopen libcuda; cudarc panics on first
            // use without it, so this must come before any driver call.
            if !unsafe { cudarc::driver::sys::is_culib_present() } {
                return Some("the CUDA driver library (libcuda.so) was not found: no NVIDIA driver is installed or it is not on the loader path".into());
            }
            if let Err(e) = cudarc::driver::result::init() {
                return Some(format!("cuInit failed: {}", driver::driver_msg(&e)));
            }
            None
        })
        .as_deref()
}

#[cfg(feature = "cuda")]
/// The number of visible GPUs (under `ASRFORGE_CUDA_EMU=1`, one emulated
/// device, or `ASRFORGE_CUDA_EMU_DEVICES` of them, so that a launcher's
/// processes can each open `cuda:LOCAL_RANK` as on a multi-GPU node), or
/// why none can be used.
pub fn device_count() -> Result<usize> {
    if driver::emulation_requested() {
        if let Some(why) = driver::emulation_problem() {
            return Err(Error::CudaUnavailable(why));
        }
        return match std::env::var("ASRFORGE_CUDA_EMU_DEVICES") {
            Err(_) => Ok(1),
            Ok(v) => match v.trim().parse::<usize>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => Err(Error::CudaUnavailable(format!("ASRFORGE_CUDA_EMU_DEVICES: expected a number of emulated devices >= 1, found {v:?}"))),
            },
        };
    }
    if let Some(why) = driver_problem() {
        return Err(Error::CudaUnavailable(why.to_string()));
    }
    cudarc::driver::result::device::get_count()
        .map(|n| n.max(0) as usize)
        .map_err(|e| Error::CudaUnavailable(format!("cuDeviceGetCount failed: {}", driver::driver_msg(&e))))
}

#[cfg(feature = "cuda")]
/// The device handle of GPU `ordinal`, opened on first use (one per process).
pub fn device(ordinal: usize) -> Result<Arc<CudaDevice>> {
    let mut devs = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(Some(d)) = devs.get(ordinal) {
        return Ok(d.clone());
    }
    let n = device_count().map_err(|e| match e {
        Error::CudaUnavailable(m) => Error::CudaUnavailable(format!("cannot open cuda:{ordinal}: {m}")),
        o => o,
    })?;
    if ordinal >= n {
        return Err(Error::CudaUnavailable(format!(
            "cannot open cuda:{ordinal}: {n} GPU(s) visible (CUDA_VISIBLE_DEVICES={:?})",
            std::env::var("CUDA_VISIBLE_DEVICES").ok()
        )));
    }
    let d = CudaDevice::open(ordinal)?;
    if devs.len() <= ordinal {
        devs.resize(ordinal + 1, None);
    }
    devs[ordinal] = Some(d.clone());
    Ok(d)
}

#[cfg(not(feature = "cuda"))]
/// The number of visible GPUs (an error in this build).
pub fn device_count() -> Result<usize> {
    Err(Error::CudaUnavailable("asrforge was built without the `cuda` feature".into()))
}
