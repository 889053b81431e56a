//! `CudaDevice`: one per GPU per process. It holds the driver seam (the real
//! driver or the emulator, with the compute stream every kernel, copy and
//! cuBLAS call is ordered on), the caching allocator, and the kernel
//! functions, one slot per kernel id of `kernels::KERNEL_TABLE`, resolved
//! at the kernel's first launch (the generated launch functions of
//! `kernels` call [`CudaDevice::launch_kernel`]). While the step profile is
//! on, each launch is recorded with the bytes of its buffers (see
//! `profile.rs`).

use super::alloc::Pool;
use super::driver::{self, Counters, DevPtr, DriverKind, Event, Func, Seam, Stream, COMPUTE};
use super::kernels;
use super::launch::{Arrivals, LaunchConfig, ARRIVAL_SLOTS};
use super::profile::{self, KernelProfile, LaunchRecord};
use super::CudaStorage;
use crate::error::{Error, Result};
use crate::tensor::DType;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

/// One GPU (or the emulated device): its driver seam, allocator and kernel functions.
pub struct CudaDevice {
    ordinal: usize,
    seam: Seam,
    pub(crate) pool: Mutex<Pool>,
    /// Each kernel's function, by its id in `kernels::KERNEL_TABLE`, resolved at its first launch.
    functions: Box<[OnceLock<Func>]>,
    /// cuBLASLt's workspace (address, bytes), obtained from the driver once.
    lt_workspace: OnceLock<std::result::Result<(DevPtr, usize), String>>,
    /// The stream batch uploads run on (made at first use).
    copy_stream: OnceLock<usize>,
    /// The arrival counters of the kernels whose last block folds the
    /// others' partial results ([`CudaDevice::arrivals`]), zeroed once.
    arrivals: OnceLock<CudaStorage>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaDevice(cuda:{})", self.ordinal)
    }
}

impl CudaDevice {
    /// Opens device `ordinal` (the caller has checked that it exists): the
    /// emulator when `ASRFORGE_CUDA_EMU=1`, else the GPU.
    pub(crate) fn open(ordinal: usize) -> Result<Arc<CudaDevice>> {
        let drv = driver::open(ordinal)?;
        Ok(Arc::new(CudaDevice {
            ordinal,
            seam: Seam::new(drv),
            pool: Mutex::new(Pool::default()),
            functions: kernels::KERNEL_TABLE.iter().map(|_| OnceLock::new()).collect(),
            lt_workspace: OnceLock::new(),
            copy_stream: OnceLock::new(),
            arrivals: OnceLock::new(),
        }))
    }
    /// The GPU's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
    /// The driver seam (every driver, cuBLAS and cuBLASLt call goes through it).
    pub(crate) fn seam(&self) -> &Seam {
        &self.seam
    }
    /// Whether this is a GPU or the emulator (and which).
    pub fn driver_kind(&self) -> DriverKind {
        self.seam.driver().kind()
    }
    /// Whether this device is the CPU emulator.
    pub fn is_emulated(&self) -> bool {
        matches!(self.driver_kind(), DriverKind::Emulated { .. })
    }
    /// A new stream of this device, for work ordered apart from the compute stream.
    pub fn new_stream(&self) -> Result<usize> {
        Ok(self.seam.driver().new_stream()?.0)
    }
    /// The stream host-to-device batch copies run on (made at first use),
    /// ordered against the compute stream by events.
    pub fn copy_stream(&self) -> Result<usize> {
        if let Some(&s) = self.copy_stream.get() {
            return Ok(s);
        }
        let s = self.new_stream()?;
        Ok(*self.copy_stream.get_or_init(|| s))
    }
    /// Records the work queued so far on stream `stream` (0: the compute stream).
    pub fn record_event(self: &Arc<Self>, stream: usize) -> Result<DeviceEvent> {
        let e = self.seam.driver().record_event(Stream(stream))?;
        Ok(DeviceEvent { dev: self.clone(), ev: Some(e) })
    }
    /// Emulated device only (tests of code that polls events): while
    /// `held`, the events of stream `stream` report their work as not
    /// finished to queries, as a GPU does while the work runs; a host wait
    /// on the stream or one of its events ends the hold. An error on a GPU.
    pub fn emu_hold_stream(&self, stream: usize, held: bool) -> Result<()> {
        self.seam.driver().emu_hold_stream(Stream(stream), held)
    }
    /// Emulated device only (tests of the out-of-memory path): the device
    /// refuses an allocation that would take its buffers past `bytes` in
    /// all (None: no limit). An error on a GPU.
    pub fn emu_limit_memory(&self, bytes: Option<usize>) -> Result<()> {
        self.seam.driver().emu_limit_memory(bytes)
    }
    /// Makes this device current on the calling thread (before a library
    /// such as NCCL enqueues work from a thread that launched nothing yet).
    pub(crate) fn bind(&self) -> Result<()> {
        self.seam.driver().bind()
    }
    /// The raw `CUstream` of stream `stream` (0: compute), for NCCL; an
    /// error on the emulator.
    pub(crate) fn raw_stream(&self, stream: usize) -> Result<*mut c_void> {
        self.seam.driver().raw_stream(Stream(stream))
    }
    /// Waits until every queued kernel and copy has finished; reports an
    /// asynchronous kernel fault (a host synchronisation in the counters).
    pub fn synchronize(&self) -> Result<()> {
        self.seam.synchronize(COMPUTE)
    }
    /// The GPU's name.
    pub fn name(&self) -> Result<String> {
        self.seam.driver().name()
    }
    /// The compute capability (major, minor).
    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        self.seam.driver().compute_capability()
    }
    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.seam.driver().mem_info()
    }
    /// The seam's counters now (see [`Counters::since`] for the cost of a piece of work).
    pub fn counters(&self) -> Counters {
        let s = self.pool_stats();
        self.seam.counts.snapshot(s.in_use as u64, s.peak as u64)
    }

    /// Uninitialised storage for `len` elements of `dtype` from the caching
    /// allocator (all bytes 0xFF, a NaN in every float type, when
    /// `ASRFORGE_CUDA_POISON=1`).
    pub fn alloc(self: &Arc<Self>, dtype: DType, len: usize) -> Result<CudaStorage> {
        self.alloc_on_stream(dtype, len, COMPUTE.0)
    }
    /// Uninitialised storage for work on stream `stream` (below 64): a block
    /// from that stream's free list, whose earlier uses were all ordered
    /// before work queued on `stream` now (the poison fill runs on `stream`).
    pub fn alloc_on_stream(self: &Arc<Self>, dtype: DType, len: usize, stream: usize) -> Result<CudaStorage> {
        let bytes = len
            .checked_mul(dtype.size_in_bytes())
            .ok_or_else(|| Error::invalid("cuda alloc", format!("{len} elements of {dtype:?} overflow the address space")))?;
        if stream >= 64 {
            return Err(Error::invalid("cuda alloc", format!("expected a stream number below 64, found {stream}")));
        }
        let block = self.alloc_block(bytes, Stream(stream))?;
        let s = CudaStorage::new(block, dtype, len, self.clone());
        if poison_enabled() {
            s.memset_on(0xFF, Stream(stream))?;
        }
        Ok(s)
    }
    /// Zero-filled storage.
    pub fn zeros(self: &Arc<Self>, dtype: DType, len: usize) -> Result<CudaStorage> {
        let s = self.alloc(dtype, len)?;
        s.memset(0)?;
        Ok(s)
    }

    /// `n` zeroed arrival counters (I64) for a kernel on the compute stream
    /// whose last block to arrive folds the partials (common.cuh
    /// `last_tile_arrived`). That block sets its counter back to 0, so the
    /// kept counters are 0 again for the next such kernel on the stream
    /// (kernels on one stream run one after another): zeroed once per
    /// device, not a memset per launch. The kept buffer is made at first
    /// use and lives as long as the device (the process).
    pub(crate) fn arrivals(self: &Arc<Self>, n: usize) -> Result<Arrivals<'_>> {
        if n > ARRIVAL_SLOTS {
            return Ok(Arrivals::Fresh(self.zeros(DType::I64, n)?));
        }
        if let Some(s) = self.arrivals.get() {
            return Ok(Arrivals::Kept(s));
        }
        let s = self.zeros(DType::I64, ARRIVAL_SLOTS)?;
        Ok(Arrivals::Kept(self.arrivals.get_or_init(|| s)))
    }
    /// The kept arrival counters now (a copy to the host, so a host
    /// synchronisation), or None before any kernel needed them.
    pub(crate) fn kept_arrivals(&self) -> Result<Option<Vec<i64>>> {
        match self.arrivals.get() {
            None => Ok(None),
            Some(s) => match s.to_cpu()? {
                crate::backend::cpu::CpuStorage::I64(v) => Ok(Some(v)),
                other => Err(Error::invalid("kept_arrivals", format!("expected I64 counters, found {:?}", other.dtype()))),
            },
        }
    }

    /// cuBLASLt's workspace of this device: `bytes` (the first caller's
    /// size; [`super::blaslt::workspace_bytes`]) obtained from the driver once
    /// and kept for the device's life; (0, 0) when the size is 0.
    pub(crate) fn lt_workspace(&self, bytes: usize) -> Result<(DevPtr, usize)> {
        let w = self.lt_workspace.get_or_init(|| {
            if bytes == 0 {
                return Ok((0, 0));
            }
            match self.seam.malloc(bytes) {
                Ok(Some(p)) => Ok((p, bytes)),
                Ok(None) => Err(format!("out of device memory for cuBLASLt's workspace of {bytes} bytes (set ASRFORGE_CUBLASLT_WORKSPACE_MIB lower)")),
                Err(e) => Err(e.to_string()),
            }
        });
        w.clone().map_err(|msg| Error::Cuda { kernel: "cublasLt workspace".into(), msg })
    }

    /// Starts recording every launch of this device for the step profile
    /// (dropping what an earlier profile left).
    pub fn start_profile(&self) {
        self.seam.clear_recorded();
        profile::set_on(true);
    }
    /// Stops recording and returns the per-family profile of what ran since
    /// [`CudaDevice::start_profile`] (waiting for the recorded work on a GPU).
    pub fn stop_profile(&self) -> Result<KernelProfile> {
        profile::set_on(false);
        let recs = self.seam.take_recorded()?;
        let name = self.name().unwrap_or_else(|_| format!("cuda:{}", self.ordinal));
        Ok(KernelProfile::from_records(format!("cuda:{} ({name})", self.ordinal), self.is_emulated(), &recs))
    }

    /// Launches kernel `id` of [`kernels::KERNEL_TABLE`] on the compute
    /// stream: what every generated launch function of [`kernels`] calls.
    /// No allocation, formatting, lock or environment read unless the
    /// profile is on: the function comes from this device's table (resolved
    /// at the kernel's first launch), `ASRFORGE_CUDA_SYNC=1` (every launch
    /// synchronised, so an asynchronous fault names its kernel) was read once.
    /// `moved`: the bytes a by-value table's buffers read and write, for
    /// `bench-train --profile`.
    ///
    /// # Safety
    /// `params` has one pointer per C parameter of the kernel, each to a live
    /// value of that parameter's type and size; `bufs` are the buffers its
    /// pointer parameters address, in order, all of this device.
    pub(crate) unsafe fn launch_kernel(
        &self,
        id: usize,
        cfg: LaunchConfig,
        params: &mut [*mut c_void],
        bufs: &[&CudaStorage],
        moved: Option<(u64, u64)>,
    ) -> Result<()> {
        let k = &kernels::KERNEL_TABLE[id];
        let f = match self.functions[id].get() {
            Some(f) => *f,
            None => {
                let f = self.seam.driver().function(k.module, k.name)?;
                *self.functions[id].get_or_init(|| f)
            }
        };
        let mut ptrs = [0 as DevPtr; 16];
        for (p, b) in ptrs.iter_mut().zip(bufs) {
            *p = b.ptr();
        }
        let record = profile::on().then(|| {
            let mut r = kernel_record(k, bufs);
            if let Some((read, written)) = moved {
                r.bytes_read += read;
                r.bytes_written += written;
            }
            r
        });
        // SAFETY: `f` was resolved by this device's driver for kernel `k`;
        // the caller guarantees `params` (one pointer per parameter, each to a
        // live value of its size; the driver copies the values at launch).
        // Device pointers come from live `CudaStorage`s of this device whose
        // buffers stay valid until the stream has run the kernel (freed
        // blocks return to the pool and are only reused by work ordered
        // after it on this stream).
        unsafe { self.seam.launch(f, k.path, cfg, params, &ptrs[..bufs.len().min(16)], COMPUTE, record) }?;
        if sync_enabled() {
            self.seam.synchronize(COMPUTE).map_err(|e| Error::Cuda { kernel: k.path.to_string(), msg: format!("kernel failed: {e}") })?;
        }
        Ok(())
    }
}

/// A point in a stream's work; freed on drop.
pub struct DeviceEvent {
    dev: Arc<CudaDevice>,
    ev: Option<Event>,
}

impl DeviceEvent {
    /// Makes `stream` wait on the device for the recorded work (no host wait).
    pub fn wait_on(&self, stream: usize) -> Result<()> {
        match &self.ev {
            Some(e) => self.dev.seam.driver().stream_wait_event(Stream(stream), e),
            None => Ok(()),
        }
    }
    /// Waits on the host for the recorded work (a host synchronisation in the counters).
    pub fn synchronize(&self) -> Result<()> {
        match &self.ev {
            Some(e) => self.dev.seam.event_synchronize(e),
            None => Ok(()),
        }
    }
    /// Whether the recorded work has finished (no wait, not a host synchronisation).
    pub fn query(&self) -> Result<bool> {
        match &self.ev {
            Some(e) => self.dev.seam.driver().event_query(e),
            None => Ok(true),
        }
    }
    /// Waits on the host only if the recorded work has not finished yet
    /// (counted as a host synchronisation only then).
    pub fn wait_if_pending(&self) -> Result<()> {
        match &self.ev {
            Some(e) => self.dev.seam.event_wait_if_pending(e),
            None => Ok(()),
        }
    }
}

impl Drop for DeviceEvent {
    fn drop(&mut self) {
        if let Some(e) = self.ev.take() {
            self.dev.seam.driver().destroy_event(e);
        }
    }
}

/// Whether fresh allocations are poisoned (`ASRFORGE_CUDA_POISON=1`, read once).
pub(crate) fn poison_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("ASRFORGE_CUDA_POISON").is_some_and(|v| v == "1"))
}

/// Whether every launch is synchronised (`ASRFORGE_CUDA_SYNC=1`, read once).
fn sync_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("ASRFORGE_CUDA_SYNC").is_some_and(|v| v == "1"))
}

/// A kernel launch as the step profile counts it: the bytes of the buffers
/// passed for `const T*` parameters are read, those for `T*` written.
fn kernel_record(k: &kernels::Kernel, bufs: &[&CudaStorage]) -> LaunchRecord {
    let (mut read, mut written) = (0u64, 0u64);
    for (j, b) in bufs.iter().enumerate() {
        let bytes = b.size_in_bytes() as u64;
        if k.outs >> j & 1 == 1 {
            written += bytes;
        } else {
            read += bytes;
        }
    }
    LaunchRecord { family: profile::family_of(k.module, k.name), bytes_read: read, bytes_written: written, flops: 0, gemm_dtype: None, kinds_known: true }
}
