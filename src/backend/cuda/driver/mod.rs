//! The driver seam: every call the CUDA backend makes into the CUDA driver,
//! cuBLAS and cuBLASLt goes through [`Driver`], which has two
//! implementations — the real driver through cudarc (`real.rs`) and the
//! emulator that runs the same kernel sources on the CPU (`emu.rs`, chosen
//! only by `ASRFORGE_CUDA_EMU=1`). [`Seam`] wraps either one and counts what
//! a GPU step costs: launches, host synchronisations, copied bytes, driver
//! allocations, so the speed of a step can be designed before a GPU measures it.

mod emu;
mod emu_blas;
mod real;

use super::counters::CounterCells;
pub use super::counters::Counters;
pub use super::emulation_requested;

use super::launch::LaunchConfig;
use crate::error::{Error, Result};
use crate::tensor::DType;
use std::ffi::c_void;

/// A device address (a host address on the emulator).
pub(crate) type DevPtr = u64;

/// A kernel function resolved by a driver (an opaque handle: a `CUfunction`
/// on the GPU, a module and kernel index on the emulator).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Func(pub(crate) usize);

/// A stream of the device (0 is the compute stream every op is ordered on).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Stream(pub(crate) usize);

/// The compute stream.
pub(crate) const COMPUTE: Stream = Stream(0);

/// A recorded point in a stream's work (an opaque handle owned by the driver).
#[derive(Debug)]
pub(crate) struct Event(pub(crate) usize);

/// One strided-batched GEMM with cuBLAS's exact semantics (column-major,
/// alpha = 1, beta = 0): for every batch index `i`,
/// `C[i] = op(A[i]) · op(B[i])` with `op(A)` m×k, `op(B)` k×n, `C` m×n,
/// `X[i]` starting `i · stride_x` elements after `x`, element (r, c) of a
/// stored matrix at `r + c·ld`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gemm {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub a: DevPtr,
    pub lda: i32,
    pub stride_a: i64,
    pub b: DevPtr,
    pub ldb: i32,
    pub stride_b: i64,
    pub c: DevPtr,
    pub ldc: i32,
    pub stride_c: i64,
    pub batch: i32,
    /// The type of A, B and C; f16/bf16 compute in f32 and round C once.
    pub dtype: DType,
    /// f32 only: allow TF32 (inputs rounded to a 10-bit mantissa).
    pub tf32: bool,
}

/// A matrix layout of cuBLASLt: `rows × cols`, column-major, leading dimension `ld`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub rows: u64,
    pub cols: u64,
    pub ld: i64,
}

/// One cuBLASLt matmul, `D = op(A)·op(B) (+ bias[r] on every row r of D)`,
/// alpha = 1, beta = 0, C aliasing D, with the layouts as created.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LtMatmul {
    pub trans_a: bool,
    pub trans_b: bool,
    pub a: DevPtr,
    pub a_layout: Layout,
    pub b: DevPtr,
    pub b_layout: Layout,
    pub d: DevPtr,
    pub d_layout: Layout,
    /// The BIAS epilogue's vector (rows of D elements, D's type), if any.
    pub bias: Option<DevPtr>,
    pub dtype: DType,
    pub tf32: bool,
}

/// What a driver is, for `asrforge info` and error messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriverKind {
    /// The CUDA driver on a GPU.
    Gpu,
    /// The CPU emulator: its module folder and thread schedule.
    Emulated { dir: String, schedule: String },
}

/// The calls the backend makes into a CUDA driver, cuBLAS and cuBLASLt.
/// Copies, memsets and launches are ordered on `stream` and may return
/// before they ran; `synchronize` waits for them.
pub(crate) trait Driver: Send + Sync {
    /// What this driver is.
    fn kind(&self) -> DriverKind;
    /// The device's name.
    fn name(&self) -> Result<String>;
    /// The compute capability (major, minor).
    fn compute_capability(&self) -> Result<(i32, i32)>;
    /// Free and total device memory in bytes.
    fn mem_info(&self) -> Result<(usize, usize)>;
    /// Makes the device current on the calling thread.
    fn bind(&self) -> Result<()>;
    /// A fresh stream.
    fn new_stream(&self) -> Result<Stream>;
    /// A fresh buffer of `bytes` (> 0), or `None` when the device is out of memory.
    fn malloc(&self, bytes: usize) -> Result<Option<DevPtr>>;
    /// Returns a buffer to the driver.
    ///
    /// # Safety
    /// `p` came from `malloc(bytes)` of this driver, no queued work uses it
    /// and it is never used again.
    unsafe fn free(&self, p: DevPtr, bytes: usize) -> Result<()>;
    /// Told by the caching allocator that `p` (a `malloc` buffer of `class`
    /// bytes) now holds a storage of `requested` bytes; the emulator guards the rest.
    fn block_taken(&self, _p: DevPtr, _requested: usize, _class: usize) {}
    /// Told by the caching allocator that the storage in `p` was dropped.
    fn block_returned(&self, _p: DevPtr) {}
    /// Page-locked host memory of `bytes` (> 0).
    fn malloc_host(&self, bytes: usize) -> Result<*mut u8>;
    /// Frees `malloc_host` memory.
    ///
    /// # Safety
    /// `p` came from `malloc_host(bytes)` and no queued copy reads it.
    unsafe fn free_host(&self, p: *mut u8, bytes: usize) -> Result<()>;
    /// Sets `n` bytes at `p` to `byte`.
    ///
    /// # Safety
    /// `p` addresses at least `n` bytes of a live buffer until the stream ran the memset.
    unsafe fn memset_d8(&self, p: DevPtr, byte: u8, n: usize, s: Stream) -> Result<()>;
    /// Copies `src` to the device at `dst`.
    ///
    /// # Safety
    /// `dst` addresses `src.len()` bytes of a live buffer, and `src` stays
    /// alive and unchanged until the stream ran the copy.
    unsafe fn htod(&self, dst: DevPtr, src: &[u8], s: Stream) -> Result<()>;
    /// Copies device bytes at `src` into `dst`.
    ///
    /// # Safety
    /// `src` addresses `dst.len()` bytes of a live buffer, and `dst` is not
    /// touched by the host until the stream ran the copy.
    unsafe fn dtoh(&self, dst: &mut [u8], src: DevPtr, s: Stream) -> Result<()>;
    /// Copies `n` device bytes.
    ///
    /// # Safety
    /// Both address `n` bytes of live buffers until the stream ran the copy.
    unsafe fn dtod(&self, dst: DevPtr, src: DevPtr, n: usize, s: Stream) -> Result<()>;
    /// Resolves `module/kernel` (loading the module once).
    fn function(&self, module: &str, kernel: &str) -> Result<Func>;
    /// Launches `f` (`name` is `module/kernel`, for errors); `buffers` are
    /// the device buffers passed to it (the emulator checks their guards after it).
    ///
    /// # Safety
    /// `params` holds one pointer per kernel parameter, each to a live value
    /// of that parameter's type; device pointers address live buffers until
    /// the stream ran the kernel.
    unsafe fn launch(&self, f: Func, name: &str, cfg: LaunchConfig, params: &mut [*mut c_void], buffers: &[DevPtr], s: Stream) -> Result<()>;
    /// Waits until every queued operation of `s` has finished.
    fn synchronize(&self, s: Stream) -> Result<()>;
    /// Records the work queued on `s` so far.
    fn record_event(&self, s: Stream) -> Result<Event>;
    /// Makes `s` wait (on the device) for the work `e` recorded.
    fn stream_wait_event(&self, s: Stream, e: &Event) -> Result<()>;
    /// Waits on the host until the work `e` recorded has finished.
    fn event_synchronize(&self, e: &Event) -> Result<()>;
    /// Whether the work `e` recorded has finished (no wait).
    fn event_query(&self, e: &Event) -> Result<bool>;
    /// Frees an event.
    fn destroy_event(&self, e: Event);
    /// A cuBLAS strided-batched GEMM on `s`.
    ///
    /// # Safety
    /// The pointers address live buffers holding every element the call
    /// addresses until the stream ran it.
    unsafe fn gemm(&self, g: &Gemm, s: Stream) -> Result<()>;
    /// A cuBLASLt matmul on `s`.
    ///
    /// # Safety
    /// As for `gemm`.
    unsafe fn lt_matmul(&self, g: &LtMatmul, s: Stream) -> Result<()>;
    /// The cuBLAS version number.
    fn blas_version(&self) -> Result<i32>;
}

/// The folder the emulated modules are loaded from (`ASRFORGE_EMU_DIR`, else the build's).
pub fn emu_dir() -> String {
    std::env::var("ASRFORGE_EMU_DIR").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| super::kernels::EMU_DIR.to_string())
}

/// Why the emulated device cannot be used, if it cannot.
pub fn emulation_problem() -> Option<String> {
    let dir = emu_dir();
    if super::kernels::EMU_MODULES.is_empty() && std::env::var_os("ASRFORGE_EMU_DIR").is_none() {
        let why = if super::kernels::EMU_PROBLEM.is_empty() { "no module was built" } else { super::kernels::EMU_PROBLEM };
        return Some(format!("ASRFORGE_CUDA_EMU=1 asks for the emulated CUDA device, but this build has no emulated kernel modules: {why}"));
    }
    if !std::path::Path::new(&dir).is_dir() {
        return Some(format!(
            "ASRFORGE_CUDA_EMU=1 asks for the emulated CUDA device, but its module folder {dir} does not exist (set ASRFORGE_EMU_DIR or rebuild)"
        ));
    }
    None
}

/// Opens the driver of device `ordinal`: the emulator when asked for, else the GPU.
pub(crate) fn open(ordinal: usize) -> Result<Box<dyn Driver>> {
    if emulation_requested() {
        if let Some(why) = emulation_problem() {
            return Err(Error::CudaUnavailable(why));
        }
        return Ok(Box::new(emu::EmuDriver::new(ordinal, emu_dir())));
    }
    Ok(Box::new(real::RealDriver::new(ordinal)?))
}

pub(crate) use real::driver_msg;

/// A driver with the counters the seam keeps. Every call that waits for the
/// device on the host counts as a host synchronisation.
pub(crate) struct Seam {
    drv: Box<dyn Driver>,
    pub(crate) counts: CounterCells,
}

impl Seam {
    /// Wraps a driver.
    pub(crate) fn new(drv: Box<dyn Driver>) -> Seam {
        Seam { drv, counts: CounterCells::default() }
    }
    /// The driver, for calls that are not counted (properties, streams, events).
    pub(crate) fn driver(&self) -> &dyn Driver {
        &*self.drv
    }
    /// Counted `malloc`.
    pub(crate) fn malloc(&self, bytes: usize) -> Result<Option<DevPtr>> {
        let r = self.drv.malloc(bytes)?;
        if r.is_some() {
            self.counts.add(&self.counts.driver_allocs, 1);
        }
        Ok(r)
    }
    /// Counted `free`.
    ///
    /// # Safety
    /// As [`Driver::free`].
    pub(crate) unsafe fn free(&self, p: DevPtr, bytes: usize) -> Result<()> {
        self.counts.add(&self.counts.driver_frees, 1);
        // SAFETY: forwarded from the caller.
        unsafe { self.drv.free(p, bytes) }
    }
    /// `memset_d8` (not a copy: counts nothing).
    ///
    /// # Safety
    /// As [`Driver::memset_d8`].
    pub(crate) unsafe fn memset_d8(&self, p: DevPtr, byte: u8, n: usize, s: Stream) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.drv.memset_d8(p, byte, n, s) }
    }
    /// Counted host→device copy.
    ///
    /// # Safety
    /// As [`Driver::htod`].
    pub(crate) unsafe fn htod(&self, dst: DevPtr, src: &[u8], s: Stream) -> Result<()> {
        self.counts.add(&self.counts.htod_bytes, src.len() as u64);
        self.counts.add(&self.counts.htod_copies, 1);
        // SAFETY: forwarded from the caller.
        unsafe { self.drv.htod(dst, src, s) }
    }
    /// Counted device→host copy.
    ///
    /// # Safety
    /// As [`Driver::dtoh`].
    pub(crate) unsafe fn dtoh(&self, dst: &mut [u8], src: DevPtr, s: Stream) -> Result<()> {
        self.counts.add(&self.counts.dtoh_bytes, dst.len() as u64);
        self.counts.add(&self.counts.dtoh_copies, 1);
        // SAFETY: forwarded from the caller.
        unsafe { self.drv.dtoh(dst, src, s) }
    }
    /// Counted device→device copy.
    ///
    /// # Safety
    /// As [`Driver::dtod`].
    pub(crate) unsafe fn dtod(&self, dst: DevPtr, src: DevPtr, n: usize, s: Stream) -> Result<()> {
        self.counts.add(&self.counts.dtod_bytes, n as u64);
        // SAFETY: forwarded from the caller.
        unsafe { self.drv.dtod(dst, src, n, s) }
    }
    /// Counted launch.
    ///
    /// # Safety
    /// As [`Driver::launch`].
    pub(crate) unsafe fn launch(&self, f: Func, name: &str, cfg: LaunchConfig, params: &mut [*mut c_void], buffers: &[DevPtr], s: Stream) -> Result<()> {
        self.counts.add(&self.counts.launches, 1);
        // SAFETY: forwarded from the caller.
        unsafe { self.drv.launch(f, name, cfg, params, buffers, s) }
    }
    /// Counted GEMM (a launch, and a GEMM).
    ///
    /// # Safety
    /// As [`Driver::gemm`].
    pub(crate) unsafe fn gemm(&self, g: &Gemm, s: Stream) -> Result<()> {
        self.counts.add(&self.counts.launches, 1);
        self.counts.add(&self.counts.gemms, 1);
        // SAFETY: forwarded from the caller.
        unsafe { self.drv.gemm(g, s) }
    }
    /// Counted cuBLASLt matmul (a launch, and a GEMM).
    ///
    /// # Safety
    /// As [`Driver::lt_matmul`].
    pub(crate) unsafe fn lt_matmul(&self, g: &LtMatmul, s: Stream) -> Result<()> {
        self.counts.add(&self.counts.launches, 1);
        self.counts.add(&self.counts.gemms, 1);
        // SAFETY: forwarded from the caller.
        unsafe { self.drv.lt_matmul(g, s) }
    }
    /// Counted host synchronisation with a stream.
    pub(crate) fn synchronize(&self, s: Stream) -> Result<()> {
        self.counts.add(&self.counts.host_syncs, 1);
        self.drv.synchronize(s)
    }
    /// Counted host wait for an event.
    pub(crate) fn event_synchronize(&self, e: &Event) -> Result<()> {
        self.counts.add(&self.counts.host_syncs, 1);
        self.drv.event_synchronize(e)
    }
    /// Waits on the host for an event only if its work has not finished:
    /// an event already complete costs no wait and is not counted.
    pub(crate) fn event_wait_if_pending(&self, e: &Event) -> Result<()> {
        if self.drv.event_query(e)? {
            return Ok(());
        }
        self.event_synchronize(e)
    }
}
