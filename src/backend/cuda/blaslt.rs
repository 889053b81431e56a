//! `linear` with its bias added in cuBLASLt's epilogue: `y = x·wᵀ + bias`,
//! x (M, K), w (N, K), bias (N), y (M, N), all row-major.
//!
//! Column-major, y is Yᵀ (N×M, ld N) = W·Xᵀ: A is w's buffer seen as a K×N
//! matrix (ld K) with op T, B is x's buffer as K×M (ld K) with op N, and the
//! BIAS epilogue adds bias[i] to row i of D — one per output feature.
//! No workspace is offered, so the heuristic picks a workspace-free algorithm.

use super::blas::allow_tf32;
use super::CudaStorage;
use crate::error::{Error, Result};
use crate::tensor::DType;
use cudarc::cublaslt::{result as lr, sys as ls};
use std::ffi::c_void;

/// The per-device cuBLASLt handle.
pub(crate) struct Lt(ls::cublasLtHandle_t);
// SAFETY: a cuBLASLt handle may be used from any thread; all calls on it
// are ordered on the device's compute stream.
unsafe impl Send for Lt {}
// SAFETY: as above; cublasLtMatmul does not mutate the handle.
unsafe impl Sync for Lt {}

fn lt_err(what: &str, e: lr::CublasError) -> Error {
    Error::Cuda { kernel: format!("cublasLt/{what}"), msg: format!("{:?}", e.0) }
}

fn handle(x: &CudaStorage) -> Result<ls::cublasLtHandle_t> {
    let dev = x.device();
    let h = dev.blaslt.get_or_init(|| {
        // SAFETY: only tries to dlopen libcublasLt (cudarc panics without it).
        if !unsafe { ls::is_culib_present() } {
            return Err("the cuBLASLt library (libcublasLt.so) was not found on the loader path".to_string());
        }
        dev.bind().map_err(|e| e.to_string())?;
        lr::create_handle().map(Lt).map_err(|e| format!("cublasLtCreate failed: {:?}", e.0))
    });
    h.as_ref().map(|l| l.0).map_err(|m| Error::Cuda { kernel: "cublasLt".into(), msg: m.clone() })
}

/// Descriptors destroyed on every exit path.
struct Descs {
    desc: Option<ls::cublasLtMatmulDesc_t>,
    layouts: Vec<ls::cublasLtMatrixLayout_t>,
    pref: Option<ls::cublasLtMatmulPreference_t>,
}

impl Drop for Descs {
    fn drop(&mut self) {
        // SAFETY: each handle was created by cuBLASLt below and is destroyed once.
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

/// `x·wᵀ + bias` for x of `m` rows of `k`, w (n, k), bias (n).
pub fn linear_bias(x: &CudaStorage, w: &CudaStorage, bias: &CudaStorage, m: usize, n: usize, k: usize) -> Result<CudaStorage> {
    let dt = x.dtype();
    if w.dtype() != dt || bias.dtype() != dt {
        return Err(Error::DTypeMismatch { op: "linear", expected: dt, got: if w.dtype() != dt { w.dtype() } else { bias.dtype() } });
    }
    if x.len() != m * k || w.len() != n * k || bias.len() != n {
        return Err(Error::invalid("linear", format!("expected {} + {} + {n} elements, got {} + {} + {}", m * k, n * k, x.len(), w.len(), bias.len())));
    }
    let dev = x.device();
    let y = dev.alloc(dt, m * n)?;
    if y.is_empty() {
        return Ok(y);
    }
    let (ty, compute, scale) = match dt {
        DType::F64 => (ls::cudaDataType::CUDA_R_64F, ls::cublasComputeType_t::CUBLAS_COMPUTE_64F, ls::cudaDataType::CUDA_R_64F),
        DType::F32 if allow_tf32() => (ls::cudaDataType::CUDA_R_32F, ls::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32, ls::cudaDataType::CUDA_R_32F),
        DType::F32 => (ls::cudaDataType::CUDA_R_32F, ls::cublasComputeType_t::CUBLAS_COMPUTE_32F, ls::cudaDataType::CUDA_R_32F),
        DType::F16 => (ls::cudaDataType::CUDA_R_16F, ls::cublasComputeType_t::CUBLAS_COMPUTE_32F, ls::cudaDataType::CUDA_R_32F),
        DType::BF16 => (ls::cudaDataType::CUDA_R_16BF, ls::cublasComputeType_t::CUBLAS_COMPUTE_32F, ls::cudaDataType::CUDA_R_32F),
        other => return Err(Error::UnsupportedDType { op: "linear", dtype: other, supported: "f32, f64, f16, bf16" }),
    };
    let h = handle(x)?;
    dev.bind()?;
    let (m64, n64, k64) = (m as u64, n as u64, k as u64);
    let mut d = Descs { desc: None, layouts: Vec::new(), pref: None };
    let desc = lr::create_matmul_desc(compute, scale).map_err(|e| lt_err("MatmulDescCreate", e))?;
    d.desc = Some(desc);
    let (op_t, op_n) = (1i32, 0i32); // CUBLAS_OP_T, CUBLAS_OP_N
    let epi = ls::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS as u32;
    let bias_ptr = bias.ptr() as *const c_void;
    use ls::cublasLtMatmulDescAttributes_t as A;
    // SAFETY: each attribute buffer is a live local of the size passed; the
    // bias pointer is a device buffer of n elements that outlives the call
    // in stream order.
    unsafe {
        lr::set_matmul_desc_attribute(desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &op_t as *const i32 as *const c_void, 4).map_err(|e| lt_err("TRANSA", e))?;
        lr::set_matmul_desc_attribute(desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &op_n as *const i32 as *const c_void, 4).map_err(|e| lt_err("TRANSB", e))?;
        lr::set_matmul_desc_attribute(desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE, &epi as *const u32 as *const c_void, 4).map_err(|e| lt_err("EPILOGUE", e))?;
        lr::set_matmul_desc_attribute(
            desc,
            A::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
            &bias_ptr as *const *const c_void as *const c_void,
            std::mem::size_of::<*const c_void>(),
        )
        .map_err(|e| lt_err("BIAS_POINTER", e))?;
    }
    let a_l = lr::create_matrix_layout(ty, k64, n64, k as i64).map_err(|e| lt_err("layout A", e))?;
    d.layouts.push(a_l);
    let b_l = lr::create_matrix_layout(ty, k64, m64, k as i64).map_err(|e| lt_err("layout B", e))?;
    d.layouts.push(b_l);
    let d_l = lr::create_matrix_layout(ty, n64, m64, n as i64).map_err(|e| lt_err("layout D", e))?;
    d.layouts.push(d_l);
    let pref = lr::create_matmul_pref().map_err(|e| lt_err("PreferenceCreate", e))?;
    d.pref = Some(pref);
    let ws: usize = 0;
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
    let (a32, b32) = (1.0f32, 0.0f32);
    let (a64, b64) = (1.0f64, 0.0f64);
    let (alpha, beta) = if dt == DType::F64 {
        (&a64 as *const f64 as *const c_void, &b64 as *const f64 as *const c_void)
    } else {
        (&a32 as *const f32 as *const c_void, &b32 as *const f32 as *const c_void)
    };
    // SAFETY: w, x, y are live device buffers of n·k, m·k and m·n elements
    // matching the layouts; C aliases D with beta = 0 (allowed); alpha/beta
    // are host scalars of the scale type; no workspace is used; the call is
    // ordered on the compute stream, which keeps the buffers alive.
    unsafe {
        lr::matmul(
            h,
            desc,
            alpha,
            beta,
            w.ptr() as *const c_void,
            a_l,
            x.ptr() as *const c_void,
            b_l,
            y.ptr() as *const c_void,
            d_l,
            y.ptr() as *mut c_void,
            d_l,
            &heur.algo,
            std::ptr::null_mut(),
            0,
            dev.cu_stream() as ls::cudaStream_t,
        )
    }
    .map_err(|e| lt_err("Matmul", e))?;
    Ok(y)
}
