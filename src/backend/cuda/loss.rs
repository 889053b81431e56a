//! Label-smoothing loss on the GPU (`cuda/loss.cu`), the twin of
//! `backend/cpu/loss.rs`: per-row KL in one block per row, summed on the
//! host in row order (as the CPU sums), and the gradient p − q.

use super::{dtype_suffix, Arg, CudaStorage, LaunchConfig};
use crate::backend::cpu::CpuStorage;
use crate::error::{Error, Result};
use crate::tensor::DType;

/// Threads per row block (a power of two, at most the kernel's LS_THREADS).
const THREADS: u32 = 256;

/// The summed KL over valid rows, the number of valid rows, and with
/// `want_grad` the gradient of the sum with respect to x.
pub fn label_smoothing(x: &CudaStorage, target: &[i64], v: usize, smoothing: f64, ignore: i64, want_grad: bool) -> Result<(f64, usize, Option<CudaStorage>)> {
    if v < 2 {
        return Err(Error::invalid("label_smoothing_loss", format!("expected a vocabulary of at least 2, got {v}")));
    }
    if let Some(&bad) = target.iter().find(|&&t| t != ignore && (t < 0 || t as usize >= v)) {
        return Err(Error::IndexOutOfRange { op: "label_smoothing_loss (target)", index: bad, size: v });
    }
    let dt = x.dtype();
    if dt != DType::F32 && dt != DType::F64 {
        return Err(crate::backend::cpu::unsupported("label_smoothing_loss", dt));
    }
    let rows = target.len();
    if x.len() != rows * v {
        return Err(Error::invalid("label_smoothing_loss", format!("expected {} logits for {rows} rows of {v}, got {}", rows * v, x.len())));
    }
    let valid = target.iter().filter(|&&t| t != ignore).count();
    let dev = x.device();
    let grad = if want_grad { Some(dev.alloc(dt, rows * v)?) } else { None };
    if rows == 0 {
        return Ok((0.0, 0, grad));
    }
    let tg = CudaStorage::from_cpu(dev, &CpuStorage::I64(target.to_vec()))?;
    let kl = dev.alloc(DType::F64, rows)?;
    let dummy;
    let g = match &grad {
        Some(g) => g,
        None => {
            dummy = dev.alloc(dt, 1)?;
            &dummy
        }
    };
    dev.launch(
        "loss",
        &format!("label_smoothing_{}", dtype_suffix(dt)),
        LaunchConfig::rows(rows, THREADS),
        &[
            Arg::Ptr(x),
            Arg::Ptr(&tg),
            Arg::Ptr(&kl),
            Arg::Ptr(g),
            Arg::I64(rows as i64),
            Arg::I64(v as i64),
            Arg::F64(smoothing),
            Arg::I64(ignore),
            Arg::I32(want_grad as i32),
        ],
    )?;
    match kl.to_cpu()? {
        CpuStorage::F64(k) => Ok((k.iter().sum(), valid, grad)),
        other => Err(Error::DTypeMismatch { op: "label_smoothing_loss (row kl)", expected: DType::F64, got: other.dtype() }),
    }
}
