//! Matrix products through the `gemm` crate. The `matmul` criterion bench
//! (benches/ops.rs) times it against `matrixmultiply` on the same shapes:
//! under load gemm led at 512³ and 1024³; idle the two were close (gemm
//! ahead at 1024³, behind at 512³). gemm also covers f16 for later.
//!
//! `C[b] = op(A[b]) · op(B[b])` with `op(A)` of shape (M, K) and `op(B)` of
//! shape (K, N). A transposed operand is read through swapped strides,
//! never copied. A batch stride of 0 broadcasts an operand over the batch.

use super::{CpuStorage, Float};
use crate::error::{Error, Result};
use crate::float_match;
use gemm::Parallelism;
use rayon::prelude::*;

/// The shape of one (batched) product.
#[derive(Clone, Copy, Debug)]
pub struct MatmulDims {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    /// Elements between consecutive A matrices (0: shared).
    pub a_stride: usize,
    /// Elements between consecutive B matrices (0: shared).
    pub b_stride: usize,
}

/// Products at least this large (m·n·k) use all cores inside one GEMM.
const PAR_GEMM: usize = 96 * 96 * 96;

/// An operand read through strides: element (i, j) at `i·rs + j·cs`.
#[derive(Clone, Copy)]
pub(crate) struct View<'a, T> {
    pub data: &'a [T],
    pub rs: usize,
    pub cs: usize,
}

/// `c = a·b`, or `c += a·b` when `acc`, for (m×k)·(k×n) operands read
/// through strides into `c` with row stride `ldc`: the one call into gemm.
fn gemm_raw<T: Float>(m: usize, n: usize, k: usize, a: View<T>, b: View<T>, c: &mut [T], ldc: usize, acc: bool, par: Parallelism) {
    gemm_alpha(m, n, k, a, b, c, ldc, acc, T::one(), par)
}

/// `c = alpha·a·b`, or `c += alpha·a·b` when `acc` (gemm_raw's product scaled
/// inside the GEMM, one rounding).
#[allow(clippy::too_many_arguments)]
fn gemm_alpha<T: Float>(m: usize, n: usize, k: usize, a: View<T>, b: View<T>, c: &mut [T], ldc: usize, acc: bool, alpha: T, par: Parallelism) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !acc {
            for row in c.chunks_mut(ldc.max(1)).take(m) {
                row[..n].fill(T::zero());
            }
        }
        return;
    }
    // The last element each pointer below may reach lies inside its slice.
    assert!((m - 1) * a.rs + (k - 1) * a.cs < a.data.len() && (k - 1) * b.rs + (n - 1) * b.cs < b.data.len() && (m - 1) * ldc + n - 1 < c.len());
    // SAFETY: every element gemm reads or writes is (i, j) at i·rs + j·cs of
    // its operand for i, j below the dims, so at most the offsets asserted
    // above, inside the live slices; `c` is borrowed mutably and alone, so
    // it aliases neither operand. T is f32 or f64, types gemm implements.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            ldc as isize,
            acc,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            T::one(),
            alpha,
            false,
            false,
            false,
            par,
        )
    }
}

fn gemm_one<T: Float>(d: &MatmulDims, a: &[T], b: &[T], c: &mut [T], acc: bool, alpha: T, par: Parallelism) {
    let (m, n, k) = (d.m, d.n, d.k);
    let (a_rs, a_cs) = if d.trans_a { (1, m) } else { (k, 1) };
    let (b_rs, b_cs) = if d.trans_b { (1, k) } else { (n, 1) };
    gemm_alpha(m, n, k, View { data: a, rs: a_rs, cs: a_cs }, View { data: b, rs: b_rs, cs: b_cs }, c, n, acc, alpha, par);
}

/// One single-threaded `c = a·b` (or `c += a·b` when `acc`) of (m×k)·(k×n)
/// strided operands into `c` of row stride `ldc`, for callers that already
/// run one task per thread and work on blocks of larger matrices.
pub(crate) fn gemm_view<T: Float>(m: usize, n: usize, k: usize, a: View<T>, b: View<T>, c: &mut [T], ldc: usize, acc: bool) {
    gemm_raw(m, n, k, a, b, c, ldc, acc, Parallelism::None);
}

pub(crate) fn matmul_t<T: Float>(d: &MatmulDims, a: &[T], b: &[T]) -> Vec<T> {
    matmul_acc(d, a, b, T::one(), None)
}

/// `alpha·op(a)·op(b)`, plus `acc` (the whole result's size) when given.
fn matmul_acc<T: Float>(d: &MatmulDims, a: &[T], b: &[T], alpha: T, acc: Option<&[T]>) -> Vec<T> {
    let (m, n, k) = (d.m, d.n, d.k);
    let mut c = super::pool::zeroed(d.batch * m * n);
    if let Some(acc) = acc {
        c.copy_from_slice(acc);
    }
    let add = acc.is_some();
    if m * n == 0 {
        return c;
    }
    let big = m * n * k >= PAR_GEMM;
    let run = |bi: usize, cm: &mut [T], par| {
        let a = &a[bi * d.a_stride..bi * d.a_stride + m * k];
        let b = &b[bi * d.b_stride..bi * d.b_stride + k * n];
        gemm_one(d, a, b, cm, add, alpha, par);
    };
    if big || d.batch == 1 {
        let par = if big { Parallelism::Rayon(rayon::current_num_threads()) } else { Parallelism::None };
        for (bi, cm) in c.chunks_mut(m * n).enumerate() {
            run(bi, cm, par);
        }
    } else {
        c.par_chunks_mut(m * n).enumerate().for_each(|(bi, cm)| run(bi, cm, Parallelism::None));
    }
    c
}

/// The batched product; checks that both operands hold what `d` says.
pub fn matmul(d: &MatmulDims, a: &CpuStorage, b: &CpuStorage) -> Result<CpuStorage> {
    let need = |stride: usize, one: usize| if d.batch == 0 { 0 } else { (d.batch - 1) * stride + one };
    if a.len() < need(d.a_stride, d.m * d.k) || b.len() < need(d.b_stride, d.k * d.n) {
        return Err(Error::invalid("matmul", format!("operands of {} and {} elements are too small for {d:?}", a.len(), b.len())));
    }
    Ok(float_match!("matmul", (a, b), |a, b| Float::store(matmul_t(d, a, b))))
}

/// `alpha·op(a)·op(b)` with the scale inside the GEMM, plus `acc` when given
/// (same type, `batch·m·n` elements): the reference of the GPU's alpha/beta.
pub fn matmul_scaled(d: &MatmulDims, a: &CpuStorage, b: &CpuStorage, alpha: f64, acc: Option<&CpuStorage>) -> Result<CpuStorage> {
    let need = |stride: usize, one: usize| if d.batch == 0 { 0 } else { (d.batch - 1) * stride + one };
    if a.len() < need(d.a_stride, d.m * d.k) || b.len() < need(d.b_stride, d.k * d.n) {
        return Err(Error::invalid("matmul", format!("operands of {} and {} elements are too small for {d:?}", a.len(), b.len())));
    }
    if let Some(c) = acc {
        if c.len() != d.batch * d.m * d.n || c.dtype() != a.dtype() {
            return Err(Error::invalid(
                "matmul",
                format!("an accumulator of {} {:?} elements for a {:?} product of {}", c.len(), c.dtype(), a.dtype(), d.batch * d.m * d.n),
            ));
        }
    }
    Ok(match (a, b, acc) {
        (CpuStorage::F32(a), CpuStorage::F32(b), Some(CpuStorage::F32(c))) => Float::store(matmul_acc(d, a, b, alpha as f32, Some(c))),
        (CpuStorage::F64(a), CpuStorage::F64(b), Some(CpuStorage::F64(c))) => Float::store(matmul_acc(d, a, b, alpha, Some(c))),
        (a, b, None) => float_match!("matmul", (a, b), |a, b| Float::store(matmul_acc(d, a, b, super::of_as(a, alpha), None))),
        (a, b, _) if a.dtype() != b.dtype() => return Err(Error::DTypeMismatch { op: "matmul", expected: a.dtype(), got: b.dtype() }),
        (a, _, _) => return Err(super::unsupported("matmul", a.dtype())),
    })
}

/// `x·wᵀ + bias` for x (m×k), w (n×k) and bias (n), as `linear`: the output
/// rows start as copies of the bias and the GEMM accumulates the product
/// into them, so the bias costs what zeroing the output did.
pub fn linear_bias(x: &CpuStorage, w: &CpuStorage, bias: &CpuStorage, m: usize, n: usize, k: usize) -> Result<CpuStorage> {
    if x.len() != m * k || w.len() != n * k || bias.len() != n {
        return Err(Error::invalid(
            "linear",
            format!("expected x of {m}x{k}, w of {n}x{k} and a bias of {n} elements, got {}, {} and {}", x.len(), w.len(), bias.len()),
        ));
    }
    Ok(float_match!("linear", (x, w, bias), |x, w, b| Float::store(linear_bias_t(x, w, b, m, n, k))))
}

fn linear_bias_t<T: Float>(x: &[T], w: &[T], b: &[T], m: usize, n: usize, k: usize) -> Vec<T> {
    let mut c = if (m * n).saturating_mul(std::mem::size_of::<T>()) >= super::pool::MIN_BYTES {
        // Large outputs reuse a pooled buffer (zeroed), then take the bias.
        let mut c = super::pool::zeroed(m * n);
        for row in c.chunks_exact_mut(n.max(1)) {
            row.copy_from_slice(b);
        }
        c
    } else {
        let mut c = Vec::with_capacity(m * n);
        for _ in 0..m {
            c.extend_from_slice(b);
        }
        c
    };
    let par = if m * n * k >= PAR_GEMM { Parallelism::Rayon(rayon::current_num_threads()) } else { Parallelism::None };
    gemm_raw(m, n, k, View { data: x, rs: k, cs: 1 }, View { data: w, rs: 1, cs: k }, &mut c, n, true, par);
    c
}
