//! Optimizer kernels on the GPU (`cuda/optim.cu`), the twins of
//! `backend/cpu/optim.rs`: the Adam/AdamW update in place, the global
//! squared gradient norm (per-block f64 partials summed in a fixed order,
//! never float atomics, so it is the same on every run), and the fused
//! unscale-and-check-for-inf of the loss scaler (one flag, one read-back
//! for all gradients); and all of these fused over every parameter in a
//! few multi-tensor launches ([`fused_adam`]: tables of pointers passed by
//! value, the step's decisions left on the GPU, one read-back).

use super::kernels::optim as k;
use super::launch::chunk_words;
use super::{CudaStorage, LaunchConfig};
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
    let dev = p.device().clone();
    let (lr, b1, b2, eps, wd, ibc1, isbc2, dec) = hyper_args(h);
    k::adam(&dev, dt, LaunchConfig::for_elems(n), p, g, m, v, n as u64, lr, b1, b2, eps, wd, ibc1, isbc2, dec)
}

/// Adam's hyper-parameters as the kernels take them, after their tensors:
/// lr, β1, β2, ε, weight decay, 1/(1−β1ᵗ), 1/√(1−β2ᵗ), decoupled.
#[allow(clippy::type_complexity)]
fn hyper_args(h: &AdamStep) -> (f64, f64, f64, f64, f64, f64, f64, i32) {
    let bc1 = 1.0 - h.beta1.powi(h.t as i32);
    let bc2 = 1.0 - h.beta2.powi(h.t as i32);
    (h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, 1.0 / bc1, 1.0 / bc2.sqrt(), h.decoupled as i32)
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
        k::sumsq_partial(&dev, dt, cfg, x, x.len() as u64, &partials, offset as u64)?;
        offset += blocks;
    }
    let out = dev.alloc(DType::F64, 1)?;
    let one = LaunchConfig { grid: (1, 1, 1), block: (THREADS, 1, 1), shared_bytes: 0 };
    k::sum_partials(&dev, one, &partials, total as u64, &out)?;
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
            k::unscale(&dev, dt, LaunchConfig::for_elems(g.len()), g, &o, g.len() as u64, inv_scale, &flag)?;
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

/// Elements per chunk of the fused step by default (one block each): small
/// enough that the AISHELL conformer's 46 M parameters make a few thousand
/// blocks (several waves on an H200's 132 SMs), large enough that pass B
/// sums few partials. `ASRFORGE_MT_CHUNK` sweeps it on a GPU.
pub const FUSED_CHUNK: usize = 1 << 14;

/// The fused step's chunk: `ASRFORGE_MT_CHUNK` (elements, a positive
/// number; read once) when set, for measuring other sizes on a GPU
/// (scripts/gpu-run.sh), else [`FUSED_CHUNK`]. Results do not depend on it
/// except the global norm's summation order.
pub fn fused_chunk() -> usize {
    static CHUNK: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CHUNK.get_or_init(|| std::env::var("ASRFORGE_MT_CHUNK").ok().and_then(|v| v.parse::<usize>().ok()).filter(|&c| c > 0).unwrap_or(FUSED_CHUNK))
}

/// One parameter of the fused step: the parameter, its gradient and its
/// two moments, all of one float dtype and length, on one GPU.
pub struct FusedSlot<'a> {
    pub p: &'a CudaStorage,
    pub g: &'a CudaStorage,
    pub m: &'a CudaStorage,
    pub v: &'a CudaStorage,
}

/// What the fused step does besides Adam.
#[derive(Clone, Copy, Debug)]
pub struct FusedOptions {
    /// AMP: multiply every gradient by this (rounded to its dtype) first.
    pub inv_scale: Option<f64>,
    /// Clip the global gradient norm to this (`grad_clip`).
    pub max_norm: Option<f64>,
    /// Elements per chunk (one block each); [`fused_chunk`] unless testing.
    pub chunk: usize,
}

impl Default for FusedOptions {
    fn default() -> Self {
        FusedOptions { inv_scale: None, max_norm: None, chunk: fused_chunk() }
    }
}

/// What the fused step found, read back once after it was queued.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FusedOutcome {
    /// The global L2 norm of the (unscaled) gradients before clipping.
    pub grad_norm: f64,
    /// Whether an unscaled gradient held an inf or NaN.
    pub found_inf: bool,
    /// Whether the update was skipped (found_inf or a non-finite norm).
    pub skipped: bool,
}

/// 64-bit words of the `MtHead` struct (cuda/optim.cu): the table's
/// device address, tensors, chunks, the chunk size, the first chunk's
/// global index.
const MT_HEAD_WORDS: usize = 5;

/// One launch's share of the step: the slots of one dtype, in order, and
/// where its chunk words and tensor arrays start in the step's table.
struct MtGroup {
    dt: DType,
    slots: Vec<usize>,
    /// Offset (in words) of this group's part of the table.
    at: usize,
    chunks: usize,
    first_chunk: usize,
    /// Elements its chunks cover (for the profile's bytes).
    elems: u64,
}

/// The step's table (cuda/optim.cu's file comment: per group, a word per
/// chunk, its tensor slot and index, then the p, g, m, v addresses and the
/// lengths of its tensors) and its groups: one per dtype, in the order of
/// their first slot; the chunks numbered in that order.
fn mt_table(slots: &[FusedSlot], chunk: usize) -> Result<(Vec<i64>, Vec<MtGroup>, usize)> {
    let mut groups: Vec<MtGroup> = Vec::new();
    for (i, s) in slots.iter().enumerate() {
        let dt = s.p.dtype();
        match groups.iter_mut().find(|g| g.dt == dt) {
            Some(g) => g.slots.push(i),
            None => groups.push(MtGroup { dt, slots: vec![i], at: 0, chunks: 0, first_chunk: 0, elems: 0 }),
        }
    }
    let mut words: Vec<i64> = Vec::new();
    let mut total = 0usize;
    for g in &mut groups {
        g.at = words.len();
        g.first_chunk = total;
        let n = g.slots.len();
        g.chunks = chunk_words("fused_adam", g.slots.iter().map(|&i| slots[i].p.len()), chunk, &mut words)?;
        g.elems = g.slots.iter().map(|&i| slots[i].p.len() as u64).sum();
        for field in 0..5 {
            words.extend(g.slots.iter().map(|&i| {
                let s = &slots[i];
                (match field {
                    0 => s.p.ptr(),
                    1 => s.g.ptr(),
                    2 => s.m.ptr(),
                    3 => s.v.ptr(),
                    _ => s.p.len() as u64,
                }) as i64
            }));
        }
        debug_assert_eq!(words.len(), g.at + g.chunks + 5 * n);
        total += g.chunks;
    }
    groups.retain(|g| g.chunks > 0);
    Ok((words, groups, total))
}

/// Unscale (AMP), check for inf/NaN, take the global gradient norm, clip
/// and run one Adam(W) step over every slot in two launches per dtype
/// among them (one, f32, in training): a norm launch whose last block
/// decides the step on the GPU, and an update launch; their table goes up
/// in one asynchronous copy, and the outcome comes back in one read-back.
/// Bit-identical in f32 and f64 to `unscale_many`, `sum_squares` + the
/// elementwise scale, and [`adam`] in turn (the norm agrees to rounding:
/// its sum is ordered by chunks). The gradients are left as they were;
/// skipped steps leave every buffer as it was.
pub fn fused_adam(slots: &[FusedSlot], h: &AdamStep, o: &FusedOptions) -> Result<FusedOutcome> {
    if o.chunk == 0 {
        return Err(Error::invalid("fused_adam", "expected a chunk of at least one element, found 0"));
    }
    let Some(first) = slots.first() else { return Ok(FusedOutcome { grad_norm: 0.0, found_inf: false, skipped: false }) };
    let mut seen = std::collections::HashSet::with_capacity(slots.len());
    for (i, s) in slots.iter().enumerate() {
        let dt = float_dtype("fused_adam", s.p)?;
        for (what, b) in [("gradient", s.g), ("exp_avg", s.m), ("exp_avg_sq", s.v)] {
            if b.dtype() != dt || b.len() != s.p.len() {
                return Err(Error::invalid(
                    "fused_adam",
                    format!("tensor {i}: expected the {what} as {} {dt:?} elements like the parameter, got {} {:?}", s.p.len(), b.len(), b.dtype()),
                ));
            }
        }
        for b in [s.p, s.g, s.m, s.v] {
            same_device("fused_adam", first.p, b)?;
        }
        // Two slots writing one buffer would race inside a launch.
        if !s.p.is_empty() && !seen.insert(s.p.ptr()) {
            return Err(Error::invalid("fused_adam", format!("tensor {i}: expected distinct parameters, found one buffer passed twice")));
        }
    }
    let (words, groups, total) = mt_table(slots, o.chunk)?;
    if total == 0 {
        return Ok(FusedOutcome { grad_norm: 0.0, found_inf: false, skipped: false });
    }
    let dev = first.p.device().clone();
    // The kernels read the table through the addresses in their heads: it
    // lives until this function returns, after every launch is queued (a
    // later reuse of its block is queued after them on the compute stream).
    let table = super::upload_words(&dev, words)?;
    let head = |g: &MtGroup| -> [u64; MT_HEAD_WORDS] {
        let at = table.ptr() + (g.at * std::mem::size_of::<u64>()) as u64;
        [at, g.slots.len() as u64, g.chunks as u64, o.chunk as u64, g.first_chunk as u64]
    };
    let partials = dev.alloc(DType::F64, 2 * total)?;
    let state = dev.alloc(DType::F64, 5)?;
    let counter = dev.arrivals(1)?;
    let (inv_scale, amp) = (o.inv_scale.unwrap_or(1.0), o.inv_scale.is_some() as i32);
    let grid = |g: &MtGroup| LaunchConfig { grid: (g.chunks.min(super::launch::max_grid() as usize) as u32, 1, 1), block: (THREADS, 1, 1), shared_bytes: 0 };
    // The bytes of each group's chunks (the profile cannot see inside the
    // table): the norm reads g; the update reads p, g, m, v and writes p, m, v.
    let bytes = |g: &MtGroup| g.elems * g.dt.size_in_bytes() as u64;
    let max_norm = o.max_norm.filter(|&m| m > 0.0).unwrap_or(0.0);
    for (i, g) in groups.iter().enumerate() {
        // The last norm launch folds every group's partials (the earlier
        // ones have run by then: one stream).
        let fold = (i + 1 == groups.len()) as i32;
        k::mt_norm(&dev, g.dt, grid(g), &head(g), inv_scale, amp, &partials, fold, total as u64, max_norm, &state, &counter, (bytes(g), 0))?;
    }
    let (lr, b1, b2, eps, wd, ibc1, isbc2, dec) = hyper_args(h);
    for g in &groups {
        let moved = (4 * bytes(g), 3 * bytes(g));
        k::mt_adam(&dev, g.dt, grid(g), &head(g), &state, inv_scale, amp, lr, b1, b2, eps, wd, ibc1, isbc2, dec, moved)?;
    }
    match state.to_cpu()? {
        CpuStorage::F64(v) if v.len() == 5 => Ok(FusedOutcome { grad_norm: v[0], found_inf: v[1] != 0.0, skipped: v[2] != 0.0 }),
        other => Err(Error::invalid("fused_adam", format!("expected the 5 f64 of the step's state, got {} {:?}", other.len(), other.dtype()))),
    }
}
