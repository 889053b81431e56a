//! cuBLAS and cuBLASLt on the emulated device, written from their
//! definitions rather than from the row-major CPU matmul, so that a wrong
//! leading dimension or transpose in blas.rs/blaslt.rs gives a wrong result
//! (or an out-of-buffer error) here as it would on a GPU.
//!
//! Column-major: element (r, c) of a stored matrix with leading dimension
//! `ld` is at `r + c·ld`. `op(X)` is X or Xᵀ. The product is computed by the
//! `gemm` crate with those strides (f64, f32), or, where cuBLAS converts,
//! on f32 copies of the operands: f16/bf16 inputs are widened exactly,
//! accumulated in f32 and the output rounded once (after the bias epilogue);
//! TF32 rounds each f32 input to a 10-bit mantissa (nearest, ties to even).
//! Invalid arguments fail as cuBLAS's CUBLAS_STATUS_INVALID_VALUE would.

use super::emu::EmuDriver;
use super::{DevPtr, Epilogue, Gemm, LtKey, LtMatmul};
use crate::error::{Error, Result};
use crate::tensor::DType;
use gemm::Parallelism;
use half::{bf16, f16};

/// Products at least this large (m·n·k) use every core.
const PAR_WORK: usize = 1 << 18;

/// One product in cuBLAS terms with element offsets and sizes as usize.
struct Prod {
    ta: bool,
    tb: bool,
    m: usize,
    n: usize,
    k: usize,
    a: DevPtr,
    lda: usize,
    sa: usize,
    b: DevPtr,
    ldb: usize,
    sb: usize,
    c: DevPtr,
    ldc: usize,
    sc: usize,
    batch: usize,
    dtype: DType,
    tf32: bool,
    /// C = alpha·op(A)·op(B) + beta·C (C unread when beta = 0).
    alpha: f64,
    beta: f64,
}

fn invalid(what: &str, msg: String) -> Error {
    Error::Cuda { kernel: format!("{what} (emulated)"), msg: format!("CUBLAS_STATUS_INVALID_VALUE: {msg}") }
}

fn nonneg(what: &str, name: &str, v: i64) -> Result<usize> {
    usize::try_from(v).map_err(|_| invalid(what, format!("{name} = {v} is negative")))
}

/// Rounds an f32 to TF32 (10 explicit mantissa bits), nearest, ties to even.
pub(crate) fn round_tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    let b = x.to_bits();
    let lsb = (b >> 13) & 1;
    f32::from_bits(b.wrapping_add(0xFFF + lsb) & !0x1FFF)
}

/// Bytes spanned by a stored `rows × cols` matrix with leading dimension `ld`.
fn span(rows: usize, cols: usize, ld: usize, es: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        ((cols - 1) * ld + rows) * es
    }
}

/// Element `i` of a device array of `dt`, widened to f32.
///
/// # Safety
/// `p + i` is inside a live buffer of `dt` elements.
unsafe fn load(dt: DType, p: DevPtr, i: usize) -> f32 {
    // SAFETY: the caller's guarantee; the reads are unaligned-safe.
    unsafe {
        match dt {
            DType::F32 => (p as *const f32).add(i).read_unaligned(),
            DType::F16 => (p as *const f16).add(i).read_unaligned().to_f32(),
            DType::BF16 => (p as *const bf16).add(i).read_unaligned().to_f32(),
            _ => f32::NAN,
        }
    }
}

/// Stores `v` (already including any bias) into element `i`, rounded once to `dt`.
///
/// # Safety
/// `p + i` is inside a live buffer of `dt` elements.
unsafe fn store(dt: DType, p: DevPtr, i: usize, v: f32) {
    // SAFETY: the caller's guarantee.
    unsafe {
        match dt {
            DType::F32 => (p as *mut f32).add(i).write_unaligned(v),
            DType::F16 => (p as *mut f16).add(i).write_unaligned(f16::from_f32(v)),
            DType::BF16 => (p as *mut bf16).add(i).write_unaligned(bf16::from_f32(v)),
            _ => {}
        }
    }
}

impl Prod {
    fn check(&self, drv: &EmuDriver, what: &str) -> Result<()> {
        let (ra, ca) = if self.ta { (self.k, self.m) } else { (self.m, self.k) };
        let (rb, cb) = if self.tb { (self.n, self.k) } else { (self.k, self.n) };
        if self.lda < ra.max(1) {
            return Err(invalid(what, format!("lda = {} < {} rows of the stored A", self.lda, ra.max(1))));
        }
        if self.ldb < rb.max(1) {
            return Err(invalid(what, format!("ldb = {} < {} rows of the stored B", self.ldb, rb.max(1))));
        }
        if self.ldc < self.m.max(1) {
            return Err(invalid(what, format!("ldc = {} < m = {}", self.ldc, self.m.max(1))));
        }
        let es = self.dtype.size_in_bytes();
        for i in 0..self.batch {
            let a = self.a + (i * self.sa * es) as u64;
            let b = self.b + (i * self.sb * es) as u64;
            let c = self.c + (i * self.sc * es) as u64;
            drv.check_range(a, span(ra, ca, self.lda, es), &format!("{what}: A of batch {i}"))?;
            drv.check_range(b, span(rb, cb, self.ldb, es), &format!("{what}: B of batch {i}"))?;
            drv.check_range(c, span(self.m, self.n, self.ldc, es), &format!("{what}: C of batch {i}"))?;
        }
        Ok(())
    }
    /// (row stride, column stride) of op(A) (m×k) and op(B) (k×n).
    fn strides(&self) -> ((isize, isize), (isize, isize)) {
        let (lda, ldb) = (self.lda as isize, self.ldb as isize);
        let a = if self.ta { (lda, 1) } else { (1, lda) };
        let b = if self.tb { (ldb, 1) } else { (1, ldb) };
        (a, b)
    }
    /// Runs every batch: C = alpha·op(A)·op(B) + beta·C (C read only when
    /// beta ≠ 0) in the compute type, then `bias` (m elements of the dtype)
    /// added to every row r, rounded once.
    ///
    /// # Safety
    /// The ranges were checked by `check`; the buffers stay live.
    unsafe fn run(&self, bias: Option<DevPtr>) {
        let es = self.dtype.size_in_bytes();
        let (m, n, k) = (self.m, self.n, self.k);
        let par = if m * n * k >= PAR_WORK { Parallelism::Rayon(rayon::current_num_threads()) } else { Parallelism::None };
        let ((ars, acs), (brs, bcs)) = self.strides();
        for i in 0..self.batch {
            let a = self.a + (i * self.sa * es) as u64;
            let b = self.b + (i * self.sb * es) as u64;
            let c = self.c + (i * self.sc * es) as u64;
            match self.dtype {
                // SAFETY: the ranges were checked; the buffers stay live (run's contract).
                DType::F64 => unsafe { exact::<f64>(m, n, k, a, (ars, acs), b, (brs, bcs), c, self.ldc, bias, (self.alpha, self.beta), par) },
                // SAFETY: as for f64.
                DType::F32 if !self.tf32 => unsafe { exact::<f32>(m, n, k, a, (ars, acs), b, (brs, bcs), c, self.ldc, bias, (self.alpha, self.beta), par) },
                dt => {
                    // Widen op(A) and op(B) to contiguous column-major f32
                    // (TF32-rounded for f32), multiply, then add the bias
                    // and round once into C.
                    let round = |v: f32| if dt == DType::F32 { round_tf32(v) } else { v };
                    let mut aw = vec![0f32; m * k];
                    let mut bw = vec![0f32; k * n];
                    // SAFETY: every index addresses op(A)/op(B) inside the checked ranges.
                    unsafe {
                        for l in 0..k {
                            for r in 0..m {
                                aw[r + l * m] = round(load(dt, a, (r as isize * ars + l as isize * acs) as usize));
                            }
                        }
                        for j in 0..n {
                            for l in 0..k {
                                bw[l + j * k] = round(load(dt, b, (l as isize * brs + j as isize * bcs) as usize));
                            }
                        }
                    }
                    let mut cw = vec![0f32; m * n];
                    if k > 0 {
                        // SAFETY: the three vectors hold m·k, k·n and m·n elements, column-major.
                        unsafe {
                            gemm::gemm(
                                m,
                                n,
                                k,
                                cw.as_mut_ptr(),
                                m as isize,
                                1,
                                false,
                                aw.as_ptr(),
                                m as isize,
                                1,
                                bw.as_ptr(),
                                k as isize,
                                1,
                                0.0,
                                1.0,
                                false,
                                false,
                                false,
                                par,
                            )
                        };
                    }
                    let (alpha, beta) = (self.alpha as f32, self.beta as f32);
                    // SAFETY: C and the bias are inside the checked ranges.
                    unsafe {
                        for j in 0..n {
                            for r in 0..m {
                                let add = bias.map_or(0.0, |bp| load(dt, bp, r));
                                let mut v = cw[r + j * m];
                                if alpha != 1.0 {
                                    v *= alpha;
                                }
                                if beta != 0.0 {
                                    v += beta * load(dt, c, r + j * self.ldc);
                                }
                                store(dt, c, r + j * self.ldc, v + add);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One product in the operands' own type (f32 without TF32, f64): C (m×n,
/// column-major, ld `ldc`) = alpha·op(A)·op(B) + beta·C at the given (row,
/// column) strides (C unread when beta = 0), plus `bias[r]` on every row r
/// when given.
///
/// # Safety
/// Every address of op(A), op(B), C and the bias lies in a checked, live range.
#[allow(clippy::too_many_arguments)]
unsafe fn exact<T>(
    m: usize,
    n: usize,
    k: usize,
    a: DevPtr,
    (ars, acs): (isize, isize),
    b: DevPtr,
    (brs, bcs): (isize, isize),
    c: DevPtr,
    ldc: usize,
    bias: Option<DevPtr>,
    (alpha, beta): (f64, f64),
    par: Parallelism,
) where
    T: Copy + 'static + num_traits::Zero + num_traits::One + num_traits::FromPrimitive + std::ops::AddAssign + std::ops::MulAssign,
{
    let c = c as *mut T;
    let of = |v: f64| T::from_f64(v).unwrap_or_else(T::zero);
    if k == 0 {
        for j in 0..n {
            if beta == 0.0 {
                std::ptr::write_bytes(c.add(j * ldc), 0, m);
            } else {
                for r in 0..m {
                    *c.add(r + j * ldc) *= of(beta);
                }
            }
        }
    } else {
        // read_dst only when beta ≠ 0: otherwise C is written, never read.
        // gemm's dst = alpha'·dst + beta'·lhs·rhs, so the roles swap.
        gemm::gemm(m, n, k, c, ldc as isize, 1, beta != 0.0, a as *const T, acs, ars, b as *const T, bcs, brs, of(beta), of(alpha), false, false, false, par);
    }
    if let Some(bp) = bias {
        for j in 0..n {
            for r in 0..m {
                *c.add(r + j * ldc) += *(bp as *const T).add(r);
            }
        }
    }
}

fn supported(what: &str, dt: DType) -> Result<()> {
    match dt {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => Ok(()),
        other => Err(invalid(what, format!("no emulated product for {other:?}"))),
    }
}

/// `cublasGemmStridedBatchedEx` / `cublasDgemmStridedBatched` with the call's alpha and beta.
///
/// # Safety
/// The pointers are device addresses of this emulated device (their ranges
/// are checked against the live buffers before anything is read).
pub(super) unsafe fn gemm(drv: &EmuDriver, g: &Gemm) -> Result<()> {
    let what = "cublas/gemm_strided_batched";
    supported(what, g.dtype)?;
    let p = Prod {
        ta: g.trans_a,
        tb: g.trans_b,
        m: nonneg(what, "m", g.m as i64)?,
        n: nonneg(what, "n", g.n as i64)?,
        k: nonneg(what, "k", g.k as i64)?,
        a: g.a,
        lda: nonneg(what, "lda", g.lda as i64)?,
        sa: nonneg(what, "strideA", g.stride_a)?,
        b: g.b,
        ldb: nonneg(what, "ldb", g.ldb as i64)?,
        sb: nonneg(what, "strideB", g.stride_b)?,
        c: g.c,
        ldc: nonneg(what, "ldc", g.ldc as i64)?,
        sc: nonneg(what, "strideC", g.stride_c)?,
        batch: nonneg(what, "batchCount", g.batch as i64)?,
        dtype: g.dtype,
        tf32: g.tf32 && g.dtype == DType::F32,
        alpha: g.alpha,
        beta: g.beta,
    };
    if p.m == 0 || p.n == 0 || p.batch == 0 {
        return Ok(());
    }
    p.check(drv, what)?;
    // SAFETY: checked above.
    unsafe { p.run(None) };
    Ok(())
}

/// The product's (m, n, k) if `key` describes a valid cuBLASLt matmul, as
/// `cublasLtMatmulAlgoGetHeuristic` would judge it: shapes that chain,
/// leading dimensions at least the rows, a supported type, and BGRADB only
/// for f32/f16/bf16 (no bias-gradient epilogue for f64: NOT_SUPPORTED).
pub(super) fn check_plan(key: &LtKey) -> Result<(usize, usize, usize)> {
    let what = "cublasLt/AlgoGetHeuristic";
    supported(what, key.dtype)?;
    let (a, b, d) = (key.a_layout, key.b_layout, key.d_layout);
    let dim = |v: u64| usize::try_from(v).map_err(|_| invalid(what, format!("dimension {v} too large")));
    let (m, k) = if key.trans_a { (dim(a.cols)?, dim(a.rows)?) } else { (dim(a.rows)?, dim(a.cols)?) };
    let (k2, n) = if key.trans_b { (dim(b.cols)?, dim(b.rows)?) } else { (dim(b.rows)?, dim(b.cols)?) };
    if k != k2 || dim(d.rows)? != m || dim(d.cols)? != n {
        return Err(invalid(what, format!("op(A) is {m}×{k}, op(B) {k2}×{n}, D {}×{}: the shapes do not chain", d.rows, d.cols)));
    }
    for (name, l) in [("A", a), ("B", b), ("D", d)] {
        if l.ld < l.rows.max(1) as i64 {
            return Err(invalid(what, format!("{name}'s ld = {} < its {} rows", l.ld, l.rows)));
        }
    }
    if key.epilogue == Epilogue::BgradB && key.dtype == DType::F64 {
        return Err(Error::Cuda { kernel: format!("{what} (emulated)"), msg: "CUBLAS_STATUS_NOT_SUPPORTED: no BGRADB epilogue for f64".into() });
    }
    Ok((m, n, k))
}

/// `cublasLtMatmul` with alpha = 1, beta = 0, C = D, and the key's epilogue:
/// BIAS adds `bias[r]` to row r before D's one rounding; BGRADB writes
/// `bias[c] = Σ_l op(B)[l, c]`, accumulated in f32 (the compute type) in
/// ascending l and rounded once to D's type.
///
/// # Safety
/// As for [`gemm`]; the workspace addresses `key.workspace` live bytes.
pub(super) unsafe fn lt_matmul(drv: &EmuDriver, g: &LtMatmul) -> Result<()> {
    let what = "cublasLt/Matmul";
    let key = &g.key;
    let (m, n, k) = check_plan(key)?;
    let (a, b, d) = (key.a_layout, key.b_layout, key.d_layout);
    let p = Prod {
        ta: key.trans_a,
        tb: key.trans_b,
        m,
        n,
        k,
        a: g.a,
        lda: nonneg(what, "A's ld", a.ld)?,
        sa: 0,
        b: g.b,
        ldb: nonneg(what, "B's ld", b.ld)?,
        sb: 0,
        c: g.d,
        ldc: nonneg(what, "D's ld", d.ld)?,
        sc: 0,
        batch: 1,
        dtype: key.dtype,
        tf32: key.tf32 && key.dtype == DType::F32,
        alpha: 1.0,
        beta: 0.0,
    };
    if key.workspace > 0 {
        drv.check_range(g.workspace, key.workspace, &format!("{what}: workspace"))?;
    }
    let es = key.dtype.size_in_bytes();
    let bias = match (key.epilogue, g.bias) {
        (Epilogue::Plain, _) => None,
        (e, None) => return Err(invalid(what, format!("the {e:?} epilogue has no bias pointer"))),
        (Epilogue::Bias, Some(bp)) => {
            drv.check_range(bp, m * es, &format!("{what}: bias"))?;
            Some(bp)
        }
        (Epilogue::BgradB, Some(bp)) => {
            drv.check_range(bp, n * es, &format!("{what}: bias gradient"))?;
            None
        }
    };
    if m == 0 || n == 0 {
        return Ok(());
    }
    p.check(drv, what)?;
    // SAFETY: checked above.
    unsafe { p.run(bias) };
    if let (Epilogue::BgradB, Some(bp)) = (key.epilogue, g.bias) {
        let (_, (brs, bcs)) = p.strides();
        for c in 0..n {
            let mut acc = 0f32;
            for l in 0..k {
                // SAFETY: op(B)'s elements lie in the range `check` verified.
                acc += unsafe { load(key.dtype, g.b, (l as isize * brs + c as isize * bcs) as usize) };
            }
            // SAFETY: the bias gradient's n elements were range-checked above.
            unsafe { store(key.dtype, bp, c, acc) };
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::round_tf32;

    #[test]
    fn tf32_keeps_ten_mantissa_bits_rounding_to_nearest_even() {
        assert_eq!(round_tf32(1.0), 1.0);
        let ulp = 2f32.powi(-10);
        assert_eq!(round_tf32(1.0 + ulp), 1.0 + ulp);
        // Just below half an ulp rounds down, just above rounds up, a tie goes to even.
        assert_eq!(round_tf32(1.0 + ulp * 0.49), 1.0);
        assert_eq!(round_tf32(1.0 + ulp * 0.51), 1.0 + ulp);
        assert_eq!(round_tf32(1.0 + ulp * 0.5), 1.0);
        assert_eq!(round_tf32(1.0 + ulp * 1.5), 1.0 + 2.0 * ulp);
        assert!(round_tf32(f32::NAN).is_nan());
        assert_eq!(round_tf32(f32::INFINITY), f32::INFINITY);
    }
}
