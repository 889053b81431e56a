//! `linear` with its bias added in cuBLASLt's epilogue: `y = x·wᵀ + bias`,
//! x (M, K), w (N, K), bias (N), y (M, N), all row-major.
//!
//! Column-major, y is Yᵀ (N×M, ld N) = W·Xᵀ: A is w's buffer seen as a K×N
//! matrix (ld K) with op T, B is x's buffer as K×M (ld K) with op N, and the
//! BIAS epilogue adds bias[i] to row i of D — one per output feature.
//! No workspace is offered, so the heuristic picks a workspace-free algorithm.

use super::blas::allow_tf32;
use super::driver::{Layout, LtMatmul, COMPUTE};
use super::CudaStorage;
use crate::error::{Error, Result};
use crate::tensor::DType;

/// `x·wᵀ + bias` for x of `m` rows of `k`, w (n, k), bias (n).
pub fn linear_bias(x: &CudaStorage, w: &CudaStorage, bias: &CudaStorage, m: usize, n: usize, k: usize) -> Result<CudaStorage> {
    let dt = x.dtype();
    if w.dtype() != dt || bias.dtype() != dt {
        return Err(Error::DTypeMismatch { op: "linear", expected: dt, got: if w.dtype() != dt { w.dtype() } else { bias.dtype() } });
    }
    if x.len() != m * k || w.len() != n * k || bias.len() != n {
        return Err(Error::invalid("linear", format!("expected {} + {} + {n} elements, got {} + {} + {}", m * k, n * k, x.len(), w.len(), bias.len())));
    }
    if !matches!(dt, DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
        return Err(Error::UnsupportedDType { op: "linear", dtype: dt, supported: "f32, f64, f16, bf16" });
    }
    let dev = x.device();
    let y = dev.alloc(dt, m * n)?;
    if y.is_empty() {
        return Ok(y);
    }
    let (m64, n64, k64) = (m as u64, n as u64, k as u64);
    let g = LtMatmul {
        trans_a: true,
        trans_b: false,
        a: w.ptr(),
        a_layout: Layout { rows: k64, cols: n64, ld: k as i64 },
        b: x.ptr(),
        b_layout: Layout { rows: k64, cols: m64, ld: k as i64 },
        d: y.ptr(),
        d_layout: Layout { rows: n64, cols: m64, ld: n as i64 },
        bias: Some(bias.ptr()),
        dtype: dt,
        tf32: allow_tf32(),
    };
    // SAFETY: w, x, y are live device buffers of n·k, m·k and m·n elements
    // matching the layouts, bias holds n; the call is ordered on the
    // compute stream, which keeps the buffers alive.
    unsafe { dev.seam().lt_matmul(&g, COMPUTE) }?;
    Ok(y)
}

/// A cuBLASLt matrix: `rows × cols`, column-major, leading dimension `ld`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatrixLayout {
    pub rows: usize,
    pub cols: usize,
    pub ld: usize,
}

/// `D = op(A)·op(B) (+ bias[r] on every row r of D)` through cuBLASLt with
/// the layouts given (D written in place): the raw call `linear_bias` is
/// built on, for checking its semantics directly.
pub fn matmul_raw(
    (trans_a, a, al): (bool, &CudaStorage, MatrixLayout),
    (trans_b, b, bl): (bool, &CudaStorage, MatrixLayout),
    (d, dl): (&CudaStorage, MatrixLayout),
    bias: Option<&CudaStorage>,
) -> Result<()> {
    let dt = a.dtype();
    for s in [b, d].into_iter().chain(bias) {
        if s.dtype() != dt || s.ordinal() != a.ordinal() {
            return Err(Error::invalid("cublasLt matmul", format!("expected {dt:?} on cuda:{}, got {:?} on cuda:{}", a.ordinal(), s.dtype(), s.ordinal())));
        }
    }
    let span = |l: MatrixLayout| if l.rows == 0 || l.cols == 0 { 0 } else { (l.cols - 1) * l.ld + l.rows };
    for (name, s, l) in [("A", a, al), ("B", b, bl), ("D", d, dl)] {
        if l.ld < l.rows.max(1) || s.len() < span(l) {
            return Err(Error::invalid("cublasLt matmul", format!("{name}: {} elements for layout {l:?}", s.len())));
        }
    }
    if let Some(bs) = bias {
        if bs.len() < dl.rows {
            return Err(Error::invalid("cublasLt matmul", format!("bias of {} elements for {} rows of D", bs.len(), dl.rows)));
        }
    }
    let m = if trans_a { al.cols } else { al.rows };
    let k = if trans_a { al.rows } else { al.cols };
    let (k2, n) = if trans_b { (bl.cols, bl.rows) } else { (bl.rows, bl.cols) };
    if k != k2 || dl.rows != m || dl.cols != n {
        return Err(Error::invalid("cublasLt matmul", format!("op(A) {m}×{k}, op(B) {k2}×{n} and D {}×{} do not chain", dl.rows, dl.cols)));
    }
    if !matches!(dt, DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
        return Err(Error::UnsupportedDType { op: "linear", dtype: dt, supported: "f32, f64, f16, bf16" });
    }
    let lay = |l: MatrixLayout| Layout { rows: l.rows as u64, cols: l.cols as u64, ld: l.ld as i64 };
    let g = LtMatmul {
        trans_a,
        trans_b,
        a: a.ptr(),
        a_layout: lay(al),
        b: b.ptr(),
        b_layout: lay(bl),
        d: d.ptr(),
        d_layout: lay(dl),
        bias: bias.map(|s| s.ptr()),
        dtype: dt,
        tf32: allow_tf32(),
    };
    if m == 0 || n == 0 {
        return Ok(());
    }
    // SAFETY: every element the layouts address lies inside the live
    // buffers (checked above); the call is ordered on the compute stream.
    unsafe { a.device().seam().lt_matmul(&g, COMPUTE) }
}
