//! Optimizer kernels on the GPU (`cuda/optim.cu`), the twins of
//! `backend/cpu/optim.rs`: the Adam/AdamW update in place, the global
//! squared gradient norm (per-block f64 partials summed in a fixed order,
//! never float atomics, so it is the same on every run), and the fused
//! unscale-and-check-for-inf of the loss scaler (one flag, one read-back
//! for all gradients).

use super::{dtype_suffix, Arg, CudaStorage, LaunchConfig};
use crate::backend::cpu::optim::AdamStep;
use crate::backend::cpu::CpuStorage;
use crate::error::{Error, Result};
use crate::tensor::DType;
use std::sync::Arc;

/// Threads per block of the reductions (a power of two, at most OPT_THREADS).
const THREADS: u32 = 256;
/// Most partial sums one tensor contributes (its grid is at most this many blocks).
const MAX_PARTIALS: usize = 1024;

fn float_dtype(op: &'static str, s: &CudaStorage) -> Result<DType> {
    match s.dtype() {
        d @ (DType::F32 | DType::F64) => Ok(d),
        d => Err(crate::backend::cpu::unsupported(op, d)),
    }
}

fn same_device(op: &'static str, a: &CudaStorage, b: &CudaStorage) -> Result<()> {
    if a.ordinal() != b.ordinal() {
        return Err(Error::invalid(op, format!("expected buffers on one GPU, found cuda:{} and cuda:{}", a.ordinal(), b.ordinal())));
    }
    Ok(())
}

/// One Adam(W) step in place on the parameter `p` and moments `m`, `v`.
pub fn adam(p: &mut CudaStorage, g: &CudaStorage, m: &mut CudaStorage, v: &mut CudaStorage, h: &AdamStep) -> Result<()> {
    let dt = float_dtype("adam", p)?;
    for (what, s) in [("gradient", g), ("exp_avg", &*m), ("exp_avg_sq", &*v)] {
        if s.dtype() != dt || s.len() != p.len() {
            return Err(Error::invalid(
                "adam",
                format!("expected the {what} as {} {dt:?} elements like the parameter, got {} {:?}", p.len(), s.len(), s.dtype()),
            ));
        }
        same_device("adam", p, s)?;
    }
    let n = p.len();
    if n == 0 {
        return Ok(());
    }
    let bc1 = 1.0 - h.beta1.powi(h.t as i32);
    let bc2 = 1.0 - h.beta2.powi(h.t as i32);
    let dev = p.device().clone();
    dev.launch(
        "optim",
        &format!("adam_{}", dtype_suffix(dt)),
        LaunchConfig::for_elems(n),
        &[
            Arg::Ptr(p),
            Arg::Ptr(g),
            Arg::Ptr(m),
            Arg::Ptr(v),
            Arg::U64(n as u64),
            Arg::F64(h.lr),
            Arg::F64(h.beta1),
            Arg::F64(h.beta2),
            Arg::F64(h.eps),
            Arg::F64(h.weight_decay),
            Arg::F64(1.0 / bc1),
            Arg::F64(1.0 / bc2.sqrt()),
            Arg::I32(h.decoupled as i32),
        ],
    )
}

/// Blocks of one tensor's partial-sum launch (fixed by its length alone).
fn partial_blocks(n: usize) -> usize {
    n.div_ceil(THREADS as usize).clamp(1, MAX_PARTIALS.min(super::launch::max_grid() as usize))
}

/// Σ x² over every element of every tensor, accumulated in f64 (all on one GPU).
pub fn sum_squares(xs: &[&CudaStorage]) -> Result<f64> {
    let Some(first) = xs.first() else { return Ok(0.0) };
    let dev: Arc<_> = first.device().clone();
    let total: usize = xs.iter().map(|x| partial_blocks(x.len())).sum();
    let partials = dev.alloc(DType::F64, total)?;
    let mut offset = 0usize;
    for x in xs {
        same_device("grad_norm", first, x)?;
        let dt = float_dtype("grad_norm", x)?;
        let blocks = partial_blocks(x.len());
        let cfg = LaunchConfig { grid: (blocks as u32, 1, 1), block: (THREADS, 1, 1), shared_bytes: 0 };
        dev.launch(
            "optim",
            &format!("sumsq_partial_{}", dtype_suffix(dt)),
            cfg,
            &[Arg::Ptr(x), Arg::U64(x.len() as u64), Arg::Ptr(&partials), Arg::U64(offset as u64)],
        )?;
        offset += blocks;
    }
    let out = dev.alloc(DType::F64, 1)?;
    let one = LaunchConfig { grid: (1, 1, 1), block: (THREADS, 1, 1), shared_bytes: 0 };
    dev.launch("optim", "sum_partials", one, &[Arg::Ptr(&partials), Arg::U64(total as u64), Arg::Ptr(&out)])?;
    match out.to_cpu()? {
        CpuStorage::F64(v) if v.len() == 1 => Ok(v[0]),
        other => Err(Error::invalid("grad_norm", format!("expected one f64 sum, got {} {:?}", other.len(), other.dtype()))),
    }
}

/// Each gradient times `inv_scale` (new buffers), and whether any product
/// is inf or NaN; one flag on the GPU and one read-back for all of them.
pub fn unscale_many(gs: &[&CudaStorage], inv_scale: f64) -> Result<(Vec<CudaStorage>, bool)> {
    let Some(first) = gs.first() else { return Ok((Vec::new(), false)) };
    let dev = first.device().clone();
    let flag = dev.zeros(DType::U8, 1)?;
    let mut out = Vec::with_capacity(gs.len());
    for g in gs {
        same_device("unscale", first, g)?;
        let dt = float_dtype("unscale", g)?;
        let o = dev.alloc(dt, g.len())?;
        if !g.is_empty() {
            dev.launch(
                "optim",
                &format!("unscale_{}", dtype_suffix(dt)),
                LaunchConfig::for_elems(g.len()),
                &[Arg::Ptr(g), Arg::Ptr(&o), Arg::U64(g.len() as u64), Arg::F64(inv_scale), Arg::Ptr(&flag)],
            )?;
        }
        out.push(o);
    }
    match flag.to_cpu()? {
        CpuStorage::U8(f) => Ok((out, f.first().is_some_and(|&b| b != 0))),
        other => Err(Error::DTypeMismatch { op: "unscale (found_inf)", expected: DType::U8, got: other.dtype() }),
    }
}

/// Multiplies `g` by `inv_scale` and reports whether any element was inf or NaN.
pub fn unscale_and_check(g: &CudaStorage, inv_scale: f64) -> Result<(CudaStorage, bool)> {
    let (mut v, bad) = unscale_many(&[g], inv_scale)?;
    let o = v.pop().ok_or_else(|| Error::Msg("unscale: no output buffer".into()))?;
    Ok((o, bad))
}
