//! Launch parameters shared by every kernel wrapper: the grid shape, and
//! the parameter kinds of the scanned C signatures (the arguments
//! themselves are typed by the generated functions of [`super::kernels`]).

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

/// The chunk words of a launch table in device memory (common.cuh's
/// `table_chunk`): for entries of `lens` elements, cut into chunks of
/// `chunk`, one word per chunk, its entry's slot (low 32 bits) and its
/// index within the entry (high 32 bits), appended to `words` in entry
/// order; the chunks appended.
pub(crate) fn chunk_words(op: &'static str, lens: impl IntoIterator<Item = usize>, chunk: usize, words: &mut Vec<i64>) -> crate::error::Result<usize> {
    let start = words.len();
    for (k, len) in lens.into_iter().enumerate() {
        let n = len.div_ceil(chunk);
        let n32 = u32::try_from(n)
            .map_err(|_| crate::error::Error::invalid(op, format!("expected at most {} chunks of {chunk} elements per tensor, found {n}", u32::MAX)))?;
        words.extend((0..n32).map(|j| (((j as u64) << 32) | k as u64) as i64));
    }
    Ok(words.len() - start)
}

/// The arrival counters a device keeps (`CudaDevice::arrivals`): enough
/// for a tiled reduction of 4096 strips (131072 columns of 32) or as many
/// rows.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) const ARRIVAL_SLOTS: usize = 4096;

/// `n` arrival counters, all 0, for one launch on the compute stream: the
/// device's kept counters (no memset) or, past [`ARRIVAL_SLOTS`], a fresh
/// zeroed buffer.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) enum Arrivals<'a> {
    Kept(&'a CudaStorage),
    Fresh(CudaStorage),
}

impl std::ops::Deref for Arrivals<'_> {
    type Target = CudaStorage;
    fn deref(&self) -> &CudaStorage {
        match self {
            Arrivals::Kept(s) => s,
            Arrivals::Fresh(s) => s,
        }
    }
}

/// The kernel-name suffix of a dtype (`f32`, `bf16`, ...).
pub fn dtype_suffix(dt: DType) -> &'static str {
    dt.as_str()
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
}
