//! Matrix products through cuBLAS, the twin of `cpu/matmul.rs`:
//! `C[b] = op(A[b]) · op(B[b])`, row-major, transposes as flags, a batch
//! stride of 0 sharing an operand over the batch (strided-batched GEMM).
//!
//! cuBLAS is column-major. A row-major (M, N) matrix is the column-major
//! (N, M) matrix Cᵀ, and Cᵀ = op(B)ᵀ·op(A)ᵀ, so the call swaps the operands:
//! `gemm(opB, opA, N, M, K, B, ldb, A, lda, C, ldc = N)` with `lda = K`
//! (or M when A is transposed) and `ldb = N` (or K when B is transposed).
//!
//! f32: SGEMM semantics with FP32 compute, TF32 tensor cores only when
//! allowed (`set_allow_tf32(true)` or `ASRFORGE_ALLOW_TF32=1`); f64: DGEMM;
//! f16/bf16: half inputs and output with FP32 accumulation (GemmEx).

use super::device::CudaDevice;
use super::CudaStorage;
use crate::backend::cpu::matmul::MatmulDims;
use crate::error::{Error, Result};
use crate::tensor::DType;
use cudarc::cublas::{result as cr, sys as cs, CudaBlas};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU8, Ordering};

/// The per-device cuBLAS handle, bound to the compute stream.
pub(crate) struct Blas {
    blas: CudaBlas,
}

/// 0: not decided yet (read the env), 1: off, 2: on.
static ALLOW_TF32: AtomicU8 = AtomicU8::new(0);

/// Allows (or forbids) TF32 tensor cores for f32 products (off by default,
/// so f32 products match the CPU to f32 precision).
pub fn set_allow_tf32(allow: bool) {
    ALLOW_TF32.store(if allow { 2 } else { 1 }, Ordering::Relaxed);
}

/// Whether f32 products may use TF32.
pub fn allow_tf32() -> bool {
    match ALLOW_TF32.load(Ordering::Relaxed) {
        0 => std::env::var_os("ASRFORGE_ALLOW_TF32").is_some_and(|v| v == "1"),
        v => v == 2,
    }
}

fn blas_err(what: &str, e: cr::CublasError) -> Error {
    Error::Cuda { kernel: format!("cublas/{what}"), msg: format!("{:?}", e.0) }
}

fn handle(dev: &CudaDevice) -> Result<&Blas> {
    let b = dev.blas.get_or_init(|| {
        // SAFETY: only tries to dlopen libcublas; cudarc panics on first use
        // without it, so this must come first.
        if !unsafe { cs::is_culib_present() } {
            return Err("the cuBLAS library (libcublas.so) was not found on the loader path".to_string());
        }
        dev.bind().map_err(|e| e.to_string())?;
        CudaBlas::new(dev.stream().clone()).map(|blas| Blas { blas }).map_err(|e| format!("cublasCreate failed: {:?}", e.0))
    });
    b.as_ref().map_err(|m| Error::Cuda { kernel: "cublas".into(), msg: m.clone() })
}

fn int(op: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::invalid(op, format!("dimension {v} exceeds cuBLAS's 32-bit limit")))
}

/// The batched product of `d` (checks that both operands hold what `d` says).
pub fn matmul(d: &MatmulDims, a: &CudaStorage, b: &CudaStorage) -> Result<CudaStorage> {
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch { op: "matmul", expected: a.dtype(), got: b.dtype() });
    }
    if a.ordinal() != b.ordinal() {
        return Err(Error::invalid("matmul", format!("operands on cuda:{} and cuda:{}", a.ordinal(), b.ordinal())));
    }
    let need = |stride: usize, one: usize| if d.batch == 0 { 0 } else { (d.batch - 1) * stride + one };
    if a.len() < need(d.a_stride, d.m * d.k) || b.len() < need(d.b_stride, d.k * d.n) {
        return Err(Error::invalid("matmul", format!("operands of {} and {} elements are too small for {d:?}", a.len(), b.len())));
    }
    let dev = a.device();
    let c = dev.alloc(a.dtype(), d.batch * d.m * d.n)?;
    if c.is_empty() {
        return Ok(c);
    }
    if d.k == 0 {
        // An empty inner dim: the product is zero (cuBLAS would not write C).
        return dev.zeros(a.dtype(), d.batch * d.m * d.n);
    }
    let h = *handle(dev)?.blas.handle();
    let (m, n, k, batch) = (int("matmul", d.m)?, int("matmul", d.n)?, int("matmul", d.k)?, int("matmul", d.batch)?);
    let op = |t: bool| if t { cs::cublasOperation_t::CUBLAS_OP_T } else { cs::cublasOperation_t::CUBLAS_OP_N };
    let lda = if d.trans_a { m } else { k };
    let ldb = if d.trans_b { k } else { n };
    let (sa, sb, sc) = (d.a_stride as i64, d.b_stride as i64, (d.m * d.n) as i64);
    dev.bind()?;
    match a.dtype() {
        DType::F64 => {
            let (alpha, beta) = (1.0f64, 0.0f64);
            // SAFETY: A, B, C are live device buffers of this device holding
            // at least the elements the dims and strides address (checked
            // above); the handle runs on the compute stream, so the buffers
            // outlive the call in stream order; alpha/beta are host scalars
            // read during the call.
            unsafe {
                cr::dgemm_strided_batched(
                    h,
                    op(d.trans_b),
                    op(d.trans_a),
                    n,
                    m,
                    k,
                    &alpha,
                    b.ptr() as *const f64,
                    ldb,
                    sb,
                    a.ptr() as *const f64,
                    lda,
                    sa,
                    &beta,
                    c.ptr() as *mut f64,
                    n,
                    sc,
                    batch,
                )
            }
            .map_err(|e| blas_err("dgemm_strided_batched", e))?;
        }
        dt => {
            let (ty, compute) = match dt {
                DType::F32 if allow_tf32() => (cs::cudaDataType::CUDA_R_32F, cs::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32),
                DType::F32 => (cs::cudaDataType::CUDA_R_32F, cs::cublasComputeType_t::CUBLAS_COMPUTE_32F),
                DType::F16 => (cs::cudaDataType::CUDA_R_16F, cs::cublasComputeType_t::CUBLAS_COMPUTE_32F),
                DType::BF16 => (cs::cudaDataType::CUDA_R_16BF, cs::cublasComputeType_t::CUBLAS_COMPUTE_32F),
                other => return Err(Error::UnsupportedDType { op: "matmul", dtype: other, supported: "f32, f64, f16, bf16" }),
            };
            let (alpha, beta) = (1.0f32, 0.0f32);
            // SAFETY: as for the f64 call; with FP32 compute alpha and beta
            // are f32 host scalars.
            unsafe {
                cr::gemm_strided_batched_ex(
                    h,
                    op(d.trans_b),
                    op(d.trans_a),
                    n,
                    m,
                    k,
                    &alpha as *const f32 as *const c_void,
                    b.ptr() as *const c_void,
                    ty,
                    ldb,
                    sb,
                    a.ptr() as *const c_void,
                    ty,
                    lda,
                    sa,
                    &beta as *const f32 as *const c_void,
                    c.ptr() as *mut c_void,
                    ty,
                    n,
                    sc,
                    batch,
                    compute,
                    cs::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(|e| blas_err("gemm_strided_batched_ex", e))?;
        }
    }
    Ok(c)
}

/// The cuBLAS version (e.g. 130001), loading the library if present.
pub fn version(dev: &CudaDevice) -> Result<i32> {
    let h = *handle(dev)?.blas.handle();
    let mut v = 0i32;
    // SAFETY: `h` is a live handle; cuBLAS writes one int.
    unsafe { cs::cublasGetVersion_v2(h, &mut v) }.result().map_err(|e| blas_err("cublasGetVersion", e))?;
    Ok(v)
}
