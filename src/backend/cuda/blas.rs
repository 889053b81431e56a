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
    matmul_scaled(d, a, b, 1.0, None)
}

/// `alpha·op(A)·op(B)`, plus `acc` when given (cuBLAS's beta = 1, in one
/// GEMM: `acc` must hold the whole result, `batch·m·n` elements, of the
/// operands' type; it is consumed and returned as the result).
pub fn matmul_scaled(d: &MatmulDims, a: &CudaStorage, b: &CudaStorage, alpha: f64, acc: Option<CudaStorage>) -> Result<CudaStorage> {
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
    let beta = if acc.is_some() { 1.0 } else { 0.0 };
    let c = match acc {
        Some(c) => {
            if c.dtype() != a.dtype() || c.len() != d.batch * d.m * d.n || c.ordinal() != a.ordinal() {
                return Err(Error::invalid(
                    "matmul",
                    format!(
                        "an accumulator of {} {:?} elements on cuda:{} for a {:?} product of {} elements",
                        c.len(),
                        c.dtype(),
                        c.ordinal(),
                        a.dtype(),
                        d.batch * d.m * d.n
                    ),
                ));
            }
            if d.k == 0 {
                // C + 0.
                return Ok(c);
            }
            c
        }
        None => dev.alloc(a.dtype(), d.batch * d.m * d.n)?,
    };
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
        alpha,
        beta,
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

/// One strided-batched GEMM in cuBLAS's own terms (column-major, element
/// (r, c) of a stored matrix at `r + c·ld`): `C[i] = op(A[i])·op(B[i])`,
/// op(A) m×k, op(B) k×n, C m×n, operand `i` starting `i·stride` elements in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmSpec {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
    pub batch: usize,
}

/// Elements a stored `rows × cols` matrix with leading dimension `ld` spans.
fn span(rows: usize, cols: usize, ld: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (cols - 1) * ld + rows
    }
}

/// Elements `batch` matrices of `one` elements `stride` apart span.
fn batched(batch: usize, stride: usize, one: usize) -> usize {
    if batch == 0 || one == 0 {
        0
    } else {
        (batch - 1) * stride + one
    }
}

/// Runs `spec` on the device buffers (same dtype and device; each must hold
/// every element the spec addresses), writing C in place: the raw cuBLAS
/// call `matmul` is built on, for checking its semantics directly.
pub fn gemm_strided_batched(spec: &GemmSpec, a: &CudaStorage, b: &CudaStorage, c: &CudaStorage) -> Result<()> {
    let dt = a.dtype();
    for s in [b, c] {
        if s.dtype() != dt {
            return Err(Error::DTypeMismatch { op: "gemm", expected: dt, got: s.dtype() });
        }
        if s.ordinal() != a.ordinal() {
            return Err(Error::invalid("gemm", format!("operands on cuda:{} and cuda:{}", a.ordinal(), s.ordinal())));
        }
    }
    let (ra, ca) = if spec.trans_a { (spec.k, spec.m) } else { (spec.m, spec.k) };
    let (rb, cb) = if spec.trans_b { (spec.n, spec.k) } else { (spec.k, spec.n) };
    let need = [
        ("A", a, batched(spec.batch, spec.stride_a, span(ra, ca, spec.lda))),
        ("B", b, batched(spec.batch, spec.stride_b, span(rb, cb, spec.ldb))),
        ("C", c, batched(spec.batch, spec.stride_c, span(spec.m, spec.n, spec.ldc))),
    ];
    for (name, s, n) in need {
        if s.len() < n {
            return Err(Error::invalid("gemm", format!("{name} holds {} elements, {spec:?} addresses {n}", s.len())));
        }
    }
    if spec.lda < ra.max(1) || spec.ldb < rb.max(1) || spec.ldc < spec.m.max(1) {
        return Err(Error::invalid("gemm", format!("a leading dimension is below its matrix's rows in {spec:?}")));
    }
    if spec.m == 0 || spec.n == 0 || spec.batch == 0 {
        return Ok(());
    }
    let i64_of = |v: usize| i64::try_from(v).map_err(|_| Error::invalid("gemm", format!("stride {v} exceeds 64 bits")));
    let g = Gemm {
        trans_a: spec.trans_a,
        trans_b: spec.trans_b,
        m: int("gemm", spec.m)?,
        n: int("gemm", spec.n)?,
        k: int("gemm", spec.k)?,
        a: a.ptr(),
        lda: int("gemm", spec.lda)?,
        stride_a: i64_of(spec.stride_a)?,
        b: b.ptr(),
        ldb: int("gemm", spec.ldb)?,
        stride_b: i64_of(spec.stride_b)?,
        c: c.ptr(),
        ldc: int("gemm", spec.ldc)?,
        stride_c: i64_of(spec.stride_c)?,
        batch: int("gemm", spec.batch)?,
        dtype: dt,
        tf32: allow_tf32(),
        alpha: 1.0,
        beta: 0.0,
    };
    // SAFETY: every element the spec addresses lies inside the live buffers
    // (checked above); the call is ordered on the compute stream.
    unsafe { a.device().seam().gemm(&g, COMPUTE) }
}
