//! Layer norm and batch norm on the GPU, forward and backward
//! (`cuda/norm.cu`); mirrors `backend::cpu::norm`. Layer norm gives a warp
//! to each row of up to `WARP_ROW_MAX` elements and a block to longer ones;
//! its backward is one launch (gx with partial weight and bias sums per
//! chunk of rows, which the last block to finish adds in order):
//! deterministic column sums, an atomic only to elect that block.

use super::dropout::DropoutDraw;
use super::fastdiv::fast_div_words;
use super::kernels::norm as k;
use super::launch::Arrivals;
use super::nn_common::{elems, expect_dtype, expect_len, rows, same, u32_arg, FLOATS};
use super::softmax::row_launch;
use super::{CudaDevice, CudaStorage, LaunchConfig};
use crate::backend::cpu::norm::ln_param_dtype;
use crate::error::{Error, Result};
use crate::tensor::DType;
use std::sync::Arc;

/// Rows per chunk of the first backward pass: one block writes gx of the
/// chunk's rows and the chunk's partial row of the weight and bias sums.
const LN_CHUNK: usize = 64;

/// Rows per block of layer norm's backward pass 1: `ASRFORGE_LN_CHUNK`
/// (read once; for measuring other sizes on a GPU, scripts/gpu-run.sh)
/// or [`LN_CHUNK`]. Fewer rows per block run more blocks (at 2048 rows
/// the default fills 32 of an H200's 132 SMs) but give pass 2 more partial
/// rows to add; results depend on it only through gw's and gb's summation
/// order.
fn ln_chunk() -> usize {
    static CHUNK: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CHUNK.get_or_init(|| std::env::var("ASRFORGE_LN_CHUNK").ok().and_then(|v| v.parse::<usize>().ok()).filter(|&c| c > 0).unwrap_or(LN_CHUNK))
}

/// What layer norm's backward kernels sum gw and gb into (norm.cuh
/// `layer_norm_bwd`): `chunk` rows per block ([`ln_chunk`]), one partial
/// row of each sum per chunk (`pw`, `pb`), the gradients the last block
/// folds them into (`gw`, `gb`, zeros when there are no rows, as nothing is
/// launched then: the empty sum) and its arrival counter.
pub(super) struct LnSums<'a> {
    pub chunk: usize,
    pub chunks: usize,
    pub pw: CudaStorage,
    pub pb: CudaStorage,
    pub gw: CudaStorage,
    pub gb: CudaStorage,
    pub arrivals: Arrivals<'a>,
}

/// [`LnSums`] for `rows` rows of `n` elements, the sums in `pd`.
pub(super) fn ln_sums(dev: &Arc<CudaDevice>, pd: DType, rows: usize, n: usize) -> Result<LnSums<'_>> {
    let chunk = ln_chunk();
    let chunks = rows.div_ceil(chunk);
    let part = || dev.alloc(pd, (chunks * n).max(1));
    let sum = || if rows == 0 { dev.zeros(pd, n) } else { dev.alloc(pd, n) };
    Ok(LnSums { chunk, chunks, pw: part()?, pb: part()?, gw: sum()?, gb: sum()?, arrivals: dev.arrivals(1)? })
}

/// A layer-norm parameter or statistic: on x's GPU, of x's parameter dtype, `len` long.
pub(super) fn ln_param(op: &'static str, what: &str, x: &CudaStorage, p: &CudaStorage, len: usize) -> Result<()> {
    if p.ordinal() != x.ordinal() {
        return Err(Error::invalid(op, format!("expected the {what} on cuda:{}, found cuda:{}", x.ordinal(), p.ordinal())));
    }
    let want = ln_param_dtype(x.dtype());
    if p.dtype() != want {
        return Err(Error::DTypeMismatch { op, expected: want, got: p.dtype() });
    }
    expect_len(op, what, p, len)
}

/// Layer norm forward: `(y, mean, rstd)`, the last two per row. Half
/// inputs take an f32 weight and bias and give f32 statistics.
pub fn layer_norm(x: &CudaStorage, w: Option<&CudaStorage>, b: Option<&CudaStorage>, n: usize, eps: f64) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    let (_, y, mean, rstd) = ln_forward("layer_norm", x, None, w, b, n, eps)?;
    Ok((y, mean, rstd))
}

/// `s = x + alpha·res` (rounded to x's dtype, as `add_scaled` stores it)
/// and layer norm of `s`, in one launch: `(s, y, mean, rstd)`. With `drop`,
/// res is first `dropout_apply`'s product with the mask of that draw (drawn
/// inside the kernel, rounded to the dtype as `dropout_apply` stores it).
/// With `rmask` (u8, one per row), res is 0 in the rows it marks nonzero,
/// as `masked_fill` before the dropout would make it.
#[allow(clippy::too_many_arguments)]
pub fn add_layer_norm(
    x: &CudaStorage,
    res: &CudaStorage,
    alpha: f64,
    drop: Option<DropoutDraw>,
    rmask: Option<&CudaStorage>,
    w: Option<&CudaStorage>,
    b: Option<&CudaStorage>,
    n: usize,
    eps: f64,
) -> Result<(CudaStorage, CudaStorage, CudaStorage, CudaStorage)> {
    let op = "add_layer_norm";
    same(op, x, res)?;
    expect_len(op, "the residual branch", res, x.len())?;
    row_mask(op, x, rmask, n)?;
    let (s, y, mean, rstd) = ln_forward(op, x, Some((res, alpha, drop, rmask)), w, b, n, eps)?;
    Ok((s.ok_or_else(|| Error::invalid(op, "the sum was not written"))?, y, mean, rstd))
}

type Four = (Option<CudaStorage>, CudaStorage, CudaStorage, CudaStorage);

/// The kernels' row mask arguments (pointer, present): without a mask the
/// kernels read none, and a byte of U8 from the pool, kept in `stand_in`,
/// stands in for its pointer, uninitialised (no memset, no launch).
fn row_mask_arg<'a>(x: &CudaStorage, rmask: Option<&'a CudaStorage>, stand_in: &'a mut Option<CudaStorage>) -> Result<(&'a CudaStorage, u32)> {
    match rmask {
        Some(m) => Ok((m, 1)),
        None => Ok((stand_in.insert(x.device().alloc(DType::U8, 1)?), 0)),
    }
}

/// A row mask of add_layer_norm: u8, one element per row of x, on x's GPU.
fn row_mask(op: &'static str, x: &CudaStorage, rmask: Option<&CudaStorage>, n: usize) -> Result<()> {
    if let Some(m) = rmask {
        if m.dtype() != DType::U8 {
            return Err(Error::DTypeMismatch { op, expected: DType::U8, got: m.dtype() });
        }
        if m.ordinal() != x.ordinal() {
            return Err(Error::invalid(op, format!("expected the row mask on cuda:{}, found cuda:{}", x.ordinal(), m.ordinal())));
        }
        expect_len(op, "the row mask", m, if n == 0 { 0 } else { x.len() / n })?;
    }
    Ok(())
}

/// The kernels' dropout words: (seed, offset, keep, scale, on).
fn drop_args(op: &'static str, drop: Option<DropoutDraw>) -> Result<(u64, u64, f64, f64, u32)> {
    Ok(match drop {
        Some(d) => {
            let (keep, scale) = d.keep_scale(op)?;
            (d.seed, d.offset, keep, scale, 1)
        }
        None => (0, 0, 1.0, 1.0, 0),
    })
}

fn ln_forward(
    op: &'static str,
    x: &CudaStorage,
    res: Option<(&CudaStorage, f64, Option<DropoutDraw>, Option<&CudaStorage>)>,
    w: Option<&CudaStorage>,
    b: Option<&CudaStorage>,
    n: usize,
    eps: f64,
) -> Result<Four> {
    expect_dtype(op, x, FLOATS)?;
    for p in [w, b].into_iter().flatten() {
        ln_param(op, "weight and bias", x, p, n)?;
    }
    let nn = u32_arg(op, "row length", n)?;
    let r = if n == 0 { 0 } else { x.len() / n };
    let dev = x.device();
    let pd = ln_param_dtype(x.dtype());
    let (y, mean, rstd) = (dev.alloc(x.dtype(), x.len())?, dev.alloc(pd, r)?, dev.alloc(pd, r)?);
    // An absent weight or bias is never read; `mean` (of the parameter
    // dtype) stands in for its pointer.
    let (warp, cfg) = row_launch(n, r);
    let (pw, pb) = (w.unwrap_or(&mean), b.unwrap_or(&mean));
    let (hw, hb) = (w.is_some() as u32, b.is_some() as u32);
    let Some((res, alpha, drop, rmask)) = res else {
        let f = if warp { k::layer_norm_fwd_warp } else { k::layer_norm_fwd };
        if !x.is_empty() {
            f(dev, x.dtype(), cfg, x, pw, pb, &y, &mean, &rstd, r as u64, nn, eps, hw, hb)?;
        }
        return Ok((None, y, mean, rstd));
    };
    let (seed, offset, keep, scale, on) = drop_args(op, drop)?;
    let s = dev.alloc(x.dtype(), x.len())?;
    let f = if warp { k::add_layer_norm_fwd_warp } else { k::add_layer_norm_fwd };
    if !x.is_empty() {
        let mut stand_in = None;
        let (rm, hm) = row_mask_arg(x, rmask, &mut stand_in)?;
        f(dev, x.dtype(), cfg, x, res, alpha, pw, pb, &s, &y, &mean, &rstd, r as u64, nn, eps, hw, hb, seed, offset, keep, scale, on, rm, hm)?;
    }
    Ok((Some(s), y, mean, rstd))
}

/// Layer norm backward: `(gx, gw, gb)` (gw, gb summed over all rows).
pub fn layer_norm_backward(
    x: &CudaStorage,
    w: Option<&CudaStorage>,
    mean: &CudaStorage,
    rstd: &CudaStorage,
    g: &CudaStorage,
    n: usize,
) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    let (gx, _, gw, gb) = ln_backward("layer_norm_backward", x, w, mean, rstd, g, None, n)?;
    Ok((gx, gw, gb))
}

/// The backward of [`add_layer_norm`] from the saved sum `s`: with `g` the
/// gradient of the normalised output and `gs` the one that reached `s`
/// directly (if any), `(gx, gres, gw, gb)`: gx = gs + layer norm's input
/// gradient, gres = alpha·gx, both formed before rounding, in the launch
/// that writes gx. For alpha 1 gres is gx and is not written (`None`).
/// With the forward's `drop`, gres = alpha·mask·gx, and with its `rmask`
/// gres is 0 in the rows it marks (either way always written).
#[allow(clippy::too_many_arguments)]
pub fn add_layer_norm_backward(
    s: &CudaStorage,
    w: Option<&CudaStorage>,
    mean: &CudaStorage,
    rstd: &CudaStorage,
    g: &CudaStorage,
    gs: Option<&CudaStorage>,
    alpha: f64,
    drop: Option<DropoutDraw>,
    rmask: Option<&CudaStorage>,
    n: usize,
) -> Result<(CudaStorage, Option<CudaStorage>, CudaStorage, CudaStorage)> {
    let op = "add_layer_norm_backward";
    if let Some(gs) = gs {
        same(op, s, gs)?;
        expect_len(op, "the sum's gradient", gs, s.len())?;
    }
    row_mask(op, s, rmask, n)?;
    ln_backward(op, s, w, mean, rstd, g, Some((gs, alpha, drop, rmask)), n)
}

#[allow(clippy::too_many_arguments)]
fn ln_backward(
    op: &'static str,
    x: &CudaStorage,
    w: Option<&CudaStorage>,
    mean: &CudaStorage,
    rstd: &CudaStorage,
    g: &CudaStorage,
    res: Option<(Option<&CudaStorage>, f64, Option<DropoutDraw>, Option<&CudaStorage>)>,
    n: usize,
) -> Result<(CudaStorage, Option<CudaStorage>, CudaStorage, CudaStorage)> {
    expect_dtype(op, x, FLOATS)?;
    let nn = u32_arg(op, "row length", n)?;
    let r = if n == 0 { 0 } else { x.len() / n };
    for (s, what) in [(mean, "mean"), (rstd, "rstd")] {
        ln_param(op, what, x, s, r)?;
    }
    same(op, x, g)?;
    expect_len(op, "the output gradient", g, x.len())?;
    if let Some(w) = w {
        ln_param(op, "weight", x, w, n)?;
    }
    let (dt, dev) = (x.dtype(), x.device());
    let pd = ln_param_dtype(dt);
    let gx = dev.alloc(dt, x.len())?;
    let LnSums { chunk, chunks, pw, pb, gw, gb, arrivals } = ln_sums(dev, pd, r, n)?;
    // An absent weight is never read; `mean` stands in for its pointer.
    let (warp, _) = row_launch(n, r);
    let (wp, hw) = (w.unwrap_or(mean), w.is_some() as u32);
    let gy = match res {
        None => {
            let f = if warp { k::layer_norm_bwd_warp } else { k::layer_norm_bwd };
            if !x.is_empty() {
                f(dev, dt, rows(chunks), x, wp, mean, rstd, g, &gx, &pw, &pb, &gw, &gb, &arrivals, r as u64, nn, hw, chunk as u32)?;
            }
            None
        }
        Some((gs, alpha, drop, rmask)) => {
            // For alpha 1 without dropout or row mask, gy equals gx: not
            // written (the caller shares gx); gx stands in for its pointer.
            let has_gy = alpha != 1.0 || drop.is_some() || rmask.is_some();
            let mut stand_in = None;
            let (rm, hm) = row_mask_arg(x, rmask, &mut stand_in)?;
            let (seed, offset, keep, scale, on) = drop_args(op, drop)?;
            let gy = if has_gy { Some(dev.alloc(dt, x.len())?) } else { None };
            let f = if warp { k::add_layer_norm_bwd_warp } else { k::add_layer_norm_bwd };
            // An absent gs is never read; g stands in for its pointer.
            if !x.is_empty() {
                f(
                    dev,
                    dt,
                    rows(chunks),
                    x,
                    wp,
                    mean,
                    rstd,
                    g,
                    gs.unwrap_or(g),
                    gs.is_some() as u32,
                    alpha,
                    &gx,
                    gy.as_ref().unwrap_or(&gx),
                    has_gy as u32,
                    &pw,
                    &pb,
                    &gw,
                    &gb,
                    &arrivals,
                    r as u64,
                    nn,
                    hw,
                    chunk as u32,
                    seed,
                    offset,
                    keep,
                    scale,
                    on,
                    rm,
                    hm,
                )?;
            }
            gy
        }
    };
    Ok((gx, gy, gw, gb))
}

/// Channels per strip and row lanes of the channels-last batch-norm
/// reductions (`BN_STRIP` × `BN_LANES` threads a block, `cuda/norm.cu`).
const BN_STRIP: usize = 32;
const BN_LANES: usize = 8;
/// The fewest rows a tile of the channels-last reductions sums (4 per
/// thread), and the blocks they aim for: 512, at N = 2048, C = 256 eight
/// strips × 64 tiles (see `cuda/norm.cu`).
const BN_MIN_TILE_ROWS: usize = 32;
const BN_TARGET_BLOCKS: usize = 512;

/// `(tile_rows, tiles)` of the channels-last (t = 1, x (N, C)) statistics
/// and backward sums, or None when they take the block-per-channel path:
/// channels-first inputs (t > 1, `nn::BatchNorm1d` on (B, C, T)), an empty
/// input, or one with 2^31 elements or more (the kernels index rows and
/// tiles in u32).
pub(super) fn bn_tiling(n: usize, c: usize, t: usize) -> Option<(u32, usize)> {
    if t != 1 || n == 0 || c == 0 || !super::fastdiv::fits_u32(&[n * c]) {
        return None;
    }
    let strips = c.div_ceil(BN_STRIP);
    let want_tiles = BN_TARGET_BLOCKS.div_ceil(strips).clamp(1, (n / BN_MIN_TILE_ROWS).max(1));
    let tile_rows = n.div_ceil(want_tiles).next_multiple_of(BN_LANES);
    Some((tile_rows as u32, n.div_ceil(tile_rows)))
}

/// The tile results (strips × tiles × 2 × 32, x's parameter dtype) and the
/// per-strip arrival counters (the device's kept zeroed counters, see
/// [`CudaDevice::arrivals`]) of a channels-last reduction.
pub(super) fn bn_scratch(x: &CudaStorage, c: usize, tiles: usize) -> Result<(CudaStorage, Arrivals<'_>)> {
    let strips = c.div_ceil(BN_STRIP);
    let dev = x.device();
    Ok((dev.alloc(ln_param_dtype(x.dtype()), strips * tiles * 2 * BN_STRIP)?, dev.arrivals(strips)?))
}

/// A 1-D grid over the strips × tiles items (grid-stride past the cap).
pub(super) fn bn_launch(c: usize, tiles: usize) -> LaunchConfig {
    let items = c.div_ceil(BN_STRIP) * tiles;
    LaunchConfig { grid: (items.clamp(1, super::launch::max_grid() as usize) as u32, 1, 1), block: ((BN_STRIP * BN_LANES) as u32, 1, 1), shared_bytes: 0 }
}

fn bn_dims(op: &'static str, x: &CudaStorage, b: usize, c: usize, t: usize) -> Result<u32> {
    expect_dtype(op, x, FLOATS)?;
    expect_len(op, "the input (B, C, T)", x, b * c * t)?;
    u32_arg(op, "channel count", c)
}

/// Batch norm's statistics `(mean, rstd)` per channel of x (B, C, T), in
/// x's parameter dtype (f32 for half inputs), in one launch. Training: the
/// batch's mean and 1/√(biased var + eps), and `run_mean`/`run_var` move
/// toward the batch's statistics in place (the variance unbiased), with
/// weight `momentum`. Eval: the running mean and 1/√(running var + eps).
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_stats(
    x: &CudaStorage,
    run_mean: &mut CudaStorage,
    run_var: &mut CudaStorage,
    b: usize,
    c: usize,
    t: usize,
    eps: f64,
    momentum: f64,
    train: bool,
) -> Result<(CudaStorage, CudaStorage)> {
    let op = "batch_norm";
    let cc = bn_dims(op, x, b, c, t)?;
    ln_param(op, "running_mean", x, run_mean, c)?;
    ln_param(op, "running_var", x, run_var, c)?;
    let dev = x.device();
    let pd = ln_param_dtype(x.dtype());
    let (mean, rstd) = (dev.alloc(pd, c)?, dev.alloc(pd, c)?);
    if let (true, Some((tile_rows, tiles))) = (train, bn_tiling(b, c, t)) {
        let (part, counters) = bn_scratch(x, c, tiles)?;
        k::batch_norm_stats_cl(
            dev,
            x.dtype(),
            bn_launch(c, tiles),
            x,
            run_mean,
            run_var,
            &mean,
            &rstd,
            &part,
            &counters,
            b as u32,
            cc,
            tile_rows,
            eps,
            momentum,
        )?;
    } else if c > 0 {
        k::batch_norm_stats(dev, x.dtype(), rows(c), x, run_mean, run_var, &mean, &rstd, b as u64, cc, t as u64, eps, momentum, train as u32)?;
    }
    Ok((mean, rstd))
}

/// `y = (x − mean[c])·rstd[c]·w[c] + b[c]` over (B, C, T); half x with f32 parameters.
pub fn batch_norm_apply(
    x: &CudaStorage,
    mean: &CudaStorage,
    rstd: &CudaStorage,
    w: &CudaStorage,
    bias: &CudaStorage,
    c: usize,
    t: usize,
) -> Result<CudaStorage> {
    let op = "batch_norm";
    expect_dtype(op, x, FLOATS)?;
    let cc = u32_arg(op, "channel count", c)?;
    for (s, what) in [(mean, "mean"), (rstd, "rstd"), (w, "weight"), (bias, "bias")] {
        ln_param(op, what, x, s, c)?;
    }
    let dev = x.device();
    let y = dev.alloc(x.dtype(), x.len())?;
    if super::fastdiv::fits_u32(&[x.len()]) && !x.is_empty() {
        let (ft, fc) = (fast_div_words(op, t)?, fast_div_words(op, c)?);
        k::batch_norm_apply_u32(dev, x.dtype(), elems(x.len()), x, mean, rstd, w, bias, &y, x.len() as u32, &ft, &fc)?;
    } else if !x.is_empty() {
        k::batch_norm_apply(dev, x.dtype(), elems(x.len()), x, mean, rstd, w, bias, &y, x.len() as u64, cc, t as u64)?;
    }
    Ok(y)
}

/// Batch norm backward over (B, C, T): `(gx, gw, gb)`, gw and gb in the
/// parameter dtype. With `train` the statistics were the batch's (their
/// gradient flows); else they were constants.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_backward(
    x: &CudaStorage,
    w: &CudaStorage,
    mean: &CudaStorage,
    rstd: &CudaStorage,
    g: &CudaStorage,
    b: usize,
    c: usize,
    t: usize,
    train: bool,
) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    let op = "batch_norm_backward";
    let cc = bn_dims(op, x, b, c, t)?;
    for (s, what) in [(w, "weight"), (mean, "mean"), (rstd, "rstd")] {
        ln_param(op, what, x, s, c)?;
    }
    same(op, x, g)?;
    expect_len(op, "the output gradient", g, x.len())?;
    let (dt, dev) = (x.dtype(), x.device());
    let pd = ln_param_dtype(dt);
    let (gb, gw) = (dev.alloc(pd, c)?, dev.alloc(pd, c)?);
    if let Some((tile_rows, tiles)) = bn_tiling(b, c, t) {
        let (part, counters) = bn_scratch(x, c, tiles)?;
        k::batch_norm_bwd_sums_cl(dev, dt, bn_launch(c, tiles), x, mean, rstd, g, &gb, &gw, &part, &counters, b as u32, cc, tile_rows)?;
    } else if c > 0 {
        k::batch_norm_bwd_sums(dev, dt, rows(c), x, mean, rstd, g, &gb, &gw, b as u64, cc, t as u64)?;
    }
    let gx = dev.alloc(dt, x.len())?;
    if super::fastdiv::fits_u32(&[x.len()]) && !x.is_empty() {
        let (ft, fc) = (fast_div_words(op, t)?, fast_div_words(op, c)?);
        k::batch_norm_bwd_dx_u32(dev, dt, elems(x.len()), x, w, mean, rstd, g, &gb, &gw, &gx, x.len() as u32, &ft, &fc, train as u32)?;
    } else if !x.is_empty() {
        k::batch_norm_bwd_dx(dev, dt, elems(x.len()), x, w, mean, rstd, g, &gb, &gw, &gx, x.len() as u64, cc, t as u64, train as u32)?;
    }
    Ok((gx, gw, gb))
}
