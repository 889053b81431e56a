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
use super::driver::{Gemm, COMPUTE};
use super::CudaStorage;
use crate::backend::cpu::matmul::MatmulDims;
use crate::error::{Error, Result};
use crate::tensor::DType;
use std::sync::atomic::{AtomicU8, Ordering};

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
    if !matches!(a.dtype(), DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
        return Err(Error::UnsupportedDType { op: "matmul", dtype: a.dtype(), supported: "f32, f64, f16, bf16" });
    }
    let (m, n, k, batch) = (int("matmul", d.m)?, int("matmul", d.n)?, int("matmul", d.k)?, int("matmul", d.batch)?);
    let lda = if d.trans_a { m } else { k };
    let ldb = if d.trans_b { k } else { n };
    // Column-major Cᵀ (n×m) = op(B)ᵀ·op(A)ᵀ: B's buffer is the first operand.
    let g = Gemm {
        trans_a: d.trans_b,
        trans_b: d.trans_a,
        m: n,
        n: m,
        k,
        a: b.ptr(),
        lda: ldb,
        stride_a: d.b_stride as i64,
        b: a.ptr(),
        ldb: lda,
        stride_b: d.a_stride as i64,
        c: c.ptr(),
        ldc: n,
        stride_c: (d.m * d.n) as i64,
        batch,
        dtype: a.dtype(),
        tf32: allow_tf32(),
    };
    // SAFETY: A, B, C are live device buffers of this device holding at
    // least the elements the dims and strides address (checked above); the
    // product runs on the compute stream, so the buffers outlive it in
    // stream order.
    unsafe { dev.seam().gemm(&g, COMPUTE) }?;
    Ok(c)
}

/// The cuBLAS version (e.g. 130001; 0 on the emulated device), loading the library if present.
pub fn version(dev: &CudaDevice) -> Result<i32> {
    dev.seam().driver().blas_version()
}
