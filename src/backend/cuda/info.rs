//! `asrforge info`: what a build embeds and what CUDA it finds — the build
//! (version, features, kernel modules and architectures), the driver and the
//! libraries (cuBLAS, cuBLASLt, NVRTC, NCCL) with their versions or why not,
//! and the visible GPUs. Every probe checks that a library can be loaded
//! before calling into it (cudarc panics on a missing library).

use std::fmt::Write;

/// The report, as lines of text (never fails: a missing piece is a line saying why).
pub fn report() -> String {
    let mut s = String::new();
    let _ = writeln!(s, "asrforge {}", env!("CARGO_PKG_VERSION"));
    let feats: Vec<&str> = [("cuda", cfg!(feature = "cuda"))].iter().filter(|(_, on)| *on).map(|(n, _)| *n).collect();
    let _ = writeln!(s, "features: {}", if feats.is_empty() { "(none)".to_string() } else { feats.join(", ") });
    let k = super::kernels_embedded();
    if k.is_empty() {
        let _ = writeln!(s, "kernels: none embedded (built without nvcc or without the cuda feature; install nvcc with scripts/install-nvcc.sh)");
    } else {
        let _ = writeln!(s, "kernels: {} modules embedded: {}", k.len(), k.join(", "));
        let _ = writeln!(s, "kernel archs: sm_{} (+ PTX for the lowest)", super::archs().replace(',', ", sm_"));
        let _ = writeln!(s, "{}", ptxas_line());
    }
    probe(&mut s);
    s
}

/// One line on ptxas's report of the embedded kernels: how many, the most
/// registers, and every kernel that spills.
fn ptxas_line() -> String {
    use super::kernels::{resources, NVCC_VERSION};
    let all: Vec<_> = resources().collect();
    let Some(most) = all.iter().max_by_key(|r| r.registers) else {
        return "ptxas report: none (the kernels were built without it)".to_string();
    };
    let spills: Vec<String> = all
        .iter()
        .filter(|r| r.spill_stores + r.spill_loads > 0)
        .map(|r| format!("{} sm_{} ({} B stored, {} B loaded)", r.kernel, r.arch, r.spill_stores, r.spill_loads))
        .collect();
    format!(
        "ptxas report (nvcc {NVCC_VERSION}): {} kernel builds, most registers {} ({} sm_{}), register spills: {}",
        all.len(),
        most.registers,
        most.kernel,
        most.arch,
        if spills.is_empty() { "none".to_string() } else { spills.join(", ") }
    )
}

#[cfg(not(feature = "cuda"))]
fn probe(s: &mut String) {
    let _ = writeln!(s, "CUDA driver: not probed (built without the `cuda` feature)");
}

#[cfg(feature = "cuda")]
fn emulated(s: &mut String) {
    use super::driver::{emu_dir, emulation_problem};
    let _ = writeln!(s, "GPUs: cuda:0 is EMULATED on the CPU (ASRFORGE_CUDA_EMU=1): no GPU is used");
    let _ = writeln!(s, "  emulated modules: {} (built: [{}])", emu_dir(), super::kernels::EMU_MODULES.join(", "));
    if let Some(why) = emulation_problem() {
        let _ = writeln!(s, "  cannot open the emulated device: {why}");
        return;
    }
    let threads = std::env::var("ASRFORGE_EMU_THREADS").unwrap_or_else(|_| "all cores".into());
    match super::device(0) {
        Ok(d) => match d.driver_kind() {
            super::DriverKind::Emulated { dir, schedule } => {
                let _ = writeln!(s, "  cuda:0: {}, module dir {dir}, thread schedule {schedule}, OS threads {threads}", d.name().unwrap_or_default());
            }
            super::DriverKind::Gpu => {
                let _ = writeln!(s, "  cuda:0: opened a GPU although emulation was asked for (a bug)");
            }
        },
        Err(e) => {
            let _ = writeln!(s, "  cuda:0: cannot open: {e}");
        }
    }
}

#[cfg(feature = "cuda")]
fn probe(s: &mut String) {
    use cudarc::driver::{result, sys};
    if super::emulation_requested() {
        emulated(s);
    }
    // SAFETY: each is_culib_present only tries to dlopen its library.
    let driver = unsafe { sys::is_culib_present() };
    if !driver {
        let _ = writeln!(s, "CUDA driver: not found (libcuda.so is not on the loader path: no NVIDIA driver installed?)");
    } else {
        match result::init() {
            Err(e) => {
                let _ = writeln!(s, "CUDA driver: found, but cuInit failed: {}", super::driver::driver_msg(&e));
            }
            Ok(()) => {
                let mut v = 0i32;
                // SAFETY: the driver is loaded and initialised; it writes one int.
                let r = unsafe { sys::cuDriverGetVersion(&mut v) };
                if r == sys::CUresult::CUDA_SUCCESS {
                    let _ = writeln!(s, "CUDA driver: found, CUDA {}.{}", v / 1000, (v % 1000) / 10);
                } else {
                    let _ = writeln!(s, "CUDA driver: found, version unknown ({r:?})");
                }
            }
        }
    }
    let _ = writeln!(s, "cuBLAS: {}", cublas_version());
    let _ = writeln!(s, "cuBLASLt: {}", cublaslt_version());
    let _ = writeln!(s, "NVRTC: {}", nvrtc_version());
    let _ = writeln!(s, "NCCL: {}", nccl_version());
    if super::emulation_requested() {
        let _ = writeln!(s, "real GPUs: not opened (ASRFORGE_CUDA_EMU=1 asks for the emulated device)");
        return;
    }
    if !driver {
        let _ = writeln!(s, "GPUs: none usable (no driver)");
        return;
    }
    match super::device_count() {
        Err(e) => {
            let _ = writeln!(s, "GPUs: none usable: {e}");
        }
        Ok(0) => {
            let _ = writeln!(s, "GPUs: 0 visible (CUDA_VISIBLE_DEVICES={:?})", std::env::var("CUDA_VISIBLE_DEVICES").ok());
        }
        Ok(n) => {
            let _ = writeln!(s, "GPUs: {n} visible");
            for i in 0..n {
                match super::device(i) {
                    Ok(d) => {
                        let name = d.name().unwrap_or_else(|e| format!("? ({e})"));
                        let cc = d.compute_capability().map(|(a, b)| format!("{a}.{b}")).unwrap_or_else(|e| format!("? ({e})"));
                        let mem = d.mem_info().map(|(f, t)| format!("{:.1} GiB total, {:.1} GiB free", gib(t), gib(f))).unwrap_or_else(|e| format!("? ({e})"));
                        let _ = writeln!(s, "  cuda:{i}: {name}, compute capability {cc}, {mem}");
                    }
                    Err(e) => {
                        let _ = writeln!(s, "  cuda:{i}: cannot open: {e}");
                    }
                }
            }
        }
    }
}

#[cfg(feature = "cuda")]
fn gib(b: usize) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

#[cfg(feature = "cuda")]
fn cublas_version() -> String {
    use cudarc::cublas::sys;
    // SAFETY: only tries to dlopen libcublas.
    if !unsafe { sys::is_culib_present() } {
        return "not found (libcublas.so is not on the loader path)".into();
    }
    let mut v = [0i32; 3];
    let props = [sys::libraryPropertyType::MAJOR_VERSION, sys::libraryPropertyType::MINOR_VERSION, sys::libraryPropertyType::PATCH_LEVEL];
    for (slot, p) in v.iter_mut().zip(props) {
        // SAFETY: the library is present; cublasGetProperty needs no handle
        // and writes one int.
        if unsafe { sys::cublasGetProperty(p, slot) } != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return "found, version unknown".into();
        }
    }
    format!("found, {}.{}.{}", v[0], v[1], v[2])
}

#[cfg(feature = "cuda")]
fn cublaslt_version() -> String {
    use cudarc::cublaslt::sys;
    // SAFETY: only tries to dlopen libcublasLt.
    if !unsafe { sys::is_culib_present() } {
        return "not found (libcublasLt.so is not on the loader path)".into();
    }
    // SAFETY: the library is present; the call takes no argument.
    let v = unsafe { sys::cublasLtGetVersion() };
    format!("found, {}.{}.{}", v / 10000, (v % 10000) / 100, v % 100)
}

#[cfg(feature = "cuda")]
fn nvrtc_version() -> String {
    use cudarc::nvrtc::sys;
    // SAFETY: only tries to dlopen libnvrtc.
    if !unsafe { sys::is_culib_present() } {
        return "not found (libnvrtc.so is not on the loader path; asrforge does not need it: kernels are precompiled)".into();
    }
    let (mut a, mut b) = (0i32, 0i32);
    // SAFETY: the library is present; it writes two ints.
    match unsafe { sys::nvrtcVersion(&mut a, &mut b) } {
        sys::nvrtcResult::NVRTC_SUCCESS => format!("found, {a}.{b}"),
        r => format!("found, version unknown ({r:?})"),
    }
}

#[cfg(feature = "cuda")]
fn nccl_version() -> String {
    for name in ["libnccl.so.2", "libnccl.so"] {
        // SAFETY: loading NCCL runs no initialiser with preconditions; the
        // library stays loaded for the lookup below.
        let Ok(lib) = (unsafe { libloading::Library::new(name) }) else { continue };
        // SAFETY: ncclGetVersion has this C signature in every NCCL 2 release.
        let f = unsafe { lib.get::<unsafe extern "C" fn(*mut i32) -> i32>(b"ncclGetVersion\0") };
        return match f {
            Ok(f) => {
                let mut v = 0i32;
                // SAFETY: the symbol is NCCL's; it writes one int and returns 0 on success.
                if unsafe { f(&mut v) } == 0 {
                    // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
                    format!("found ({name}), {}.{}.{}", v / 10000, (v % 10000) / 100, v % 100)
                } else {
                    format!("found ({name}), version unknown")
                }
            }
            Err(e) => format!("found ({name}) but ncclGetVersion is missing: {e}"),
        };
    }
    "not found (libnccl.so.2 is not on the loader path)".into()
}
