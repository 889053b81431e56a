//! Token accuracy, as WeNet's `th_accuracy`: the fraction of non-ignored
//! target tokens that are the argmax of their logits. Not differentiable.
//! On a GPU the hits are counted there and the result stays on the device,
//! so it is read back with the losses, not on its own.

use super::out_storage;
use crate::backend::cpu::{loss as k, CpuStorage};
use crate::backend::{cuda, Storage};
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

/// The accuracy of logits (B, L, V) against targets (B, L) i64, skipping
/// `ignore`, as an f64 scalar on the logits' device (0 when no token counts).
pub fn token_accuracy(logits: &Tensor, target: &Tensor, ignore: i64) -> Result<Tensor> {
    super::expect_rank("token_accuracy", "logits (B, L, V)", logits, &[3])?;
    let (b, l, v) = (logits.dims()[0], logits.dims()[1], logits.dims()[2]);
    super::expect_shape("token_accuracy", "target", target, &[b, l])?;
    if target.dtype() != DType::I64 {
        return Err(Error::DTypeMismatch { op: "token_accuracy", expected: DType::I64, got: target.dtype() });
    }
    let tg = target.to_vec::<i64>()?;
    let valid = tg.iter().filter(|&&t| t != ignore).count().max(1) as f64;
    if matches!(logits.dtype(), DType::F16 | DType::BF16) && logits.device() == crate::tensor::Device::Cpu {
        // The CPU's argmax reads f32/f64: its f32 copy (the GPU reads half as it is).
        return token_accuracy(&super::widen_half(logits)?, target, ignore);
    }
    let acc = match &*logits.storage() {
        Storage::Cpu(c) => {
            let hits = k::token_hits(c, &tg, v, ignore)?;
            Storage::Cpu(CpuStorage::F64(vec![hits.iter().sum::<f64>() / valid]))
        }
        Storage::Cuda(c) => Storage::Cuda(cuda::loss::rows_total(&cuda::loss::token_hits(c, &tg, v, ignore)?, DType::F64, valid)?),
    };
    Ok(out_storage(acc, ()))
}
