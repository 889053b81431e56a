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
