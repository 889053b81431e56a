//! `CudaDevice`: one per GPU per process. It holds the primary context, the
//! compute stream every kernel, copy and cuBLAS call is ordered on, the
//! caching allocator, and the kernel modules, loaded lazily from the embedded
//! fatbins by file stem with their functions cached by name.

use super::alloc::Pool;
use super::launch::{Arg, LaunchConfig};
use super::{kernels, CudaStorage};
use crate::error::{Error, Result};
use crate::tensor::DType;
use cudarc::driver::{result, sys, CudaContext, CudaStream, DriverError};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};

/// A loaded module or function handle. Driver handles are plain pointers
/// that any thread may use once the context is bound to it.
#[derive(Clone, Copy)]
struct Handle<T>(T);
// SAFETY: CUmodule and CUfunction are opaque driver handles, valid in every
// thread of the process; every use binds the owning context first.
unsafe impl<T> Send for Handle<T> {}
// SAFETY: as above; the driver's module/function calls are thread-safe.
unsafe impl<T> Sync for Handle<T> {}

/// One GPU: context, compute stream, allocator, modules.
pub struct CudaDevice {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    pub(crate) pool: Mutex<Pool>,
    modules: Mutex<HashMap<&'static str, Handle<sys::CUmodule>>>,
    functions: Mutex<HashMap<String, Handle<sys::CUfunction>>>,
    pub(crate) blas: OnceLock<std::result::Result<super::blas::Blas, String>>,
    pub(crate) blaslt: OnceLock<std::result::Result<super::blaslt::Lt, String>>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaDevice(cuda:{})", self.ordinal)
    }
}

/// A driver error as text: its name and description.
pub(crate) fn driver_msg(e: &DriverError) -> String {
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
    let desc = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    format!("{name}: {desc}")
}

/// Maps a failed driver call to [`Error::Cuda`] naming the call.
pub(crate) fn check<T>(what: &str, r: std::result::Result<T, DriverError>) -> Result<T> {
    r.map_err(|e| Error::Cuda { kernel: what.to_string(), msg: driver_msg(&e) })
}

impl CudaDevice {
    /// Opens GPU `ordinal` (the caller has checked that the driver is present).
    pub(crate) fn open(ordinal: usize) -> Result<Arc<CudaDevice>> {
        let ctx = check("cuCtx (primary context)", CudaContext::new(ordinal))?;
        let stream = check("cuStreamCreate", ctx.new_stream())?;
        Ok(Arc::new(CudaDevice {
            ordinal,
            ctx,
            stream,
            pool: Mutex::new(Pool::default()),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            blas: OnceLock::new(),
            blaslt: OnceLock::new(),
        }))
    }
    /// The GPU's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
    /// The cudarc context.
    pub(crate) fn ctx(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    /// The compute stream.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    /// The raw compute stream.
    pub(crate) fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }
    /// Makes this device's context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<()> {
        check("cuCtxSetCurrent", self.ctx.bind_to_thread())
    }
    /// Waits until every queued kernel and copy has finished; reports an
    /// asynchronous kernel fault.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        check("cuStreamSynchronize", self.stream.synchronize())
    }
    /// The GPU's name.
    pub fn name(&self) -> Result<String> {
        check("cuDeviceGetName", self.ctx.name())
    }
    /// The compute capability (major, minor).
    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        check("cuDeviceGetAttribute", self.ctx.compute_capability())
    }
    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        check("cuMemGetInfo", self.ctx.mem_get_info())
    }

    /// Uninitialised storage for `len` elements of `dtype` from the caching
    /// allocator (all bytes 0xFF, a NaN in every float type, when
    /// `ASRFORGE_CUDA_POISON=1`).
    pub fn alloc(self: &Arc<Self>, dtype: DType, len: usize) -> Result<CudaStorage> {
        let bytes = len
            .checked_mul(dtype.size_in_bytes())
            .ok_or_else(|| Error::invalid("cuda alloc", format!("{len} elements of {dtype:?} overflow the address space")))?;
        let block = self.alloc_block(bytes)?;
        let s = CudaStorage::new(block, dtype, len, self.clone());
        if poison_enabled() {
            s.memset(0xFF)?;
        }
        Ok(s)
    }
    /// Zero-filled storage.
    pub fn zeros(self: &Arc<Self>, dtype: DType, len: usize) -> Result<CudaStorage> {
        let s = self.alloc(dtype, len)?;
        s.memset(0)?;
        Ok(s)
    }

    fn module(&self, stem: &str) -> Result<sys::CUmodule> {
        let mut mods = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = mods.get(stem) {
            return Ok(m.0);
        }
        let (name, image) = kernels::KERNELS.iter().find(|(s, _)| *s == stem).copied().ok_or_else(|| Error::Cuda {
            kernel: format!("{stem}/*"),
            msg: format!(
                "no kernel module {stem:?} is embedded in this build (embedded: [{}])",
                kernels::KERNELS.iter().map(|(s, _)| *s).collect::<Vec<_>>().join(", ")
            ),
        })?;
        // The driver reads the fatbin header as 8-byte words: copy it into an
        // aligned buffer rather than trusting include_bytes!'s alignment.
        let mut aligned = vec![0u64; image.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut aligned)[..image.len()].copy_from_slice(image);
        self.bind()?;
        // SAFETY: `aligned` holds a complete fatbin written by nvcc (build.rs),
        // alive for the duration of the call; the driver copies what it needs.
        let m = check(&format!("cuModuleLoadData({stem})"), unsafe { result::module::load_data(aligned.as_ptr() as *const c_void) })?;
        mods.insert(name, Handle(m));
        Ok(m)
    }

    fn function(&self, module: &str, kernel: &str) -> Result<sys::CUfunction> {
        let key = format!("{module}/{kernel}");
        if let Some(f) = self.functions.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(f.0);
        }
        let m = self.module(module)?;
        let cname = CString::new(kernel).map_err(|_| Error::Cuda { kernel: key.clone(), msg: "kernel name contains a NUL byte".into() })?;
        // SAFETY: `m` is a module loaded above and never unloaded while the
        // device lives.
        let f = unsafe { result::module::get_function(m, cname) }
            .map_err(|e| Error::Cuda { kernel: key.clone(), msg: format!("no such kernel in module {module:?} ({})", driver_msg(&e)) })?;
        self.functions.lock().unwrap_or_else(|e| e.into_inner()).insert(key, Handle(f));
        Ok(f)
    }

    /// Launches `module/kernel` on the compute stream. The arguments must
    /// match the kernel's C signature in order and type; buffers passed as
    /// `Arg::Ptr` must belong to this device. A failed launch is an
    /// [`Error::Cuda`] naming the kernel; with `ASRFORGE_CUDA_SYNC=1` every
    /// launch is also synchronised so an asynchronous fault names its kernel.
    pub fn launch(&self, module: &str, kernel: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
        let name = format!("{module}/{kernel}");
        let f = self.function(module, kernel)?;
        let mut slots = vec![[0u8; 8]; args.len()];
        let mut word_ptrs: Vec<*mut c_void> = Vec::with_capacity(args.len());
        for (slot, a) in slots.iter_mut().zip(args) {
            match a {
                Arg::Ptr(s) => {
                    if s.ordinal() != self.ordinal {
                        return Err(Error::Cuda { kernel: name, msg: format!("argument on cuda:{} passed to a launch on cuda:{}", s.ordinal(), self.ordinal) });
                    }
                    slot.copy_from_slice(&s.ptr().to_ne_bytes());
                }
                Arg::U32(v) => slot[..4].copy_from_slice(&v.to_ne_bytes()),
                Arg::I32(v) => slot[..4].copy_from_slice(&v.to_ne_bytes()),
                Arg::U64(v) => slot.copy_from_slice(&v.to_ne_bytes()),
                Arg::I64(v) => slot.copy_from_slice(&v.to_ne_bytes()),
                Arg::F32(v) => slot[..4].copy_from_slice(&v.to_ne_bytes()),
                Arg::F64(v) => slot.copy_from_slice(&v.to_ne_bytes()),
                Arg::Words(_) => {}
            }
        }
        for (slot, a) in slots.iter_mut().zip(args) {
            word_ptrs.push(match a {
                Arg::Words(w) => w.as_ptr() as *mut c_void,
                _ => slot.as_mut_ptr() as *mut c_void,
            });
        }
        self.bind()?;
        // SAFETY: `f` is a function of a loaded module; `word_ptrs` has one
        // pointer per kernel parameter, each to a live value of the
        // parameter's size (`slots` and the caller's `Words` outlive the
        // call; the driver copies the values at launch). Device pointers come
        // from live `CudaStorage`s of this device whose buffers stay valid
        // until the stream has run the kernel (freed blocks return to the
        // pool and are only reused by work ordered after it on this stream).
        let r = unsafe { result::launch_kernel(f, cfg.grid, cfg.block, cfg.shared_bytes, self.cu_stream(), &mut word_ptrs) };
        r.map_err(|e| Error::Cuda { kernel: name.clone(), msg: format!("launch {cfg:?} failed: {}", driver_msg(&e)) })?;
        if std::env::var_os("ASRFORGE_CUDA_SYNC").is_some_and(|v| v == "1") {
            self.stream.synchronize().map_err(|e| Error::Cuda { kernel: name, msg: format!("kernel failed: {}", driver_msg(&e)) })?;
        }
        Ok(())
    }
}

/// Whether fresh allocations are poisoned (`ASRFORGE_CUDA_POISON=1`).
pub(crate) fn poison_enabled() -> bool {
    std::env::var_os("ASRFORGE_CUDA_POISON").is_some_and(|v| v == "1")
}
