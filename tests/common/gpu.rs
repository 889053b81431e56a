//! The one GPU test harness: every kernel test and the `Cuda(0)` column of
//! the `grad!` table get their device, their poisoning, their grid cap and
//! their closeness rule here.
//!
//! - `gpu(test)`: `Cuda(0)`, or `None` after printing exactly why the test
//!   skips. Where a GPU is required (`ASRFORGE_CUDA_EMU=1`, the emulated
//!   device, or `ASRFORGE_REQUIRE_GPU=1`), a missing device is a test
//!   failure instead, so CI can demand zero skips.
//! - Before the first device call of the process, fresh allocations are
//!   poisoned (`ASRFORGE_CUDA_POISON=1`: f32/f16/bf16 read NaN), so an
//!   element a kernel never writes fails; and the 1-D grid is capped
//!   (`ASRFORGE_CUDA_MAX_GRID`, `TEST_MAX_GRID` blocks unless already set),
//!   so every grid-stride loop wraps on inputs of a few 10k elements.
//! - `assert_close(what, got, want, tol, seed)`: per element
//!   |got − want| ≤ tol·(|want| + rms(want)); NaN or inf in either side
//!   never passes; on failure it prints the seed, the worst element and
//!   how many failed.
//!
//! Tolerances per dtype (`tol`), sized from what the kernels do:
//! - f32 1e-5: kernels accumulate in f32 (or f64) in a different order
//!   from the CPU (block trees against running sums), an error of a few
//!   √n·2⁻²⁴ for the rows tested (n ≤ 4097: ≈ 4e-6 at worst by a random
//!   walk); CUDA's and libm's exp/log/tanh differ by ≤ 2 ulp (1.2e-7), and
//!   nvcc contracts a·b+c into FMA where g++ does not (one rounding, 6e-8).
//! - f64 1e-10: the same reorderings at 2⁻⁵³ ≈ 1.1e-16, 10⁶ below.
//! - tf32 3e-4: cuBLAS TF32 products round both operands to 10 mantissa
//!   bits (2⁻¹¹ ≈ 4.9e-4 each, averaging out over a dot product).
//! - f16 1e-3: half kernels read half, compute in f32 and round the result
//!   once: half an ulp of f16 is 2⁻¹¹ ≈ 4.9e-4, so 1e-3 is two of them.
//! - bf16 1e-2: likewise with half an ulp of 2⁻⁸ ≈ 3.9e-3.
//!
//! The `rms(want)` floor scales the absolute part of the tolerance to the
//! tensor's magnitude: a sum whose terms cancel has an error proportional
//! to its terms, not to its (small) value.
#![allow(dead_code)]

use asrforge::{DType, Device};
use std::sync::Once;

/// The 1-D grid cap of the GPU tests: odd and small, so a launch over more
/// than 37·256 elements (or 37 rows) loops in every grid-stride kernel.
pub const TEST_MAX_GRID: u32 = 37;

/// f32 relative tolerance (see the module comment).
pub const F32: f64 = 1e-5;
/// f64 relative tolerance.
pub const F64: f64 = 1e-10;
/// TF32 (cuBLAS tensor-core f32) relative tolerance.
pub const TF32: f64 = 3e-4;
/// f16 relative tolerance (results rounded to f16 once).
pub const F16: f64 = 1e-3;
/// bf16 relative tolerance (results rounded to bf16 once).
pub const BF16: f64 = 1e-2;

/// The tolerance of results computed in `dt`.
pub fn tol(dt: DType) -> f64 {
    match dt {
        DType::F64 => F64,
        DType::F16 => F16,
        DType::BF16 => BF16,
        _ => F32,
    }
}

static SETUP: Once = Once::new();

/// Sets the process-wide test environment once, before the first CUDA call.
fn setup() {
    SETUP.call_once(|| {
        std::env::set_var("ASRFORGE_CUDA_POISON", "1");
        if std::env::var_os("ASRFORGE_CUDA_MAX_GRID").is_none() {
            std::env::set_var("ASRFORGE_CUDA_MAX_GRID", TEST_MAX_GRID.to_string());
        }
    });
}

/// Why a GPU is required here (a skip then fails), if it is.
pub fn required_by() -> Option<&'static str> {
    ["ASRFORGE_CUDA_EMU", "ASRFORGE_REQUIRE_GPU"].into_iter().find(|v| std::env::var_os(v).is_some_and(|x| x == "1"))
}

/// `Cuda(0)` with poisoned allocations and a capped grid, or `None` after
/// printing why `test` skips; panics where a GPU is required.
pub fn gpu(test: &str) -> Option<Device> {
    setup();
    match Device::cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            if let Some(var) = required_by() {
                panic!("{test}: {var}=1 requires a GPU device, but cuda:0 is not usable: {e}");
            }
            println!("{test}: skipped, no usable GPU: {e}");
            None
        }
    }
}

/// `got` against `want` element by element: |g − w| ≤ tol·(|w| + rms(want)).
/// NaN or inf on either side fails. Prints the seed and the worst element.
pub fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64, seed: u64) {
    assert_close_floor(what, got, want, tol, 0.0, seed)
}

/// `assert_close` with the absolute part of the tolerance at least `floor`:
/// |g − w| ≤ tol·(|w| + max(rms(want), floor)). For a sum of n terms of RMS
/// σ the rounding errors of either side grow with the terms, not with the
/// (possibly cancelled) result: the floor is then √n·σ, the typical
/// magnitude of such a sum (n·σ would be the worst-case bound).
pub fn assert_close_floor(what: &str, got: &[f64], want: &[f64], tol: f64, floor: f64, seed: u64) {
    assert_eq!(got.len(), want.len(), "{what}: got {} elements, want {} (seed {seed})", got.len(), want.len());
    if let Some(i) = want.iter().position(|w| !w.is_finite()) {
        panic!("{what}: the reference itself is {} at element {i} (seed {seed})", want[i]);
    }
    let rms = (want.iter().map(|w| w * w).sum::<f64>() / want.len().max(1) as f64).sqrt().max(floor);
    let mut worst: Option<(usize, f64)> = None;
    let mut failed = 0usize;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let allowed = tol * (w.abs() + rms);
        // A non-finite result has an infinite ratio, so it is always the worst.
        let ratio = if g.is_finite() { (g - w).abs() / allowed.max(f64::MIN_POSITIVE) } else { f64::INFINITY };
        if !(ratio <= 1.0) {
            failed += 1;
        }
        if worst.is_none_or(|(_, r)| ratio > r) {
            worst = Some((i, ratio));
        }
    }
    if failed > 0 {
        let (i, ratio) = worst.expect("a failure has a worst element");
        panic!(
            "{what}: {failed} of {} elements out of tolerance {tol:e}·(|want| + {rms:.3e}); worst element {i}: got {}, want {} ({ratio:.3} × the tolerance) (seed {seed})",
            got.len(),
            got[i],
            want[i]
        );
    }
}

/// `assert_close` where the reference may hold infinities (a CTC loss of an
/// impossible alignment): those elements must be the same infinity, the
/// finite rest is compared as usual. NaN still never passes.
pub fn assert_close_or_same_inf(what: &str, got: &[f64], want: &[f64], tol: f64, seed: u64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths (seed {seed})");
    let (mut g, mut w) = (Vec::new(), Vec::new());
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        if b.is_infinite() {
            assert_eq!(a, b, "{what}: element {i}: got {a}, want {b} (seed {seed})");
        } else {
            g.push(a);
            w.push(b);
        }
    }
    assert_close(what, &g, &w, tol, seed);
}

/// Serialises the tests of one file that read process-wide device counters
/// (a poisoned lock is taken over: one failed test does not fail the rest).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}
