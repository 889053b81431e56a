//! The kernel lab (`cuda/lab_<family>.cu`, see cuda/README.md): numbered
//! variants of a fused kernel kept beside the production one, each with the
//! production kernel's contract, so tests/kernel_lab.rs can check every
//! variant against the CPU reference and benches/kernel_lab.rs can time
//! them against production on the same inputs.

use super::ctc::{ctc_loss_fused_by, RecursionArgs};
use super::kernels::lab_loss as k;
use super::{CudaStorage, LaunchConfig};
use crate::backend::cpu::ctc::CtcDims;
use crate::backend::cpu::CpuStorage;
use crate::error::{Error, Result};
use crate::tensor::DType;

/// Threads per row block (`LAB_THREADS`).
const THREADS: u32 = 256;

/// The variants of `label_smoothing_fused_fwd` in cuda/lab_loss.cu, by name.
pub const LABEL_SMOOTHING_FUSED_FWD: &[&str] = &["v1_two_pass", "v2_online_16byte_loads"];

/// Runs variant `variant` (a name of [`LABEL_SMOOTHING_FUSED_FWD`]) of the
/// fused label-smoothing forward on f32 logits (rows, v): each row's KL and
/// log-sum-exp (f64 on the device), as `loss::label_smoothing_fused_fwd`.
pub fn label_smoothing_fused_fwd(variant: &str, x: &CudaStorage, target: &[i64], v: usize, smoothing: f64, ignore: i64) -> Result<(CudaStorage, CudaStorage)> {
    let op = "lab label_smoothing_fused_fwd";
    if x.dtype() != DType::F32 {
        return Err(Error::DTypeMismatch { op, expected: DType::F32, got: x.dtype() });
    }
    crate::backend::cpu::loss::check_targets(target, v, ignore)?;
    let rows = target.len();
    if x.len() != rows * v {
        return Err(Error::invalid(op, format!("expected {rows} rows of {v} logits ({} values), got {} values", rows * v, x.len())));
    }
    let dev = x.device();
    let kl = dev.alloc(DType::F64, rows)?;
    let lse = dev.alloc(DType::F64, rows)?;
    if rows == 0 {
        return Ok((kl, lse));
    }
    let tg = CudaStorage::from_cpu(dev, &CpuStorage::I64(target.to_vec()))?;
    let cfg = LaunchConfig::rows(rows, THREADS);
    let (r, n) = (rows as i64, v as i64);
    match variant {
        "v1_two_pass" => k::lab_label_smoothing_fused_fwd_v1(dev, DType::F32, cfg, x, &tg, &kl, &lse, r, n, smoothing, ignore)?,
        "v2_online_16byte_loads" => k::lab_label_smoothing_fused_fwd_v2(dev, DType::F32, cfg, x, &tg, &kl, &lse, r, n, smoothing, ignore)?,
        other => return Err(Error::invalid(op, format!("expected one of {LABEL_SMOOTHING_FUSED_FWD:?}, found {other:?}"))),
    }
    Ok((kl, lse))
}

/// The variants of the fused CTC's recursion (`ctc_loss_fused`) in
/// cuda/lab_ctc.cu, by name.
pub const CTC_LOSS_FUSED: &[&str] = &["v1_warp_per_sequence"];

/// Sequences per block of the warp-per-sequence variant.
const CTC_WARPS: u32 = 4;

/// The fused CTC (`cuda::ctc::ctc_loss_fused`, the same checks, row
/// log-sum-exps and dense gradient) with variant `variant` (a name of
/// [`CTC_LOSS_FUSED`]) running the recursion, on f32 logits (B, T, V):
/// per-sequence nll (f64) and, with `want_grad`, the gradient.
pub fn ctc_loss_fused(
    variant: &str,
    logits: &CudaStorage,
    targets: &[i64],
    il: &[usize],
    tl: &[usize],
    d: &CtcDims,
    want_grad: bool,
) -> Result<(CudaStorage, Option<CudaStorage>)> {
    let op = "lab ctc_loss_fused";
    if logits.dtype() != DType::F32 {
        return Err(Error::DTypeMismatch { op, expected: DType::F32, got: logits.dtype() });
    }
    match variant {
        "v1_warp_per_sequence" => ctc_loss_fused_by(logits, targets, il, tl, d, want_grad, &|a: &RecursionArgs| {
            let (nb, t, v, sm, blank, want) = a.dims;
            let cfg = LaunchConfig::rows((nb as usize).div_ceil(CTC_WARPS as usize), 32 * CTC_WARPS);
            super::kernels::lab_ctc::lab_ctc_loss_fused_v1(
                a.dev, a.dt, cfg, a.logits, a.lse, a.targets, a.in_len, a.tgt_len, a.alpha, a.beta, a.nll, a.grad, nb, t, v, sm, blank, want,
            )
        }),
        other => Err(Error::invalid(op, format!("expected one of {CTC_LOSS_FUSED:?}, found {other:?}"))),
    }
}
