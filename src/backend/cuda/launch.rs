//! Launch parameters shared by every kernel wrapper: the grid shape and the
//! typed arguments, in the order of the kernel's C signature.

use super::CudaStorage;
use crate::tensor::DType;

/// Threads per block of the 1-D elementwise launches.
pub const BLOCK: u32 = 256;

/// Blocks of a 1-D grid-stride launch never exceed this; the kernels loop.
pub const MAX_GRID: u32 = 65_535 * 16;

/// The cap on the blocks of every 1-D grid-stride launch: `MAX_GRID`, or
/// `ASRFORGE_CUDA_MAX_GRID` when set to a positive number (read once, at the
/// first launch). Tests set it small so that every grid-stride loop wraps
/// on inputs a CPU emulator runs quickly; a value that is not a positive
/// number is ignored with a warning, never silently.
pub fn max_grid() -> u32 {
    static CAP: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| match std::env::var("ASRFORGE_CUDA_MAX_GRID") {
        Err(_) => MAX_GRID,
        Ok(v) => match v.trim().parse::<u32>() {
            Ok(n) if n > 0 => n.min(MAX_GRID),
            _ => {
                eprintln!("warning: ASRFORGE_CUDA_MAX_GRID={v:?} is not a positive number of blocks; using {MAX_GRID}");
                MAX_GRID
            }
        },
    })
}

/// The grid, block and dynamic shared memory of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_bytes: u32,
}

impl LaunchConfig {
    /// A 1-D grid-stride launch over `n` elements, 256 threads a block (at
    /// least one block, so a kernel may rely on being launched).
    pub fn for_elems(n: usize) -> LaunchConfig {
        let blocks = n.div_ceil(BLOCK as usize).clamp(1, max_grid() as usize) as u32;
        LaunchConfig { grid: (blocks, 1, 1), block: (BLOCK, 1, 1), shared_bytes: 0 }
    }
    /// One block of `threads` per row, with `threads` elements of 8 bytes of
    /// shared memory (room for one f64 partial per thread). The kernels loop
    /// over rows in steps of the grid size, so `rows` may exceed the grid.
    pub fn rows(rows: usize, threads: u32) -> LaunchConfig {
        let blocks = rows.clamp(1, max_grid() as usize) as u32;
        LaunchConfig { grid: (blocks, 1, 1), block: (threads, 1, 1), shared_bytes: threads * 8 }
    }
}

/// One kernel argument. `Ptr` passes the device pointer of a buffer; the
/// scalars pass their value; `Words` passes a small by-value struct laid out
/// as 64-bit words (shapes and strides).
#[derive(Clone, Copy)]
pub enum Arg<'a> {
    Ptr(&'a CudaStorage),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Words(&'a [u64]),
}

/// The kernel-name suffix of a dtype (`f32`, `bf16`, ...).
pub fn dtype_suffix(dt: DType) -> &'static str {
    dt.as_str()
}

/// A scalar argument in the kernel's compute type: f64 kernels take a
/// double, every other float kernel a float (half kernels compute in f32).
pub fn scalar_arg(dt: DType, v: f64) -> Arg<'static> {
    if dt == DType::F64 {
        Arg::F64(v)
    } else {
        Arg::F32(v as f32)
    }
}

/// The kind of one kernel parameter, from its C signature (build.rs scans
/// the `extern "C" __global__` declarations of `cuda/*.cu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// `const T*`: a buffer the kernel reads.
    In,
    /// `T*`: a buffer the kernel writes (and may read).
    Out,
    /// A 4-byte integer (`int`, `uint32_t`).
    Int32,
    /// An 8-byte integer (`int64_t`, `uint64_t`, `long long`).
    Int64,
    /// `float` (also `acc_t<T>` of the half and f32 kernels).
    Float,
    /// `double`.
    Double,
    /// A struct passed by value (shapes and strides as 64-bit words).
    Struct,
}

impl ParamKind {
    /// The kind of signature code `c` (build.rs's `param_code`).
    pub fn from_code(c: u8) -> Option<ParamKind> {
        Some(match c {
            b'i' => ParamKind::In,
            b'o' => ParamKind::Out,
            b'4' => ParamKind::Int32,
            b'8' => ParamKind::Int64,
            b'f' => ParamKind::Float,
            b'd' => ParamKind::Double,
            b's' => ParamKind::Struct,
            _ => return None,
        })
    }
    /// Whether `arg` can be passed for a parameter of this kind.
    pub fn accepts(self, arg: &Arg) -> bool {
        matches!(
            (self, arg),
            (ParamKind::In | ParamKind::Out, Arg::Ptr(_))
                | (ParamKind::Int32, Arg::U32(_) | Arg::I32(_))
                | (ParamKind::Int64, Arg::U64(_) | Arg::I64(_))
                | (ParamKind::Float, Arg::F32(_))
                | (ParamKind::Double, Arg::F64(_))
                | (ParamKind::Struct, Arg::Words(_))
        )
    }
}

impl Arg<'_> {
    /// The argument's variant name, for errors.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Arg::Ptr(_) => "Ptr",
            Arg::U32(_) => "U32",
            Arg::I32(_) => "I32",
            Arg::U64(_) => "U64",
            Arg::I64(_) => "I64",
            Arg::F32(_) => "F32",
            Arg::F64(_) => "F64",
            Arg::Words(_) => "Words",
        }
    }
}

/// Checks `args` against the kernel's signature codes: the count and each
/// argument's kind; the error says which argument, what the signature
/// expects and what was passed.
pub fn check_args(codes: &str, args: &[Arg]) -> std::result::Result<(), String> {
    let kinds = || codes.bytes().map(|c| ParamKind::from_code(c).map_or("?".to_string(), |k| format!("{k:?}"))).collect::<Vec<_>>().join(", ");
    if codes.len() != args.len() {
        return Err(format!("{} argument(s) passed, the kernel's C signature has {} ({})", args.len(), codes.len(), kinds()));
    }
    for (i, (c, a)) in codes.bytes().zip(args).enumerate() {
        match ParamKind::from_code(c) {
            Some(k) if k.accepts(a) => {}
            k => return Err(format!("argument {i} is {}, the kernel's C signature has {k:?} there ({})", a.kind_name(), kinds())),
        }
    }
    Ok(())
}
