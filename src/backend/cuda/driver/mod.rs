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
use super::profile::{self, LaunchRecord};

use super::launch::LaunchConfig;
use crate::error::{Error, Result};
use crate::tensor::DType;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

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

/// One strided-batched GEMM with cuBLAS's exact semantics (column-major):
/// for every batch index `i`,
/// `C[i] = alpha · op(A[i]) · op(B[i]) + beta · C[i]` (C is not read when
/// beta = 0) with `op(A)` m×k, `op(B)` k×n, `C` m×n,
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
    /// The product's scale (an f32 host scalar except for f64).
    pub alpha: f64,
    /// C's scale; 0 means C is written without being read.
    pub beta: f64,
}

/// A matrix layout of cuBLASLt: `rows × cols`, column-major, leading dimension `ld`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Layout {
    pub rows: u64,
    pub cols: u64,
    pub ld: i64,
}

/// The epilogue of a cuBLASLt matmul.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Epilogue {
    /// D = op(A)·op(B).
    Plain,
    /// BIAS: adds `bias[r]` (rows of D elements, D's type) to every row r of D.
    Bias,
    /// BGRADB: also writes `bias[c] = Σ_l op(B)[l, c]` (columns of D
    /// elements, D's type), the sum over the product's k dimension.
    BgradB,
}

/// Everything a cuBLASLt plan depends on (descriptors, layouts, the
/// preference and the algorithm the heuristic chose): the key of the seam's
/// plan cache, so a shape seen before makes no heuristic call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct LtKey {
    pub trans_a: bool,
    pub trans_b: bool,
    pub a_layout: Layout,
    pub b_layout: Layout,
    pub d_layout: Layout,
    pub dtype: DType,
    pub tf32: bool,
    pub epilogue: Epilogue,
    /// The most workspace the algorithm may use, bytes.
    pub workspace: usize,
}

impl LtKey {
    /// (m, n, k) of the product: op(A) m×k, op(B) k×n.
    pub(crate) fn mnk(&self) -> (u64, u64, u64) {
        let (m, k) = if self.trans_a { (self.a_layout.cols, self.a_layout.rows) } else { (self.a_layout.rows, self.a_layout.cols) };
        let n = if self.trans_b { self.b_layout.rows } else { self.b_layout.cols };
        (m, n, k)
    }
}

/// A plan a driver made for an [`LtKey`] (an opaque handle it owns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LtPlan(pub(crate) usize);

/// One cuBLASLt matmul, `D = op(A)·op(B)` with the key's epilogue, alpha = 1,
/// beta = 0, C aliasing D.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LtMatmul {
    pub key: LtKey,
    pub a: DevPtr,
    pub b: DevPtr,
    pub d: DevPtr,
    /// The epilogue's vector (read by BIAS, written by BGRADB), if it has one.
    pub bias: Option<DevPtr>,
    /// The device's workspace (`key.workspace` bytes; 0 when none).
    pub workspace: DevPtr,
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
    /// The raw `CUstream` of `s`, for libraries that enqueue their own work
    /// on it (NCCL); the emulator has none.
    fn raw_stream(&self, _s: Stream) -> Result<*mut c_void> {
        Err(Error::CudaUnavailable(format!("the {:?} device has no CUDA stream to hand to NCCL", self.kind())))
    }
    /// A fresh stream.
    fn new_stream(&self) -> Result<Stream>;
    /// How many streams the device has: the compute stream (0) and those
    /// `new_stream` made (1, 2, …).
    fn streams(&self) -> usize;
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
    /// The emulator's hold on a stream's events (`CudaDevice::emu_hold_stream`).
    fn emu_hold_stream(&self, _s: Stream, _held: bool) -> Result<()> {
        Err(Error::invalid("emu_hold_stream", format!("expected the emulated device, found {:?}", self.kind())))
    }
    /// The emulator's memory limit (`CudaDevice::emu_limit_memory`).
    fn emu_limit_memory(&self, _bytes: Option<usize>) -> Result<()> {
        Err(Error::invalid("emu_limit_memory", format!("expected the emulated device, found {:?}", self.kind())))
    }
    /// Records a timing event on `s` (the step profile's), or None where
    /// the device has no clock worth reading (the emulator).
    fn timing_event(&self, _s: Stream) -> Result<Option<Event>> {
        Ok(None)
    }
    /// Milliseconds between two finished timing events.
    fn elapsed_ms(&self, _start: &Event, _end: &Event) -> Result<f32> {
        Err(Error::Cuda { kernel: "cuEventElapsedTime".into(), msg: "this device records no timing events".into() })
    }
    /// A cuBLAS strided-batched GEMM on `s`.
    ///
    /// # Safety
    /// The pointers address live buffers holding every element the call
    /// addresses until the stream ran it.
    unsafe fn gemm(&self, g: &Gemm, s: Stream) -> Result<()>;
    /// Creates the descriptors of `key` and runs cuBLASLt's algorithm heuristic once.
    fn lt_plan(&self, key: &LtKey) -> Result<LtPlan>;
    /// A cuBLASLt matmul on `s` with a plan made for `g.key`.
    ///
    /// # Safety
    /// As for `gemm`; the workspace addresses `g.key.workspace` live bytes.
    unsafe fn lt_matmul(&self, plan: LtPlan, g: &LtMatmul, s: Stream) -> Result<()>;
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

/// A profiled launch with its timing events (start, and end if one was recorded).
type Recorded = (LaunchRecord, Option<(Event, Option<Event>)>);

/// A driver with the counters the seam keeps. Every call that waits for the
/// device on the host counts as a host synchronisation.
pub(crate) struct Seam {
    drv: Box<dyn Driver>,
    pub(crate) counts: CounterCells,
    /// The launches recorded while the step profile is on, with their timing events.
    recorded: Mutex<Vec<Recorded>>,
    /// cuBLASLt plans by key (a key the driver refused keeps its error).
    lt_plans: Mutex<HashMap<LtKey, std::result::Result<LtPlan, String>>>,
}

impl Seam {
    /// Wraps a driver.
    pub(crate) fn new(drv: Box<dyn Driver>) -> Seam {
        Seam { drv, counts: CounterCells::default(), recorded: Mutex::new(Vec::new()), lt_plans: Mutex::new(HashMap::new()) }
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
    /// Counted `memset_d8` (`memsets`).
    ///
    /// # Safety
    /// As [`Driver::memset_d8`].
    pub(crate) unsafe fn memset_d8(&self, p: DevPtr, byte: u8, n: usize, s: Stream) -> Result<()> {
        self.counts.add(&self.counts.memsets, 1);
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
    /// `record` is the launch as the step profile counts it (given only while it is on).
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn launch(
        &self,
        f: Func,
        name: &str,
        cfg: LaunchConfig,
        params: &mut [*mut c_void],
        buffers: &[DevPtr],
        s: Stream,
        record: Option<LaunchRecord>,
    ) -> Result<()> {
        self.counts.add(&self.counts.launches, 1);
        let start = record.as_ref().map(|_| self.timing_event(s));
        // SAFETY: forwarded from the caller.
        let r = unsafe { self.drv.launch(f, name, cfg, params, buffers, s) };
        if let (Some(rec), Some(start)) = (record, start) {
            self.record(rec, start, s);
        }
        r
    }
    /// A timing event for the profile (None on the emulator or when the driver refuses one).
    fn timing_event(&self, s: Stream) -> Option<Event> {
        self.drv.timing_event(s).ok().flatten()
    }
    /// Keeps a profiled launch with its start event and an end event recorded now.
    fn record(&self, rec: LaunchRecord, start: Option<Event>, s: Stream) {
        let events = start.map(|e| (e, self.timing_event(s)));
        self.recorded.lock().unwrap_or_else(|e| e.into_inner()).push((rec, events));
    }
    /// Drops what an earlier profile left.
    pub(crate) fn clear_recorded(&self) {
        let old = std::mem::take(&mut *self.recorded.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, ev) in old {
            self.destroy_pair(ev);
        }
    }
    fn destroy_pair(&self, ev: Option<(Event, Option<Event>)>) {
        if let Some((a, b)) = ev {
            self.drv.destroy_event(a);
            if let Some(b) = b {
                self.drv.destroy_event(b);
            }
        }
    }
    /// The recorded launches with their measured milliseconds (where events
    /// were recorded), after waiting for the last one: a host wait that the
    /// counters leave out, since only profiling makes it.
    pub(crate) fn take_recorded(&self) -> Result<Vec<(LaunchRecord, Option<f64>)>> {
        let recs = std::mem::take(&mut *self.recorded.lock().unwrap_or_else(|e| e.into_inner()));
        let last = recs.iter().rev().find_map(|(_, ev)| ev.as_ref().and_then(|(_, b)| b.as_ref()));
        let waited = match last {
            Some(e) => self.drv.event_synchronize(e),
            None => Ok(()),
        };
        let mut out = Vec::with_capacity(recs.len());
        let mut first_err = waited.err();
        for (rec, ev) in recs {
            let ms = match (&ev, &first_err) {
                (Some((a, Some(b))), None) => match self.drv.elapsed_ms(a, b) {
                    Ok(v) => Some(v as f64),
                    Err(e) => {
                        first_err = Some(e);
                        None
                    }
                },
                _ => None,
            };
            self.destroy_pair(ev);
            out.push((rec, ms));
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
    /// Counted GEMM (a launch, and a GEMM).
    ///
    /// # Safety
    /// As [`Driver::gemm`].
    pub(crate) unsafe fn gemm(&self, g: &Gemm, s: Stream) -> Result<()> {
        self.counts.add(&self.counts.launches, 1);
        self.counts.add(&self.counts.gemms, 1);
        if !profile::on() {
            // SAFETY: forwarded from the caller.
            return unsafe { self.drv.gemm(g, s) };
        }
        let start = self.timing_event(s);
        // SAFETY: forwarded from the caller.
        let r = unsafe { self.drv.gemm(g, s) };
        self.record(gemm_record(g), start, s);
        r
    }
    /// Counted cuBLASLt matmul (a launch, and a GEMM).
    ///
    /// # Safety
    /// As [`Driver::lt_matmul`].
    pub(crate) unsafe fn lt_matmul(&self, g: &LtMatmul, s: Stream) -> Result<()> {
        let plan = self.lt_plan(&g.key)?;
        self.counts.add(&self.counts.launches, 1);
        self.counts.add(&self.counts.gemms, 1);
        if !profile::on() {
            // SAFETY: forwarded from the caller.
            return unsafe { self.drv.lt_matmul(plan, g, s) };
        }
        let start = self.timing_event(s);
        // SAFETY: forwarded from the caller.
        let r = unsafe { self.drv.lt_matmul(plan, g, s) };
        self.record(lt_record(g), start, s);
        r
    }
    /// The plan of `key`: from the cache, or made once by the driver (a
    /// heuristic call, counted). A key the driver refused fails again at
    /// once, without another heuristic call.
    pub(crate) fn lt_plan(&self, key: &LtKey) -> Result<LtPlan> {
        let mut plans = self.lt_plans.lock().unwrap_or_else(|e| e.into_inner());
        let p = match plans.get(key) {
            Some(p) => p.clone(),
            None => {
                self.counts.add(&self.counts.lt_heuristics, 1);
                let p = self.drv.lt_plan(key).map_err(|e| e.to_string());
                plans.insert(*key, p.clone());
                p
            }
        };
        p.map_err(|msg| Error::Cuda { kernel: "cublasLt/plan".into(), msg })
    }
    /// Counted host synchronisation with a stream.
    pub(crate) fn synchronize(&self, s: Stream) -> Result<()> {
        self.counts.add(&self.counts.host_syncs, 1);
        let t = std::time::Instant::now();
        let r = self.drv.synchronize(s);
        self.counts.add(&self.counts.host_wait_ns, t.elapsed().as_nanos() as u64);
        r
    }
    /// Counted host wait for an event.
    pub(crate) fn event_synchronize(&self, e: &Event) -> Result<()> {
        self.counts.add(&self.counts.host_syncs, 1);
        let t = std::time::Instant::now();
        let r = self.drv.event_synchronize(e);
        self.counts.add(&self.counts.host_wait_ns, t.elapsed().as_nanos() as u64);
        r
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

/// The product's type for the profile's peak.
fn gemm_type(dtype: DType, tf32: bool) -> &'static str {
    match dtype {
        DType::F32 if tf32 => "tf32",
        d => d.as_str(),
    }
}

/// A cuBLAS GEMM as the profile counts it: each operand once per batch
/// entry (once in all when its batch stride is 0), 2·m·n·k FLOPs per entry.
fn gemm_record(g: &Gemm) -> LaunchRecord {
    let es = g.dtype.size_in_bytes() as u64;
    let (m, n, k, batch) = (g.m.max(0) as u64, g.n.max(0) as u64, g.k.max(0) as u64, g.batch.max(0) as u64);
    let times = |stride: i64| if stride == 0 { 1 } else { batch };
    let ty = gemm_type(g.dtype, g.tf32);
    LaunchRecord {
        family: format!("cublas/gemm {ty}"),
        bytes_read: (times(g.stride_a) * m * k + times(g.stride_b) * k * n) * es,
        bytes_written: times(g.stride_c) * m * n * es,
        flops: 2 * m * n * k * batch,
        gemm_dtype: Some(ty),
        kinds_known: true,
    }
}

/// A cuBLASLt matmul as the profile counts it (the bias read with the operands).
fn lt_record(g: &LtMatmul) -> LaunchRecord {
    let key = &g.key;
    let es = key.dtype.size_in_bytes() as u64;
    let (m, n, k) = key.mnk();
    let ty = gemm_type(key.dtype, key.tf32);
    let (bias_read, bias_written, epi) = match key.epilogue {
        Epilogue::Plain => (0, 0, ""),
        Epilogue::Bias => (m, 0, " +bias"),
        Epilogue::BgradB => (0, n, " +bgradb"),
    };
    LaunchRecord {
        family: format!("cublasLt/matmul {ty}{epi}"),
        bytes_read: (m * k + k * n + bias_read) * es,
        bytes_written: (m * n + bias_written) * es,
        flops: 2 * m * n * k,
        gemm_dtype: Some(ty),
        kinds_known: true,
    }
}
