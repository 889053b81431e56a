//! CTC loss on the GPU (`cuda/ctc.cu`), the twin of `backend/cpu/ctc.rs`:
//! the same checks, per-sequence nll and the true derivative with respect
//! to the log-probabilities, one block per sequence with f64 α/β.

use super::{kernels, CudaDevice, CudaStorage, LaunchConfig};
use crate::backend::cpu::ctc::{check, CtcDims};
use crate::backend::cpu::CpuStorage;
use crate::error::{Error, Result};
use crate::tensor::DType;

/// Threads per sequence block (the kernel loops over states and pairs).
pub(super) const THREADS: u32 = 256;

/// Per-sequence negative log-likelihoods (f64, left on the device), and
/// with `want_grad` the gradient of each sequence's nll with respect to
/// log_probs (zero past its length, and zero for a sequence whose nll is
/// not finite).
pub fn ctc_loss(lp: &CudaStorage, targets: &[i64], il: &[usize], tl: &[usize], d: &CtcDims, want_grad: bool) -> Result<(CudaStorage, Option<CudaStorage>)> {
    ctc_loss_any(lp, targets, il, tl, d, want_grad, None)
}

/// The device buffers and sizes of one launch of the recursion kernel
/// (`ctc_loss_fused` or a kernel-lab variant with its contract).
pub(super) struct RecursionArgs<'a> {
    pub dev: &'a CudaDevice,
    pub dt: DType,
    pub logits: &'a CudaStorage,
    pub lse: &'a CudaStorage,
    pub targets: &'a CudaStorage,
    pub in_len: &'a CudaStorage,
    pub tgt_len: &'a CudaStorage,
    pub alpha: &'a CudaStorage,
    pub beta: &'a CudaStorage,
    pub nll: &'a CudaStorage,
    pub grad: &'a CudaStorage,
    /// B, T, V, S, blank and want_grad, as the kernels take them.
    pub dims: (i64, i64, i64, i64, i64, i32),
}

/// Launches the fused recursion for [`ctc_loss_fused_by`].
pub(super) type Recursion<'f> = &'f dyn Fn(&RecursionArgs) -> Result<()>;

/// Production's recursion: one block of THREADS per sequence.
fn production_recursion(a: &RecursionArgs) -> Result<()> {
    let (nb, t, v, sm, blank, want) = a.dims;
    let cfg = LaunchConfig::rows(nb as usize, THREADS);
    kernels::ctc::ctc_loss_fused(a.dev, a.dt, cfg, a.logits, a.lse, a.targets, a.in_len, a.tgt_len, a.alpha, a.beta, a.nll, a.grad, nb, t, v, sm, blank, want)
}

/// The fused CTC (`ctc_lse_rows` + `ctc_loss_fused`): the same nll from the
/// logits (B, T, V), the log-softmax folded in (each row's log-sum-exp in
/// f64, the log-probabilities never written), and the gradient with
/// respect to the logits: in their dtype, f32 for f16/bf16 logits (read as
/// they are, never copied to f32).
pub fn ctc_loss_fused(
    logits: &CudaStorage,
    targets: &[i64],
    il: &[usize],
    tl: &[usize],
    d: &CtcDims,
    want_grad: bool,
) -> Result<(CudaStorage, Option<CudaStorage>)> {
    ctc_loss_any(logits, targets, il, tl, d, want_grad, Some(&production_recursion))
}

/// [`ctc_loss_fused`] with the recursion launched by `recursion` (the
/// kernel lab's variants, src/backend/cuda/lab.rs).
pub(super) fn ctc_loss_fused_by(
    logits: &CudaStorage,
    targets: &[i64],
    il: &[usize],
    tl: &[usize],
    d: &CtcDims,
    want_grad: bool,
    recursion: Recursion,
) -> Result<(CudaStorage, Option<CudaStorage>)> {
    ctc_loss_any(logits, targets, il, tl, d, want_grad, Some(recursion))
}

fn ctc_loss_any(
    lp: &CudaStorage,
    targets: &[i64],
    il: &[usize],
    tl: &[usize],
    d: &CtcDims,
    want_grad: bool,
    fused: Option<Recursion>,
) -> Result<(CudaStorage, Option<CudaStorage>)> {
    check(d, targets, il, tl)?;
    let dt = lp.dtype();
    // f16/bf16 logits go into the fused CTC as they are, with an f32
    // gradient; the unfused CTC takes f32/f64 log-probabilities.
    let half = matches!(dt, DType::F16 | DType::BF16);
    if !(dt == DType::F32 || dt == DType::F64 || (half && fused.is_some())) {
        return Err(crate::backend::cpu::unsupported(if fused.is_some() { "ctc_loss_fused" } else { "ctc_loss" }, dt));
    }
    let gt = super::loss::loss_dtype(dt);
    let n = d.b * d.t * d.v;
    if lp.len() != n || targets.len() != d.b * d.s {
        return Err(Error::invalid("ctc_loss", format!("expected {n} log-probs and {} targets for {d:?}, got {} and {}", d.b * d.s, lp.len(), targets.len())));
    }
    let dev = lp.device();
    // The unfused kernel writes only the occupied (t, k): the rest of the
    // gradient is a memset, not B blocks writing B·T·V zeros (cuda/ctc.cu);
    // the fused path's ctc_lse_rows writes every element.
    let grad = match (want_grad, fused.is_some()) {
        (false, _) => None,
        (true, false) => Some(dev.zeros(gt, n)?),
        (true, true) => Some(dev.alloc(gt, n)?),
    };
    if d.b == 0 {
        return Ok((dev.alloc(DType::F64, 0)?, grad));
    }
    // Empty host arrays still upload one element, so every pointer is valid.
    let upload = |v: Vec<i64>| CudaStorage::from_cpu(dev, &CpuStorage::I64(if v.is_empty() { vec![0] } else { v }));
    let tg = upload(targets.to_vec())?;
    let ils = upload(il.iter().map(|&x| x as i64).collect())?;
    let tls = upload(tl.iter().map(|&x| x as i64).collect())?;
    let ws = (d.b * d.t * (2 * d.s + 1)).max(1);
    let alpha = dev.alloc(DType::F64, ws)?;
    let beta = dev.alloc(DType::F64, ws)?;
    let nll = dev.alloc(DType::F64, d.b)?;
    let dummy;
    let g = match &grad {
        Some(g) if n > 0 => g,
        _ => {
            dummy = dev.alloc(gt, 1)?;
            &dummy
        }
    };
    let cfg = LaunchConfig::rows(d.b, THREADS);
    let (nb, t, v, sm, blank, want) = (d.b as i64, d.t as i64, d.v as i64, d.s as i64, d.blank as i64, (want_grad && n > 0) as i32);
    if let Some(recursion) = fused {
        let rows = d.b * d.t;
        let lse = dev.alloc(DType::F64, rows.max(1))?;
        if rows > 0 && d.v > 0 {
            kernels::ctc::ctc_lse_rows(dev, dt, LaunchConfig::rows(rows, THREADS), lp, &lse, g, &ils, t, rows as i64, v, want)?;
        }
        recursion(&RecursionArgs {
            dev,
            dt,
            logits: lp,
            lse: &lse,
            targets: &tg,
            in_len: &ils,
            tgt_len: &tls,
            alpha: &alpha,
            beta: &beta,
            nll: &nll,
            grad: g,
            dims: (nb, t, v, sm, blank, want),
        })?;
    } else {
        kernels::ctc::ctc_loss(dev, dt, cfg, lp, &tg, &ils, &tls, &alpha, &beta, &nll, g, nb, t, v, sm, blank, want)?;
    }
    Ok((nll, grad))
}
