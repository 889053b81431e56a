//! The real driver: the CUDA driver API, cuBLAS and cuBLASLt through
//! cudarc, on one GPU's primary context. Modules are loaded lazily from the
//! fatbins build.rs embedded, by file stem.

use super::{DevPtr, Driver, DriverKind, Epilogue, Event, Func, Gemm, LaunchConfig, LtKey, LtMatmul, LtPlan, Stream, COMPUTE};
use crate::backend::cuda::kernels;
use crate::error::{Error, Result};
use crate::tensor::DType;
use cudarc::cublas::{result as cr, sys as cs, CudaBlas};
use cudarc::cublaslt::{result as lr, sys as ls};
use cudarc::driver::{result, sys, CudaContext, CudaStream, DriverError};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};

/// A driver error as text: its name and description.
pub(crate) fn driver_msg(e: &DriverError) -> String {
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
    let desc = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    format!("{name}: {desc}")
}

/// Maps a failed driver call to [`Error::Cuda`] naming the call.
fn check<T>(what: &str, r: std::result::Result<T, DriverError>) -> Result<T> {
    r.map_err(|e| Error::Cuda { kernel: what.to_string(), msg: driver_msg(&e) })
}

/// A driver handle (module, cuBLASLt handle) shared between threads.
#[derive(Clone, Copy)]
struct Handle<T>(T);
// SAFETY: CUmodule and cublasLtHandle_t are opaque handles valid in every
// thread of the process; every use binds the owning context first.
unsafe impl<T> Send for Handle<T> {}
// SAFETY: as above; the driver's module calls and cublasLtMatmul are thread-safe.
unsafe impl<T> Sync for Handle<T> {}

/// The CUDA driver on GPU `ordinal`.
pub(crate) struct RealDriver {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    others: Mutex<Vec<Arc<CudaStream>>>,
    modules: Mutex<HashMap<String, Handle<sys::CUmodule>>>,
    blas: OnceLock<std::result::Result<CudaBlas, String>>,
    lt: OnceLock<std::result::Result<Handle<ls::cublasLtHandle_t>, String>>,
    /// The cuBLASLt plans made, by handle; locked around each matmul that
    /// uses one (its bias pointer is set on the shared descriptor).
    lt_plans: Mutex<Vec<RealPlan>>,
}

/// One cuBLASLt plan: the descriptor, the three layouts and the algorithm
/// the heuristic chose for them (the preference is only needed for the
/// heuristic and is destroyed after it).
struct RealPlan {
    descs: Descs,
    a: ls::cublasLtMatrixLayout_t,
    b: ls::cublasLtMatrixLayout_t,
    d: ls::cublasLtMatrixLayout_t,
    algo: ls::cublasLtMatmulAlgo_t,
}

// SAFETY: the handles are opaque cuBLASLt objects usable from any thread;
// they are only used under the plans' mutex.
unsafe impl Send for RealPlan {}

impl RealDriver {
    /// Opens GPU `ordinal` (the caller has checked that the driver is present).
    pub(crate) fn new(ordinal: usize) -> Result<RealDriver> {
        let ctx = check("cuCtx (primary context)", CudaContext::new(ordinal))?;
        let compute = check("cuStreamCreate", ctx.new_stream())?;
        Ok(RealDriver {
            ordinal,
            ctx,
            compute,
            others: Mutex::new(Vec::new()),
            modules: Mutex::new(HashMap::new()),
            blas: OnceLock::new(),
            lt: OnceLock::new(),
            lt_plans: Mutex::new(Vec::new()),
        })
    }
    fn stream(&self, s: Stream) -> Result<Arc<CudaStream>> {
        if s == COMPUTE {
            return Ok(self.compute.clone());
        }
        self.others
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(s.0 - 1)
            .cloned()
            .ok_or_else(|| Error::Cuda { kernel: "stream".into(), msg: format!("no stream {} on cuda:{}", s.0, self.ordinal) })
    }
    fn cu(&self, s: Stream) -> Result<sys::CUstream> {
        if s == COMPUTE {
            return Ok(self.compute.cu_stream());
        }
        Ok(self.stream(s)?.cu_stream())
    }
    fn module(&self, stem: &str) -> Result<sys::CUmodule> {
        let mut mods = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = mods.get(stem) {
            return Ok(m.0);
        }
        let image = kernels::fatbin(stem).ok_or_else(|| Error::Cuda {
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
        mods.insert(stem.to_string(), Handle(m));
        Ok(m)
    }
    fn blas(&self) -> Result<cs::cublasHandle_t> {
        let b = self.blas.get_or_init(|| {
            // SAFETY: only tries to dlopen libcublas; cudarc panics on first
            // use without it, so this must come first.
            if !unsafe { cs::is_culib_present() } {
                return Err("the cuBLAS library (libcublas.so) was not found on the loader path".to_string());
            }
            self.bind().map_err(|e| e.to_string())?;
            CudaBlas::new(self.compute.clone()).map_err(|e| format!("cublasCreate failed: {:?}", e.0))
        });
        b.as_ref().map(|b| *b.handle()).map_err(|m| Error::Cuda { kernel: "cublas".into(), msg: m.clone() })
    }
    fn lt(&self) -> Result<ls::cublasLtHandle_t> {
        let h = self.lt.get_or_init(|| {
            // SAFETY: only tries to dlopen libcublasLt (cudarc panics without it).
            if !unsafe { ls::is_culib_present() } {
                return Err("the cuBLASLt library (libcublasLt.so) was not found on the loader path".to_string());
            }
            self.bind().map_err(|e| e.to_string())?;
            lr::create_handle().map(Handle).map_err(|e| format!("cublasLtCreate failed: {:?}", e.0))
        });
        h.as_ref().map(|l| l.0).map_err(|m| Error::Cuda { kernel: "cublasLt".into(), msg: m.clone() })
    }
}

fn blas_err(what: &str, e: cr::CublasError) -> Error {
    Error::Cuda { kernel: format!("cublas/{what}"), msg: format!("{:?}", e.0) }
}

fn lt_err(what: &str, e: lr::CublasError) -> Error {
    Error::Cuda { kernel: format!("cublasLt/{what}"), msg: format!("{:?}", e.0) }
}

fn side_stream_blas(s: Stream) -> Result<()> {
    if s == COMPUTE {
        Ok(())
    } else {
        Err(Error::Cuda { kernel: "cublas".into(), msg: format!("matrix products run on the compute stream only (asked for stream {})", s.0) })
    }
}

/// Descriptors destroyed on every exit path.
struct Descs {
    desc: Option<ls::cublasLtMatmulDesc_t>,
    layouts: Vec<ls::cublasLtMatrixLayout_t>,
    pref: Option<ls::cublasLtMatmulPreference_t>,
}

impl Drop for Descs {
    fn drop(&mut self) {
        // SAFETY: each handle was created by cuBLASLt in `lt_matmul` and is destroyed once.
        unsafe {
            for l in self.layouts.drain(..) {
                let _ = lr::destroy_matrix_layout(l);
            }
            if let Some(d) = self.desc.take() {
                let _ = lr::destroy_matmul_desc(d);
            }
            if let Some(p) = self.pref.take() {
                let _ = lr::destroy_matmul_pref(p);
            }
        }
    }
}

impl Driver for RealDriver {
    fn kind(&self) -> DriverKind {
        DriverKind::Gpu
    }
    fn name(&self) -> Result<String> {
        check("cuDeviceGetName", self.ctx.name())
    }
    fn compute_capability(&self) -> Result<(i32, i32)> {
        check("cuDeviceGetAttribute", self.ctx.compute_capability())
    }
    fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        check("cuMemGetInfo", self.ctx.mem_get_info())
    }
    fn bind(&self) -> Result<()> {
        check("cuCtxSetCurrent", self.ctx.bind_to_thread())
    }
    fn raw_stream(&self, s: Stream) -> Result<*mut c_void> {
        Ok(self.cu(s)? as *mut c_void)
    }
    fn new_stream(&self) -> Result<Stream> {
        let s = check("cuStreamCreate", self.ctx.new_stream())?;
        let mut o = self.others.lock().unwrap_or_else(|e| e.into_inner());
        o.push(s);
        Ok(Stream(o.len()))
    }
    fn streams(&self) -> usize {
        1 + self.others.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
    fn malloc(&self, bytes: usize) -> Result<Option<DevPtr>> {
        self.bind()?;
        // SAFETY: the context is current; cuMemAlloc returns a fresh buffer
        // of `bytes` bytes or an error, touching nothing else.
        match unsafe { result::malloc_sync(bytes) } {
            Ok(p) => Ok(Some(p)),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Ok(None),
            Err(e) => Err(Error::Cuda { kernel: format!("cuMemAlloc({bytes} bytes)"), msg: driver_msg(&e) }),
        }
    }
    unsafe fn free(&self, p: DevPtr, _bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller guarantees `p` came from cuMemAlloc on this
        // context and no queued work uses it.
        check("cuMemFree", unsafe { result::free_sync(p) })
    }
    fn malloc_host(&self, bytes: usize) -> Result<*mut u8> {
        self.bind()?;
        // SAFETY: the context is current; cuMemHostAlloc returns a fresh
        // page-locked allocation of `bytes` bytes or an error.
        Ok(check("cuMemHostAlloc", unsafe { result::malloc_host(bytes, 0) })? as *mut u8)
    }
    unsafe fn free_host(&self, p: *mut u8, _bytes: usize) -> Result<()> {
        // SAFETY: the caller guarantees `p` came from cuMemHostAlloc and no copy reads it.
        check("cuMemFreeHost", unsafe { result::free_host(p as *mut c_void) })
    }
    unsafe fn memset_d8(&self, p: DevPtr, byte: u8, n: usize, s: Stream) -> Result<()> {
        let st = self.cu(s)?;
        self.bind()?;
        // SAFETY: the caller guarantees `p` addresses `n` live bytes in stream order.
        check("cuMemsetD8Async", unsafe { result::memset_d8_async(p, byte, n, st) })
    }
    unsafe fn htod(&self, dst: DevPtr, src: &[u8], s: Stream) -> Result<()> {
        let st = self.cu(s)?;
        self.bind()?;
        // SAFETY: the caller guarantees the destination's size and the source's lifetime.
        check("cuMemcpyHtoDAsync", unsafe { result::memcpy_htod_async(dst, src, st) })
    }
    unsafe fn dtoh(&self, dst: &mut [u8], src: DevPtr, s: Stream) -> Result<()> {
        let st = self.cu(s)?;
        self.bind()?;
        // SAFETY: the caller guarantees the source's size and that `dst` waits for the copy.
        check("cuMemcpyDtoHAsync", unsafe { result::memcpy_dtoh_async(dst, src, st) })
    }
    unsafe fn dtod(&self, dst: DevPtr, src: DevPtr, n: usize, s: Stream) -> Result<()> {
        let st = self.cu(s)?;
        self.bind()?;
        // SAFETY: the caller guarantees both buffers hold `n` live bytes in stream order.
        check("cuMemcpyDtoDAsync", unsafe { result::memcpy_dtod_async(dst, src, n, st) })
    }
    fn function(&self, module: &str, kernel: &str) -> Result<Func> {
        let key = format!("{module}/{kernel}");
        let m = self.module(module)?;
        let cname = CString::new(kernel).map_err(|_| Error::Cuda { kernel: key.clone(), msg: "kernel name contains a NUL byte".into() })?;
        // SAFETY: `m` is a module loaded above and never unloaded while the
        // driver lives.
        let f = unsafe { result::module::get_function(m, cname) }
            .map_err(|e| Error::Cuda { kernel: key, msg: format!("no such kernel in module {module:?} ({})", driver_msg(&e)) })?;
        Ok(Func(f as usize))
    }
    unsafe fn launch(&self, f: Func, name: &str, cfg: LaunchConfig, params: &mut [*mut c_void], _buffers: &[DevPtr], s: Stream) -> Result<()> {
        let st = self.cu(s)?;
        self.bind()?;
        // SAFETY: `f` came from `function` of this driver (a CUfunction of a
        // loaded module); the caller guarantees the parameters.
        let r = unsafe { result::launch_kernel(f.0 as sys::CUfunction, cfg.grid, cfg.block, cfg.shared_bytes, st, params) };
        r.map_err(|e| Error::Cuda { kernel: name.to_string(), msg: format!("launch {cfg:?} failed: {}", driver_msg(&e)) })
    }
    fn synchronize(&self, s: Stream) -> Result<()> {
        self.bind()?;
        check("cuStreamSynchronize", self.stream(s)?.synchronize())
    }
    fn record_event(&self, s: Stream) -> Result<Event> {
        let st = self.cu(s)?;
        self.bind()?;
        let e = check("cuEventCreate", result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
        // SAFETY: `e` was just created on this context and `st` is a live stream of it.
        check("cuEventRecord", unsafe { result::event::record(e, st) })?;
        Ok(Event(e as usize))
    }
    fn stream_wait_event(&self, s: Stream, e: &Event) -> Result<()> {
        let st = self.cu(s)?;
        self.bind()?;
        // SAFETY: `e` is a live event of this context (owned by the caller's `Event`).
        check("cuStreamWaitEvent", unsafe { result::stream::wait_event(st, e.0 as sys::CUevent, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) })
    }
    fn event_synchronize(&self, e: &Event) -> Result<()> {
        self.bind()?;
        // SAFETY: as above.
        check("cuEventSynchronize", unsafe { result::event::synchronize(e.0 as sys::CUevent) })
    }
    fn event_query(&self, e: &Event) -> Result<bool> {
        self.bind()?;
        // SAFETY: `e` is a live event of this context (owned by the caller's `Event`).
        match unsafe { result::event::query(e.0 as sys::CUevent) } {
            Ok(()) => Ok(true),
            Err(err) if err.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(err) => check("cuEventQuery", Err(err)),
        }
    }
    fn destroy_event(&self, e: Event) {
        let _ = self.bind();
        // SAFETY: `e` is a live event of this context, destroyed once (consumed here).
        let _ = unsafe { result::event::destroy(e.0 as sys::CUevent) };
    }
    fn timing_event(&self, s: Stream) -> Result<Option<Event>> {
        let st = self.cu(s)?;
        self.bind()?;
        let e = check("cuEventCreate", result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        // SAFETY: `e` was just created on this context and `st` is a live stream of it.
        if let Err(err) = unsafe { result::event::record(e, st) } {
            // SAFETY: `e` is live and not recorded anywhere; destroyed once.
            let _ = unsafe { result::event::destroy(e) };
            return Err(Error::Cuda { kernel: "cuEventRecord".into(), msg: driver_msg(&err) });
        }
        Ok(Some(Event(e as usize)))
    }
    fn elapsed_ms(&self, start: &Event, end: &Event) -> Result<f32> {
        self.bind()?;
        // SAFETY: both are live timing events of this context, recorded and finished (the caller waited).
        check("cuEventElapsedTime", unsafe { result::event::elapsed(start.0 as sys::CUevent, end.0 as sys::CUevent) })
    }
    unsafe fn gemm(&self, g: &Gemm, s: Stream) -> Result<()> {
        side_stream_blas(s)?;
        let h = self.blas()?;
        let op = |t: bool| if t { cs::cublasOperation_t::CUBLAS_OP_T } else { cs::cublasOperation_t::CUBLAS_OP_N };
        self.bind()?;
        if g.dtype == DType::F64 {
            let (alpha, beta) = (g.alpha, g.beta);
            // SAFETY: the caller guarantees the buffers; the handle runs on
            // the compute stream; alpha/beta are host scalars read during the call.
            return unsafe {
                cr::dgemm_strided_batched(
                    h,
                    op(g.trans_a),
                    op(g.trans_b),
                    g.m,
                    g.n,
                    g.k,
                    &alpha,
                    g.a as *const f64,
                    g.lda,
                    g.stride_a,
                    g.b as *const f64,
                    g.ldb,
                    g.stride_b,
                    &beta,
                    g.c as *mut f64,
                    g.ldc,
                    g.stride_c,
                    g.batch,
                )
            }
            .map_err(|e| blas_err("dgemm_strided_batched", e));
        }
        let (ty, compute) = match g.dtype {
            DType::F32 if g.tf32 => (cs::cudaDataType::CUDA_R_32F, cs::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32),
            DType::F32 => (cs::cudaDataType::CUDA_R_32F, cs::cublasComputeType_t::CUBLAS_COMPUTE_32F),
            DType::F16 => (cs::cudaDataType::CUDA_R_16F, cs::cublasComputeType_t::CUBLAS_COMPUTE_32F),
            DType::BF16 => (cs::cudaDataType::CUDA_R_16BF, cs::cublasComputeType_t::CUBLAS_COMPUTE_32F),
            other => return Err(Error::UnsupportedDType { op: "matmul", dtype: other, supported: "f32, f64, f16, bf16" }),
        };
        let (alpha, beta) = (g.alpha as f32, g.beta as f32);
        // SAFETY: as for the f64 call; with FP32 compute alpha and beta are
        // f32 host scalars.
        unsafe {
            cr::gemm_strided_batched_ex(
                h,
                op(g.trans_a),
                op(g.trans_b),
                g.m,
                g.n,
                g.k,
                &alpha as *const f32 as *const c_void,
                g.a as *const c_void,
                ty,
                g.lda,
                g.stride_a,
                g.b as *const c_void,
                ty,
                g.ldb,
                g.stride_b,
                &beta as *const f32 as *const c_void,
                g.c as *mut c_void,
                ty,
                g.ldc,
                g.stride_c,
                g.batch,
                compute,
                cs::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| blas_err("gemm_strided_batched_ex", e))
    }
    fn lt_plan(&self, key: &LtKey) -> Result<LtPlan> {
        let (ty, compute, scale) = match key.dtype {
            DType::F64 => (ls::cudaDataType::CUDA_R_64F, ls::cublasComputeType_t::CUBLAS_COMPUTE_64F, ls::cudaDataType::CUDA_R_64F),
            DType::F32 if key.tf32 => (ls::cudaDataType::CUDA_R_32F, ls::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32, ls::cudaDataType::CUDA_R_32F),
            DType::F32 => (ls::cudaDataType::CUDA_R_32F, ls::cublasComputeType_t::CUBLAS_COMPUTE_32F, ls::cudaDataType::CUDA_R_32F),
            DType::F16 => (ls::cudaDataType::CUDA_R_16F, ls::cublasComputeType_t::CUBLAS_COMPUTE_32F, ls::cudaDataType::CUDA_R_32F),
            DType::BF16 => (ls::cudaDataType::CUDA_R_16BF, ls::cublasComputeType_t::CUBLAS_COMPUTE_32F, ls::cudaDataType::CUDA_R_32F),
            other => return Err(Error::UnsupportedDType { op: "linear", dtype: other, supported: "f32, f64, f16, bf16" }),
        };
        let h = self.lt()?;
        self.bind()?;
        let mut d = Descs { desc: None, layouts: Vec::new(), pref: None };
        let desc = lr::create_matmul_desc(compute, scale).map_err(|e| lt_err("MatmulDescCreate", e))?;
        d.desc = Some(desc);
        let op = |t: bool| if t { 1i32 } else { 0i32 }; // CUBLAS_OP_T, CUBLAS_OP_N
        let (op_a, op_b) = (op(key.trans_a), op(key.trans_b));
        use ls::cublasLtMatmulDescAttributes_t as A;
        // SAFETY: each attribute buffer is a live local of the size passed.
        unsafe {
            lr::set_matmul_desc_attribute(desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &op_a as *const i32 as *const c_void, 4).map_err(|e| lt_err("TRANSA", e))?;
            lr::set_matmul_desc_attribute(desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &op_b as *const i32 as *const c_void, 4).map_err(|e| lt_err("TRANSB", e))?;
        }
        let epi = match key.epilogue {
            Epilogue::Plain => None,
            Epilogue::Bias => Some(ls::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS),
            Epilogue::BgradB => Some(ls::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BGRADB),
        };
        if let Some(epi) = epi {
            let epi = epi as u32;
            // SAFETY: as above.
            unsafe {
                lr::set_matmul_desc_attribute(desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE, &epi as *const u32 as *const c_void, 4)
                    .map_err(|e| lt_err("EPILOGUE", e))?;
            }
        }
        let mut layout = |l: super::Layout, what: &str| -> Result<ls::cublasLtMatrixLayout_t> {
            let h = lr::create_matrix_layout(ty, l.rows, l.cols, l.ld).map_err(|e| lt_err(what, e))?;
            d.layouts.push(h);
            Ok(h)
        };
        let a_l = layout(key.a_layout, "layout A")?;
        let b_l = layout(key.b_layout, "layout B")?;
        let d_l = layout(key.d_layout, "layout D")?;
        let pref = lr::create_matmul_pref().map_err(|e| lt_err("PreferenceCreate", e))?;
        d.pref = Some(pref);
        let ws: usize = key.workspace;
        // SAFETY: the buffer is a live usize; the handles were created above.
        let heur = unsafe {
            lr::set_matmul_pref_attribute(
                pref,
                ls::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const usize as *const c_void,
                std::mem::size_of::<usize>(),
            )
            .map_err(|e| lt_err("MAX_WORKSPACE_BYTES", e))?;
            lr::get_matmul_algo_heuristic(h, desc, a_l, b_l, d_l, d_l, pref).map_err(|e| lt_err("AlgoGetHeuristic", e))?
        };
        if let Some(p) = d.pref.take() {
            // SAFETY: created above, used only by the heuristic, destroyed once.
            let _ = unsafe { lr::destroy_matmul_pref(p) };
        }
        let mut plans = self.lt_plans.lock().unwrap_or_else(|e| e.into_inner());
        plans.push(RealPlan { descs: d, a: a_l, b: b_l, d: d_l, algo: heur.algo });
        Ok(LtPlan(plans.len() - 1))
    }
    unsafe fn lt_matmul(&self, plan: LtPlan, g: &LtMatmul, s: Stream) -> Result<()> {
        side_stream_blas(s)?;
        let h = self.lt()?;
        self.bind()?;
        let plans = self.lt_plans.lock().unwrap_or_else(|e| e.into_inner());
        let p = plans.get(plan.0).ok_or_else(|| Error::Cuda { kernel: "cublasLt/Matmul".into(), msg: format!("no plan {}", plan.0) })?;
        let desc = p.descs.desc.ok_or_else(|| Error::Cuda { kernel: "cublasLt/Matmul".into(), msg: "a plan without a descriptor".into() })?;
        if g.key.epilogue != Epilogue::Plain {
            let bias_ptr =
                g.bias.ok_or_else(|| Error::Cuda { kernel: "cublasLt/Matmul".into(), msg: format!("the {:?} epilogue has no bias pointer", g.key.epilogue) })?
                    as *const c_void;
            // SAFETY: the attribute buffer is a live local pointer; the bias
            // buffer outlives the call in stream order (the caller's
            // guarantee); the descriptor is only used under this lock.
            unsafe {
                lr::set_matmul_desc_attribute(
                    desc,
                    ls::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    &bias_ptr as *const *const c_void as *const c_void,
                    std::mem::size_of::<*const c_void>(),
                )
                .map_err(|e| lt_err("BIAS_POINTER", e))?;
            }
        }
        let (a32, b32) = (1.0f32, 0.0f32);
        let (a64, b64) = (1.0f64, 0.0f64);
        let (alpha, beta) = if g.key.dtype == DType::F64 {
            (&a64 as *const f64 as *const c_void, &b64 as *const f64 as *const c_void)
        } else {
            (&a32 as *const f32 as *const c_void, &b32 as *const f32 as *const c_void)
        };
        let ws = if g.key.workspace > 0 { g.workspace as *mut c_void } else { std::ptr::null_mut() };
        // SAFETY: the caller guarantees the buffers match the plan's layouts
        // (the plan was made for g.key) and the workspace holds
        // g.key.workspace bytes; C aliases D with beta = 0 (allowed);
        // alpha/beta are host scalars of the scale type; the call is
        // ordered on the compute stream.
        unsafe {
            lr::matmul(
                h,
                desc,
                alpha,
                beta,
                g.a as *const c_void,
                p.a,
                g.b as *const c_void,
                p.b,
                g.d as *const c_void,
                p.d,
                g.d as *mut c_void,
                p.d,
                &p.algo,
                ws,
                g.key.workspace,
                self.compute.cu_stream() as ls::cudaStream_t,
            )
        }
        .map_err(|e| lt_err("Matmul", e))
    }
    fn blas_version(&self) -> Result<i32> {
        let h = self.blas()?;
        let mut v = 0i32;
        // SAFETY: `h` is a live handle; cuBLAS writes one int.
        unsafe { cs::cublasGetVersion_v2(h, &mut v) }.result().map_err(|e| blas_err("cublasGetVersion", e))?;
        Ok(v)
    }
}
