//! CTC loss over log-probabilities (B, T, V), as `torch.nn.functional.ctc_loss`
//! with `zero_infinity` and the sum / mean / none reductions.

use super::{out, out_storage};
use crate::autograd::record;
use crate::backend::cpu::ctc::{self as k, CtcDims};
use crate::backend::cpu::CpuStorage;
use crate::backend::{cuda, Storage};
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

/// How per-sequence losses are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    /// One loss per sequence, shape (B).
    None,
    /// The sum over the batch.
    Sum,
    /// PyTorch's mean: each loss divided by its target length (at least 1), then averaged.
    Mean,
}

/// CTC loss. `log_probs` (B, T, V), `targets` (B, S) i64 padded (only the
/// first `target_lengths[b]` used), `blank` the blank id. A target that no
/// alignment can produce (longer than its input, or repeats that do not fit)
/// gives an infinite loss and a zero gradient, as PyTorch's; with
/// `zero_infinity` its loss is 0 as well.
pub fn ctc_loss(
    log_probs: &Tensor,
    targets: &Tensor,
    input_lengths: &[usize],
    target_lengths: &[usize],
    blank: usize,
    reduction: Reduction,
    zero_infinity: bool,
) -> Result<Tensor> {
    ctc_loss_any(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity, false)
}

/// The fused CTC (the fusion switch's `loss` family): `ctc_loss(log_softmax(logits), ...)`
/// in the kernels' single pass over the logits (each row's log-sum-exp in
/// f64; the log-probabilities are never written), the gradient with respect
/// to the logits written by the forward. f16/bf16 logits (autocast's CTC
/// head) go in as they are on a GPU: the losses are f32 and the gradient
/// comes back in the logits' dtype, the same bits as through their f32
/// copy, which is never made; the CPU (no half arithmetic) takes the copy.
pub fn ctc_loss_fused(
    logits: &Tensor,
    targets: &Tensor,
    input_lengths: &[usize],
    target_lengths: &[usize],
    blank: usize,
    reduction: Reduction,
    zero_infinity: bool,
) -> Result<Tensor> {
    if matches!(logits.dtype(), DType::F16 | DType::BF16) && logits.device() == crate::tensor::Device::Cpu {
        let wide = super::widen_half(logits)?;
        return ctc_loss_any(&wide, targets, input_lengths, target_lengths, blank, reduction, zero_infinity, true);
    }
    ctc_loss_any(logits, targets, input_lengths, target_lengths, blank, reduction, zero_infinity, true)
}

#[allow(clippy::too_many_arguments)]
fn ctc_loss_any(
    log_probs: &Tensor,
    targets: &Tensor,
    input_lengths: &[usize],
    target_lengths: &[usize],
    blank: usize,
    reduction: Reduction,
    zero_infinity: bool,
    fused: bool,
) -> Result<Tensor> {
    super::expect_rank("ctc_loss", "log_probs (B, T, V)", log_probs, &[3])?;
    super::expect_rank("ctc_loss", "targets (B, S)", targets, &[2])?;
    if targets.dtype() != DType::I64 {
        return Err(Error::DTypeMismatch { op: "ctc_loss", expected: DType::I64, got: targets.dtype() });
    }
    let (b, t, v) = (log_probs.dims()[0], log_probs.dims()[1], log_probs.dims()[2]);
    if targets.dims()[0] != b {
        return Err(Error::ShapeMismatch { op: "ctc_loss", expected: format!("targets for {b} sequences"), got: format!("{}", targets.shape()) });
    }
    let d = CtcDims { b, t, v, s: targets.dims()[1], blank };
    let tg = targets.to_vec::<i64>()?;
    let want = crate::autograd::needs_grad(&[log_probs]);
    let dtype = log_probs.dtype();
    let dev = log_probs.device();
    // The per-sequence losses in the input's dtype (f32 for half logits),
    // an infinite one zeroed under `zero_infinity`; on a GPU they never
    // leave the device. The
    // kernels already give a non-finite sequence a zero gradient, so a
    // zeroed loss has no gradient either.
    let (per, grad) = match &*log_probs.storage() {
        Storage::Cpu(c) => {
            let (mut n, g) = if fused {
                k::ctc_loss_fused(c, &tg, input_lengths, target_lengths, &d, want)?
            } else {
                k::ctc_loss(c, &tg, input_lengths, target_lengths, &d, want)?
            };
            if zero_infinity {
                n.iter_mut().filter(|l| l.is_infinite()).for_each(|l| *l = 0.0);
            }
            (Storage::Cpu(CpuStorage::F64(n).to_dtype(dtype)), g.map(Storage::Cpu))
        }
        Storage::Cuda(c) => {
            let (n, g) = if fused {
                cuda::ctc::ctc_loss_fused(c, &tg, input_lengths, target_lengths, &d, want)?
            } else {
                cuda::ctc::ctc_loss(c, &tg, input_lengths, target_lengths, &d, want)?
            };
            (Storage::Cuda(cuda::loss::rows_to(&n, cuda::loss::loss_dtype(dtype), zero_infinity)?), g.map(Storage::Cuda))
        }
    };
    let per = out_storage(per, [b]);
    let grad = grad.map(|g| out_storage(g, log_probs.shape().clone()));
    let saved: Vec<Tensor> = grad.iter().cloned().collect();
    let per = record(if fused { "ctc_loss_fused" } else { "ctc_loss" }, &[log_probs], per, saved, move |g, _| {
        let grad = grad.ok_or_else(|| Error::Autograd("ctc_loss: no gradient was computed in the forward".into()))?;
        // An f32 gradient of half logits is scaled in f32, then cast once.
        let dx = super::mul(&grad, &super::reshape(g, [b, 1, 1])?)?;
        Ok(vec![Some(if dx.dtype() == dtype { dx } else { super::to_dtype(&dx, dtype)? })])
    });
    match reduction {
        Reduction::None => Ok(per),
        Reduction::Sum => super::sum_all(&per),
        Reduction::Mean => {
            let inv: Vec<f64> = target_lengths.iter().map(|&l| 1.0 / l.max(1) as f64).collect();
            let w = out(CpuStorage::F64(inv).to_dtype(per.dtype()), [b]).to_device(&dev)?;
            super::mean_all(&super::mul(&per, &w)?)
        }
    }
}
