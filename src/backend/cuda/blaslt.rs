//! `linear` with its bias added in cuBLASLt's epilogue: `y = x·wᵀ + bias`,
//! x (M, K), w (N, K), bias (N), y (M, N), all row-major.
//!
//! Column-major, y is Yᵀ (N×M, ld N) = W·Xᵀ: A is w's buffer seen as a K×N
//! matrix (ld K) with op T, B is x's buffer as K×M (ld K) with op N, and the
//! BIAS epilogue adds bias[i] to row i of D — one per output feature.
//!
//! Each product's descriptors, layouts and algorithm are made once per
//! (shape, dtype, transposes, epilogue) and cached by the driver seam (a
//! cached shape makes no heuristic call: `Counters::lt_heuristics`). The
//! algorithms may use a workspace of [`workspace_bytes`] (32 MiB unless
//! `ASRFORGE_CUBLASLT_WORKSPACE_MIB` or the config's
//! `cublaslt_workspace_mib` says otherwise), obtained once per device.
//!
//! `linear`'s weight gradient comes with its bias gradient from the same
//! GEMM (the BGRADB epilogue) where cuBLASLt offers it: [`linear_grad_weight_bias`].

use super::blas::allow_tf32;
use super::driver::{Epilogue, Layout, LtKey, LtMatmul, COMPUTE};
use super::CudaStorage;
use crate::error::{Error, Result};
use crate::tensor::DType;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The default cuBLASLt workspace per device, MiB.
pub const DEFAULT_WORKSPACE_MIB: usize = 32;

/// usize::MAX: not decided yet (read the env at first use).
static WORKSPACE_MIB: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Sets cuBLASLt's workspace size (MiB; 0 for none). It takes effect on a
/// device that has not run a cuBLASLt product yet.
pub fn set_workspace_mib(mib: usize) {
    WORKSPACE_MIB.store(mib, Ordering::Relaxed);
}

/// cuBLASLt's workspace per device in bytes: [`set_workspace_mib`], else
/// `ASRFORGE_CUBLASLT_WORKSPACE_MIB`, else 32 MiB (a value that is not a
/// number is ignored with a warning).
pub fn workspace_bytes() -> usize {
    let mut mib = WORKSPACE_MIB.load(Ordering::Relaxed);
    if mib == usize::MAX {
        mib = match std::env::var("ASRFORGE_CUBLASLT_WORKSPACE_MIB") {
            Err(_) => DEFAULT_WORKSPACE_MIB,
            Ok(v) => v.trim().parse::<usize>().unwrap_or_else(|_| {
                eprintln!("warning: ASRFORGE_CUBLASLT_WORKSPACE_MIB={v:?} is not a number of MiB; using {DEFAULT_WORKSPACE_MIB}");
                DEFAULT_WORKSPACE_MIB
            }),
        };
        WORKSPACE_MIB.store(mib, Ordering::Relaxed);
    }
    mib << 20
}

/// One cuBLASLt product on `dev`'s compute stream with the device's workspace.
///
/// # Safety
/// The pointers are live buffers of `dev` holding every element `key`'s
/// layouts (and epilogue vector) address.
unsafe fn run(dev: &super::CudaDevice, mut key: LtKey, a: u64, b: u64, d: u64, bias: Option<u64>) -> Result<()> {
    let (workspace, bytes) = dev.lt_workspace(workspace_bytes())?;
    key.workspace = bytes;
    let g = LtMatmul { key, a, b, d, bias, workspace };
    // SAFETY: the caller's guarantee; the workspace is this device's, kept for its life.
    unsafe { dev.seam().lt_matmul(&g, COMPUTE) }
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
    if !matches!(dt, DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
        return Err(Error::UnsupportedDType { op: "linear", dtype: dt, supported: "f32, f64, f16, bf16" });
    }
    let dev = x.device();
    let y = dev.alloc(dt, m * n)?;
    if y.is_empty() {
        return Ok(y);
    }
    let (m64, n64, k64) = (m as u64, n as u64, k as u64);
    let key = LtKey {
        trans_a: true,
        trans_b: false,
        a_layout: Layout { rows: k64, cols: n64, ld: k as i64 },
        b_layout: Layout { rows: k64, cols: m64, ld: k as i64 },
        d_layout: Layout { rows: n64, cols: m64, ld: n as i64 },
        dtype: dt,
        tf32: allow_tf32(),
        epilogue: Epilogue::Bias,
        workspace: 0,
    };
    // SAFETY: w, x, y are live device buffers of n·k, m·k and m·n elements
    // matching the layouts, bias holds n; the call is ordered on the
    // compute stream, which keeps the buffers alive.
    unsafe { run(dev, key, w.ptr(), x.ptr(), y.ptr(), Some(bias.ptr())) }?;
    Ok(y)
}

/// The weight and bias gradients of `linear` (`y = x·wᵀ + b`) for the output
/// gradient `g` (m, n) and input `x` (m, k): `dw = gᵀ·x` (n, k) and
/// `db = Σ_rows g` (n). On f32/f16/bf16 db comes out of the dW GEMM's BGRADB
/// epilogue (one call); where cuBLASLt has no such algorithm (f64, or a
/// shape the heuristic refuses) it is a separate column sum.
///
/// Column-major, dW is dWᵀ (K×N, ld K) = X (K×M, ld K, op N) · Gᵀ (G's
/// buffer is N×M, ld N, op T, so op(B) is M×N); BGRADB sums op(B) over the
/// product's k dimension (the M rows): db[j] = Σ_r g[r, j].
pub fn linear_grad_weight_bias(g: &CudaStorage, x: &CudaStorage, m: usize, n: usize, k: usize) -> Result<(CudaStorage, CudaStorage)> {
    let dt = g.dtype();
    if x.dtype() != dt {
        return Err(Error::DTypeMismatch { op: "linear backward", expected: dt, got: x.dtype() });
    }
    if g.len() != m * n || x.len() != m * k {
        return Err(Error::invalid("linear backward", format!("expected g of {} and x of {} elements, got {} and {}", m * n, m * k, g.len(), x.len())));
    }
    if !matches!(dt, DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
        return Err(Error::UnsupportedDType { op: "linear backward", dtype: dt, supported: "f32, f64, f16, bf16" });
    }
    let dev = g.device();
    if m == 0 || n == 0 || k == 0 {
        // Empty sums: cuBLASLt writes nothing, the gradients are zero.
        return Ok((dev.zeros(dt, n * k)?, dev.zeros(dt, n)?));
    }
    let dw = dev.alloc(dt, n * k)?;
    let db = dev.alloc(dt, n)?;
    let (m64, n64, k64) = (m as u64, n as u64, k as u64);
    let key = LtKey {
        trans_a: false,
        trans_b: true,
        a_layout: Layout { rows: k64, cols: m64, ld: k as i64 },
        b_layout: Layout { rows: n64, cols: m64, ld: n as i64 },
        d_layout: Layout { rows: k64, cols: n64, ld: k as i64 },
        dtype: dt,
        tf32: allow_tf32(),
        epilogue: Epilogue::BgradB,
        workspace: 0,
    };
    if dt != DType::F64 {
        // SAFETY: x, g, dw are live buffers of m·k, m·n and n·k elements
        // matching the layouts, db holds n; ordered on the compute stream.
        match unsafe { run(dev, key, x.ptr(), g.ptr(), dw.ptr(), Some(db.ptr())) } {
            Ok(()) => return Ok((dw, db)),
            // No BGRADB algorithm for this shape (a plan error, before any
            // launch): the plain product and a column sum below.
            Err(Error::Cuda { kernel, .. }) if kernel == "cublasLt/plan" => {}
            Err(e) => return Err(e),
        }
    }
    let plain = LtKey { epilogue: Epilogue::Plain, ..key };
    // SAFETY: as above, without the epilogue vector.
    unsafe { run(dev, plain, x.ptr(), g.ptr(), dw.ptr(), None) }?;
    Ok((dw, super::reduce::sum_dim(g, 1, m, n)?))
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
    let key = LtKey {
        trans_a,
        trans_b,
        a_layout: lay(al),
        b_layout: lay(bl),
        d_layout: lay(dl),
        dtype: dt,
        tf32: allow_tf32(),
        epilogue: if bias.is_some() { Epilogue::Bias } else { Epilogue::Plain },
        workspace: 0,
    };
    if m == 0 || n == 0 {
        return Ok(());
    }
    // SAFETY: every element the layouts address lies inside the live
    // buffers (checked above); the call is ordered on the compute stream.
    unsafe { run(a.device(), key, a.ptr(), b.ptr(), d.ptr(), bias.map(|s| s.ptr())) }
}
