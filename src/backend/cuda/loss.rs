//! Label-smoothing loss on the GPU (`cuda/loss.cu`), the twin of
//! `backend/cpu/loss.rs`: per-row KL in one block per row, and the gradient
//! p − q; token accuracy (argmax hits per row); and the per-row f64 results
//! of the losses turned into the op's output on the device (`rows_to`,
//! `rows_total`: summed in row order as the CPU sums), so a step reads no
//! loss back to the host until it logs.

use super::kernels::loss as k;
use super::{CudaStorage, LaunchConfig};
use crate::backend::cpu::CpuStorage;
use crate::error::{Error, Result};
use crate::tensor::DType;

/// Threads per row block (a power of two, at most the kernel's LS_THREADS).
const THREADS: u32 = 256;

/// The KL of each row (f64, on the device; 0 for an ignored row), the
/// number of valid rows, and with `want_grad` the gradient of the sum with
/// respect to x.
pub fn label_smoothing(
    x: &CudaStorage,
    target: &[i64],
    v: usize,
    smoothing: f64,
    ignore: i64,
    want_grad: bool,
) -> Result<(CudaStorage, usize, Option<CudaStorage>)> {
    let dt = check_label_smoothing(x, target, v, ignore, false)?;
    let rows = target.len();
    let valid = target.iter().filter(|&&t| t != ignore).count();
    let dev = x.device();
    let grad = if want_grad { Some(dev.alloc(dt, rows * v)?) } else { None };
    if rows == 0 {
        return Ok((dev.zeros(DType::F64, 0)?, 0, grad));
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
    k::label_smoothing(dev, dt, LaunchConfig::rows(rows, THREADS), x, &tg, &kl, g, rows as i64, v as i64, smoothing, ignore, want_grad as i32)?;
    Ok((kl, valid, grad))
}

/// The checks both label-smoothing forwards share: the vocabulary, the
/// targets' range, the dtype (f16/bf16 too where `halves`) and the logits' size.
fn check_label_smoothing(x: &CudaStorage, target: &[i64], v: usize, ignore: i64, halves: bool) -> Result<DType> {
    crate::backend::cpu::loss::check_targets(target, v, ignore)?;
    let dt = x.dtype();
    if !(matches!(dt, DType::F32 | DType::F64) || halves && matches!(dt, DType::F16 | DType::BF16)) {
        return Err(crate::backend::cpu::unsupported("label_smoothing_loss", dt));
    }
    let rows = target.len();
    if x.len() != rows * v {
        return Err(Error::invalid("label_smoothing_loss", format!("expected {} logits for {rows} rows of {v}, got {}", rows * v, x.len())));
    }
    Ok(dt)
}

/// What the fused forward leaves for its backward: the targets on the
/// device and each row's log-sum-exp (f64).
pub struct LabelSmoothingSaved {
    target: CudaStorage,
    lse: CudaStorage,
}

/// The fused label-smoothing forward (`label_smoothing_fused_fwd`): the KL
/// of each row (f64 on the device), the number of valid rows, and what the
/// backward needs, in one read of the logits; no gradient is written.
/// f16/bf16 logits are read as they are (no f32 copy).
pub fn label_smoothing_fused_fwd(x: &CudaStorage, target: &[i64], v: usize, smoothing: f64, ignore: i64) -> Result<(CudaStorage, usize, LabelSmoothingSaved)> {
    let dt = check_label_smoothing(x, target, v, ignore, true)?;
    let rows = target.len();
    let valid = target.iter().filter(|&&t| t != ignore).count();
    let dev = x.device();
    let kl = dev.alloc(DType::F64, rows)?;
    let lse = dev.alloc(DType::F64, rows)?;
    let tg = CudaStorage::from_cpu(dev, &CpuStorage::I64(target.to_vec()))?;
    if rows > 0 {
        k::label_smoothing_fused_fwd(dev, dt, LaunchConfig::rows(rows, THREADS), x, &tg, &kl, &lse, rows as i64, v as i64, smoothing, ignore)?;
    }
    Ok((kl, valid, LabelSmoothingSaved { target: tg, lse }))
}

/// The fused label-smoothing backward (`label_smoothing_fused_bwd`):
/// dx = (softmax(x) − q)·g·inv_denom from the saved log-sum-exp, with `g`
/// the loss's incoming gradient (one element on the device, of the loss's
/// dtype: [`loss_dtype`] of x's).
pub fn label_smoothing_fused_bwd(
    x: &CudaStorage,
    saved: &LabelSmoothingSaved,
    g: &CudaStorage,
    v: usize,
    smoothing: f64,
    ignore: i64,
    inv_denom: f64,
) -> Result<CudaStorage> {
    let rows = saved.lse.len();
    let dt = x.dtype();
    let gt = loss_dtype(dt);
    if g.dtype() != gt || g.len() != 1 || x.len() != rows * v {
        return Err(Error::invalid(
            "label_smoothing_loss backward",
            format!("expected a gradient of one {gt:?} and {} logits, got {} of {:?} and {}", rows * v, g.len(), g.dtype(), x.len()),
        ));
    }
    let dev = x.device();
    let dx = dev.alloc(dt, rows * v)?;
    if rows > 0 {
        k::label_smoothing_fused_bwd(
            dev,
            dt,
            LaunchConfig::rows(rows, THREADS),
            x,
            &saved.target,
            &saved.lse,
            g,
            &dx,
            rows as i64,
            v as i64,
            smoothing,
            ignore,
            inv_denom,
        )?;
    }
    Ok(dx)
}

/// The dtype of a loss over logits of `dt`: f32 for f16/bf16 (as autocast
/// computes losses), else `dt`.
pub fn loss_dtype(dt: DType) -> DType {
    match dt {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

fn out_dtype(op: &'static str, dt: DType) -> Result<DType> {
    match dt {
        DType::F32 | DType::F64 => Ok(dt),
        d => Err(crate::backend::cpu::unsupported(op, d)),
    }
}

fn expect_rows(op: &'static str, rows: &CudaStorage) -> Result<()> {
    if rows.dtype() != DType::F64 {
        return Err(Error::DTypeMismatch { op, expected: DType::F64, got: rows.dtype() });
    }
    Ok(())
}

/// Per-row f64 values as `dt` (f32 or f64); with `zero_inf` an infinite
/// row becomes 0 (the CTC loss's `zero_infinity`).
pub fn rows_to(rows: &CudaStorage, dt: DType, zero_inf: bool) -> Result<CudaStorage> {
    expect_rows("rows_to", rows)?;
    let dt = out_dtype("rows_to", dt)?;
    let dev = rows.device();
    let out = dev.alloc(dt, rows.len())?;
    if rows.is_empty() {
        return Ok(out);
    }
    let n = rows.len();
    k::rows_to(dev, dt, LaunchConfig::for_elems(n), rows, &out, n as i64, zero_inf as i32)?;
    Ok(out)
}

/// One `dt` element: the rows summed in row order, divided by `denom`.
pub fn rows_total(rows: &CudaStorage, dt: DType, denom: f64) -> Result<CudaStorage> {
    expect_rows("rows_total", rows)?;
    let dt = out_dtype("rows_total", dt)?;
    let dev = rows.device();
    let out = dev.alloc(dt, 1)?;
    let one = LaunchConfig { grid: (1, 1, 1), block: (1, 1, 1), shared_bytes: 0 };
    k::rows_total(dev, dt, one, rows, &out, rows.len() as i64, denom)?;
    Ok(out)
}

/// 1.0 for each row of x (rows, v) whose argmax equals its target, else 0
/// (0 for an ignored row); f64 on the device. Half logits are read as they are.
pub fn token_hits(x: &CudaStorage, target: &[i64], v: usize, ignore: i64) -> Result<CudaStorage> {
    let dt = x.dtype();
    if !dt.is_float() {
        return Err(crate::backend::cpu::unsupported("token_accuracy", dt));
    }
    let rows = target.len();
    if x.len() != rows * v {
        return Err(Error::invalid("token_accuracy", format!("expected {} logits for {rows} rows of {v}, got {}", rows * v, x.len())));
    }
    let dev = x.device();
    let hits = dev.alloc(DType::F64, rows)?;
    if rows == 0 {
        return Ok(hits);
    }
    let tg = CudaStorage::from_cpu(dev, &CpuStorage::I64(target.to_vec()))?;
    k::token_hits(dev, dt, LaunchConfig::rows(rows, THREADS), x, &tg, &hits, rows as i64, v as i64, ignore)?;
    Ok(hits)
}
