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

fn gemm_one<T: Float>(d: &MatmulDims, a: &[T], b: &[T], c: &mut [T], par: Parallelism) {
    let (m, n, k) = (d.m, d.n, d.k);
    let (a_rs, a_cs) = if d.trans_a { (1, m as isize) } else { (k as isize, 1) };
    let (b_rs, b_cs) = if d.trans_b { (1, k as isize) } else { (n as isize, 1) };
    // Bounds the pointers below may reach; the callers slice exactly these.
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    // SAFETY: `a`, `b` and `c` are live slices of at least m·k, k·n and m·n
    // elements (asserted above); the strides address exactly those row-major
    // (or, for a transposed operand, column-major) matrices, so every element
    // gemm reads or writes lies inside its slice, and `c` is borrowed mutably
    // and alone. T is f32 or f64, types gemm implements.
    unsafe {
        gemm::gemm(m, n, k, c.as_mut_ptr(), 1, n as isize, false, a.as_ptr(), a_cs, a_rs, b.as_ptr(), b_cs, b_rs, T::zero(), T::one(), false, false, false, par)
    }
}

/// One single-threaded product `c = op(a)·op(b)` of `d`'s shape (its batch
/// and strides ignored) into `c`, overwriting it; for callers that already
/// run one task per thread.
pub(crate) fn gemm_into<T: Float>(d: &MatmulDims, a: &[T], b: &[T], c: &mut [T]) {
    if d.m * d.n == 0 {
        return;
    }
    if d.k == 0 {
        c[..d.m * d.n].fill(T::zero());
        return;
    }
    gemm_one(d, a, b, c, Parallelism::None);
}

pub(crate) fn matmul_t<T: Float>(d: &MatmulDims, a: &[T], b: &[T]) -> Vec<T> {
    let (m, n, k) = (d.m, d.n, d.k);
    let mut c = vec![T::zero(); d.batch * m * n];
    if m * n == 0 {
        return c;
    }
    let big = m * n * k >= PAR_GEMM;
    let run = |bi: usize, cm: &mut [T], par| {
        let a = &a[bi * d.a_stride..bi * d.a_stride + m * k];
        let b = &b[bi * d.b_stride..bi * d.b_stride + k * n];
        gemm_one(d, a, b, cm, par);
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
