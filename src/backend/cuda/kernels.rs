//! The kernel modules build.rs compiled and embedded (none without nvcc or
//! without the `cuda` feature), and the typed launch functions build.rs
//! generates from the `extern "C" __global__` signatures of `cuda/*.cu`.
//!
//! # Typed launches
//!
//! Each `cuda/<stem>.cu` is a module here (`kernels::softmax`) with one
//! function per kernel family: the kernel's name without its dtype words
//! (`softmax_fwd_warp_f32` → `softmax_fwd_warp`, `cast_f32_bf16` → `cast`,
//! `sum_rows_bf16_to_f32` → `sum_rows_to_f32`), taking the device, the
//! dtype(s) that choose the instantiation, the launch shape, then the C
//! parameters in order:
//!
//! ```text
//! extern "C" __global__ void softmax_fwd_f32(const float* x, float* y, uint64_t rows, uint32_t n)
//! pub fn softmax_fwd(dev: &CudaDevice, dt: DType, cfg: LaunchConfig, x: &CudaStorage, y: &CudaStorage, rows: u64, n: u32) -> Result<()>
//! ```
//!
//! `const T*` and `T*` are `&CudaStorage` (read / written: the profile
//! counts their bytes so), `int`/`uint32_t` `i32`/`u32`,
//! `int64_t`/`uint64_t` `i64`/`u64`, `float` `f32`, `double` `f64`,
//! `acc_t<T>` an `f64` passed as the instantiation's float or double, and a
//! struct by value `&[u64; N]` with N its size in 64-bit words (build.rs
//! `STRUCTS`, checked against the C struct by a `static_assert` in the
//! emulated build). A wrong argument count or type is a compile error; a
//! dtype with no instantiation, a buffer of another element type than the
//! kernel's pointer, or a buffer on another device is an [`Error::Cuda`]
//! naming the kernel (a compare per buffer, in release builds too). A
//! family whose instantiations differ in their parameters gets one function
//! per kernel, named as the kernel. A kernel whose by-value table carries
//! buffers (`CastTable`, `MtHead`) takes `moved`: the bytes they read and
//! write, for the step profile.

use super::{CudaDevice, CudaStorage, LaunchConfig};
use crate::error::{Error, Result};
use crate::tensor::DType;
use std::ffi::c_void;

#[cfg(feature = "cuda")]
include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

#[cfg(not(feature = "cuda"))]
/// Embedded kernel modules: (file stem, fatbin).
pub static KERNELS: &[(&str, &[u8])] = &[];
#[cfg(not(feature = "cuda"))]
/// The architectures the kernels were compiled for.
pub static ARCHS: &str = "";

#[cfg(not(feature = "cuda"))]
/// Where the emulated modules lib<stem>.so are (none without the `cuda` feature).
pub const EMU_DIR: &str = "";
#[cfg(not(feature = "cuda"))]
/// The stems of the emulated modules built.
pub const EMU_MODULES: &[&str] = &[];
#[cfg(not(feature = "cuda"))]
/// Why no emulated module was built.
pub const EMU_PROBLEM: &str = "built without the `cuda` feature";
#[cfg(not(feature = "cuda"))]
/// Every kernel's parameter kinds (none without the `cuda` feature).
pub static SIGNATURES: &[(&str, &str, &str)] = &[];

#[cfg(not(feature = "cuda"))]
/// The version of the nvcc that compiled the kernels (none without the `cuda` feature).
pub static NVCC_VERSION: &str = "";
#[cfg(not(feature = "cuda"))]
/// ptxas's report per kernel and arch (none without the `cuda` feature).
pub static RESOURCES: &[(&str, &str, u32, u32, u32, u32, u32)] = &[];

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// What ptxas reported for one kernel on one arch when build.rs compiled it
/// (`nvcc -Xptxas -v`): the figures that bound how many blocks an SM holds
/// and whether local memory stands in for registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resources {
    /// The `.cu` file stem.
    pub module: &'static str,
    /// The `extern "C"` name.
    pub kernel: &'static str,
    /// The compute capability (`90` for sm_90).
    pub arch: u32,
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory per block, bytes.
    pub smem: u32,
    /// Bytes spilled to local memory (stores) and read back (loads).
    pub spill_stores: u32,
    pub spill_loads: u32,
}

impl Resources {
    /// Blocks of `threads` threads one SM of this arch holds by registers,
    /// static shared memory, warps and blocks alone (dynamic shared memory
    /// and the carve-out left aside), or `None` for an arch not in the
    /// table. Per SM (CUDA C++ Programming Guide, the compute capabilities
    /// table): 65536 registers, allocated per warp in units of 256; shared
    /// memory 164 KiB (sm_80, sm_87), 100 KiB (sm_86, sm_89, sm_120) or
    /// 228 KiB (sm_90, sm_100), less 1 KiB reserved per block; 64 warps
    /// (48 on sm_86, sm_89, sm_120); 32 blocks (16 on sm_86, 24 on sm_89
    /// and sm_120).
    pub fn blocks_per_sm(&self, threads: u32) -> Option<u32> {
        let (smem_kib, max_warps, max_blocks): (u64, u64, u64) = match self.arch {
            80 | 87 => (164, 64, 32),
            86 => (100, 48, 16),
            89 | 120 => (100, 48, 24),
            90 | 100 => (228, 64, 32),
            _ => return None,
        };
        // In u64: any field values and block size, no overflow.
        let warps = u64::from(threads.div_ceil(32).max(1));
        let regs_per_warp = (u64::from(self.registers) * 32).div_ceil(256) * 256;
        let by_regs = 65536u64.checked_div(regs_per_warp * warps).unwrap_or(u64::MAX);
        let by_smem = if self.smem == 0 { u64::MAX } else { smem_kib * 1024 / (u64::from(self.smem) + 1024) };
        Some(by_regs.min(by_smem).min(max_warps / warps).min(max_blocks) as u32)
    }
}

/// Every kernel's report, in (module, kernel, arch) order; empty when the
/// build had no nvcc.
pub fn resources() -> impl Iterator<Item = Resources> {
    RESOURCES.iter().map(|&(module, kernel, arch, registers, smem, spill_stores, spill_loads)| Resources {
        module,
        kernel,
        arch,
        registers,
        smem,
        spill_stores,
        spill_loads,
    })
}

/// ptxas's report for `kernel` (any module) on `arch`, if it was compiled.
pub fn resources_of(kernel: &str, arch: u32) -> Option<Resources> {
    resources().find(|r| r.kernel == kernel && r.arch == arch)
}

/// The fatbin of module `stem`, if embedded.
pub fn fatbin(stem: &str) -> Option<&'static [u8]> {
    KERNELS.iter().find(|(s, _)| *s == stem).map(|(_, b)| *b)
}

/// The parameter codes of `module/kernel` from its C signature (see
/// [`crate::backend::cuda::launch::ParamKind`]), if the build scanned it.
pub fn signature(module: &str, kernel: &str) -> Option<&'static str> {
    SIGNATURES.binary_search_by(|(m, k, _)| (*m, *k).cmp(&(module, kernel))).ok().map(|i| SIGNATURES[i].2)
}

/// One kernel of `cuda/*.cu` as the generated launch functions see it.
#[derive(Debug)]
pub struct Kernel {
    /// The `.cu` file stem (the module).
    pub module: &'static str,
    /// The `extern "C"` name.
    pub name: &'static str,
    /// `module/name`, for errors and the profile.
    pub path: &'static str,
    /// One code per C parameter (build.rs `param_code`).
    pub codes: &'static str,
    /// The element type of each pointer parameter, in order (None: not a tensor dtype).
    pub ptr_dtypes: &'static [Option<DType>],
    /// Bit j set: pointer parameter j is written (`T*`), else read (`const T*`).
    pub outs: u64,
}

/// The error of a family launched for dtype(s) it has no kernel for.
fn no_kernel(family: &'static str, dts: &[DType], have: &'static str) -> Error {
    let got: Vec<&str> = dts.iter().map(|d| d.as_str()).collect();
    Error::Cuda { kernel: family.to_string(), msg: format!("no kernel for {}; the kernels are for {have}", got.join("→")) }
}

/// Checks each buffer against the kernel's pointer parameters: on `dev`, of the element type.
fn check_bufs(dev: &CudaDevice, k: &Kernel, bufs: &[&CudaStorage]) -> Result<()> {
    for (j, (b, want)) in bufs.iter().zip(k.ptr_dtypes).enumerate() {
        if b.ordinal() != dev.ordinal() {
            return Err(Error::Cuda {
                kernel: k.path.to_string(),
                msg: format!("pointer argument {j} is on cuda:{}, the launch on cuda:{}", b.ordinal(), dev.ordinal()),
            });
        }
        if let Some(w) = want {
            if b.dtype() != *w {
                return Err(Error::Cuda {
                    kernel: k.path.to_string(),
                    msg: format!("pointer argument {j} expects {} elements, got a {} buffer", w.as_str(), b.dtype().as_str()),
                });
            }
        }
    }
    Ok(())
}

/// An `acc_t<T>` argument: `v` as the kernel's double (code `d`) or float,
/// in the low bytes of a word (little-endian, as every supported host).
fn acc_word(k: &Kernel, i: usize, v: f64) -> u64 {
    if k.codes.as_bytes().get(i) == Some(&b'd') {
        v.to_bits()
    } else {
        (v as f32).to_bits() as u64
    }
}

/// The address of a packed argument, as `cuLaunchKernel` takes it.
fn param<T>(v: &mut T) -> *mut c_void {
    v as *mut T as *mut c_void
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::*;

    /// The Rust types of a generated function's parameters, as the C kinds
    /// each accepts (from the types themselves, not from the generator).
    trait Accepts {
        const CODES: &'static [u8];
    }
    impl Accepts for &CudaStorage {
        const CODES: &'static [u8] = b"io";
    }
    impl Accepts for u32 {
        const CODES: &'static [u8] = b"4";
    }
    impl Accepts for i32 {
        const CODES: &'static [u8] = b"4";
    }
    impl Accepts for u64 {
        const CODES: &'static [u8] = b"8";
    }
    impl Accepts for i64 {
        const CODES: &'static [u8] = b"8";
    }
    impl Accepts for f32 {
        const CODES: &'static [u8] = b"f";
    }
    impl Accepts for f64 {
        const CODES: &'static [u8] = b"fd";
    }
    impl<const N: usize> Accepts for &[u64; N] {
        const CODES: &'static [u8] = b"s";
    }

    include!(concat!(env!("OUT_DIR"), "/bindings_check.rs"));

    #[test]
    fn every_scanned_kernel_has_a_typed_binding_of_its_signature() {
        assert!(!SIGNATURES.is_empty(), "no kernel was scanned");
        assert_eq!(KERNEL_TABLE.len(), SIGNATURES.len(), "one table entry per scanned kernel");
        let rust = rust_param_kinds();
        for (module, name, codes) in SIGNATURES {
            let k = KERNEL_TABLE.iter().find(|k| k.module == *module && k.name == *name).unwrap_or_else(|| panic!("{module}/{name} has no binding"));
            assert_eq!(k.codes, *codes, "{module}/{name}");
            let (_, kinds) = rust.iter().find(|(p, _)| *p == k.path).unwrap_or_else(|| panic!("{module}/{name}: no launch function takes it"));
            assert_eq!(kinds.len(), codes.len(), "{module}/{name}: the function takes {} parameters, the C signature has {}", kinds.len(), codes.len());
            for (i, (c, accepts)) in codes.bytes().zip(kinds.iter()).enumerate() {
                assert!(
                    accepts.contains(&c),
                    "{module}/{name}: parameter {i} is {:?} in C, the Rust type accepts {:?}",
                    c as char,
                    String::from_utf8_lossy(accepts)
                );
            }
            let ptrs = codes.bytes().filter(|c| matches!(c, b'i' | b'o')).count();
            assert_eq!(k.ptr_dtypes.len(), ptrs, "{module}/{name}");
            let outs: u64 = codes.bytes().filter(|c| matches!(c, b'i' | b'o')).enumerate().map(|(j, c)| ((c == b'o') as u64) << j).sum();
            assert_eq!(k.outs, outs, "{module}/{name}: written buffers");
        }
    }
}
