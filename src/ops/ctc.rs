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
    let (mut nll, grad) = match &*log_probs.storage() {
        Storage::Cpu(c) => {
            let (n, g) = k::ctc_loss(c, &tg, input_lengths, target_lengths, &d, want)?;
            (n, g.map(Storage::Cpu))
        }
        Storage::Cuda(c) => {
            let (n, g) = cuda::ctc::ctc_loss(c, &tg, input_lengths, target_lengths, &d, want)?;
            (n, g.map(Storage::Cuda))
        }
    };
    // Sequences whose loss is zeroed also get no gradient.
    let mut keep = vec![1.0; b];
    for (l, kp) in nll.iter_mut().zip(keep.iter_mut()) {
        if zero_infinity && l.is_infinite() {
            *l = 0.0;
            *kp = 0.0;
        }
    }
    let dtype = log_probs.dtype();
    let dev = log_probs.device();
    let per = out(CpuStorage::F64(nll).to_dtype(dtype), [b]).to_device(&dev)?;
    let grad = grad.map(|g| out_storage(g, log_probs.shape().clone()));
    let saved: Vec<Tensor> = grad.iter().cloned().collect();
    let per = record("ctc_loss", &[log_probs], per, saved, move |g, _| {
        let grad = grad.ok_or_else(|| Error::Autograd("ctc_loss: no gradient was computed in the forward".into()))?;
        let keep = out(CpuStorage::F64(keep).to_dtype(dtype), [b]).to_device(&dev)?;
        let scale = super::reshape(&super::mul(g, &keep)?, [b, 1, 1])?;
        Ok(vec![Some(super::mul(&grad, &scale)?)])
    });
    match reduction {
        Reduction::None => Ok(per),
        Reduction::Sum => super::sum_all(&per),
        Reduction::Mean => {
            let inv: Vec<f64> = target_lengths.iter().map(|&l| 1.0 / l.max(1) as f64).collect();
            let w = out(CpuStorage::F64(inv).to_dtype(per.dtype()), [b]).to_device(&per.device())?;
            super::mean_all(&super::mul(&per, &w)?)
        }
    }
}
