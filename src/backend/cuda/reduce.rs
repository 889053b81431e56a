//! Reductions over one dim on the GPU (`cuda/reduce.cu`), the twin of
//! `cpu/reduce.rs`: layout `(outer, n, inner)`, output `(outer, inner)`.
//! Every result is summed in a fixed order, so it is the same run to run.

use super::kernels::reduce as k;
use super::{CudaStorage, LaunchConfig};
use crate::error::{Error, Result};
use crate::tensor::DType;

const THREADS: u32 = 256;

fn float_only(op: &'static str, x: &CudaStorage) -> Result<()> {
    if x.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::UnsupportedDType { op, dtype: x.dtype(), supported: "f32, f64, f16, bf16" })
    }
}

fn check_len(op: &'static str, x: &CudaStorage, want: usize) -> Result<()> {
    if x.len() != want {
        return Err(Error::invalid(op, format!("expected {want} elements, got {}", x.len())));
    }
    Ok(())
}

fn i(v: usize) -> i64 {
    v as i64
}

/// Sum over the middle dim of `(outer, n, inner)`, in the input's dtype.
pub fn sum_dim(x: &CudaStorage, outer: usize, n: usize, inner: usize) -> Result<CudaStorage> {
    sum_into(x, outer, n, inner, x.dtype(), false)
}

/// Sum over the middle dim of `(outer, n, inner)` in the accumulation type:
/// f16/bf16 inputs give unrounded f32 sums (for reductions over several
/// dims, rounded to half once at the end), f32/f64 their own dtype.
pub fn sum_dim_acc(x: &CudaStorage, outer: usize, n: usize, inner: usize) -> Result<CudaStorage> {
    match x.dtype() {
        DType::F16 | DType::BF16 => sum_into(x, outer, n, inner, DType::F32, true),
        dt => sum_into(x, outer, n, inner, dt, false),
    }
}

/// Rows up to this length are summed by one warp each (`sum_rows_warp_*`),
/// longer ones by one block each (`sum_rows_*`).
pub const SHORT_ROW: usize = 256;

/// The dynamic shared memory of `sum_rows_*`: the block reduction's one
/// partial per warp, 8 bytes each (f64), for up to 32 warps.
const ROW_SHARED_BYTES: u32 = 32 * 8;

/// How a sum runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SumPath {
    /// The host's choice by shape ([`col_sum_plan`], [`row_sum_tiling`]).
    Auto,
    /// Column sums (`inner > 1`): one thread per output walks all `n` rows
    /// (`sum_cols_*`). Row sums (`inner == 1`): a warp per short row, a
    /// block per long row (`sum_rows_warp_*`, `sum_rows_*`).
    OnePass,
    /// Column sums: row tiles × column strips (`sum_cols_tiled_*`). Row
    /// sums: each row cut into tiles, a block each (`sum_rows_tiled_*`).
    /// Tile sums are added in a fixed order either way.
    Tiled,
}

/// Columns per strip and threads per block of `sum_cols_tiled` (`COL_STRIP`
/// × `ROW_LANES` in `cuda/reduce.cu`).
const COL_STRIP: usize = 32;
const ROW_LANES: usize = 8;
/// The fewest rows a tile sums (8 per thread), and the blocks a tiled sum
/// aims for (a few per SM of a large GPU).
const MIN_TILE_ROWS: usize = 64;
const TARGET_BLOCKS: usize = 512;

/// The path the host takes for a column sum of `(outer, n, inner)`: tiled
/// when the one-pass kernel would run fewer than 64 blocks and each output
/// sums at least two tiles of rows, one-pass otherwise.
pub fn col_sum_plan(outer: usize, n: usize, inner: usize) -> SumPath {
    let one_pass_blocks = (outer * inner).div_ceil(THREADS as usize);
    if one_pass_blocks < 64 && n >= 2 * MIN_TILE_ROWS {
        SumPath::Tiled
    } else {
        SumPath::OnePass
    }
}

/// Rows per tile and tiles of a tiled column sum of `(outer, n, inner)`:
/// about 512 blocks over all strips of 32 columns, at least 64 rows a tile
/// (fewer only when `n` is smaller), a multiple of the block's 8 row lanes.
pub fn col_sum_tiling(outer: usize, n: usize, inner: usize) -> (usize, usize) {
    let strips = (outer * inner.div_ceil(COL_STRIP)).max(1);
    let want_tiles = TARGET_BLOCKS.div_ceil(strips).clamp(1, (n / MIN_TILE_ROWS).max(1));
    let tile_rows = n.div_ceil(want_tiles).next_multiple_of(ROW_LANES).max(ROW_LANES);
    (tile_rows, n.div_ceil(tile_rows).max(1))
}

/// The fewest elements a row tile sums.
const MIN_ROW_TILE: usize = 16 * 1024;

/// Elements per tile and tiles per row of a row sum of `(rows, n)`: tiles
/// of at least 16 Ki elements (64 per thread of a 256-thread block), about
/// 512 blocks over all rows, a multiple of 8 elements; `(n, 1)` (a block per
/// row, no tiling) when that gives one tile, or when there are already 64
/// rows (blocks) or more.
pub fn row_sum_tiling(rows: usize, n: usize) -> (usize, usize) {
    if rows >= 64 || n < 2 * MIN_ROW_TILE {
        return (n, 1);
    }
    let want = TARGET_BLOCKS.div_ceil(rows.max(1)).clamp(1, n / MIN_ROW_TILE);
    let tile = n.div_ceil(want).next_multiple_of(8);
    (tile, n.div_ceil(tile))
}

/// [`sum_dim_acc`] with the column-sum path chosen by the caller (tests and
/// benches compare the paths; [`SumPath::Auto`] is what `sum_dim_acc` does).
pub fn sum_dim_acc_with(x: &CudaStorage, outer: usize, n: usize, inner: usize, path: SumPath) -> Result<CudaStorage> {
    match x.dtype() {
        DType::F16 | DType::BF16 => sum_into_with(x, outer, n, inner, DType::F32, true, path),
        dt => sum_into_with(x, outer, n, inner, dt, false, path),
    }
}

/// `to_f32`: the `*_to_f32` kernels (half in, f32 sums out).
fn sum_into(x: &CudaStorage, outer: usize, n: usize, inner: usize, out: DType, to_f32: bool) -> Result<CudaStorage> {
    sum_into_with(x, outer, n, inner, out, to_f32, SumPath::Auto)
}

fn sum_into_with(x: &CudaStorage, outer: usize, n: usize, inner: usize, out: DType, to_f32: bool, path: SumPath) -> Result<CudaStorage> {
    float_only("sum", x)?;
    check_len("sum", x, outer * n * inner)?;
    let dev = x.device();
    let y = dev.alloc(out, outer * inner)?;
    if outer * inner == 0 {
        return Ok(y);
    }
    let dt = x.dtype();
    if inner == 1 {
        let (tile, tiles) = match path {
            SumPath::OnePass => (n, 1),
            SumPath::Auto => row_sum_tiling(outer, n),
            // Forced (tests, benches): at least three tiles where n allows.
            SumPath::Tiled => {
                let tile = row_sum_tiling(1, n).0.min(n.div_ceil(3)).max(1);
                (tile, n.div_ceil(tile))
            }
        };
        if tiles > 1 {
            let acc = if dt == DType::F64 { DType::F64 } else { DType::F32 };
            let partials = dev.alloc(acc, outer * tiles)?;
            // One arrival counter per row (the device's kept zeroed counters).
            let counters = dev.arrivals(outer)?;
            let cfg = LaunchConfig {
                grid: (outer.min(super::launch::max_grid() as usize) as u32, tiles as u32, 1),
                block: (THREADS, 1, 1),
                shared_bytes: ROW_SHARED_BYTES,
            };
            let f = if to_f32 { k::sum_rows_tiled_to_f32 } else { k::sum_rows_tiled };
            f(dev, dt, cfg, x, &y, &partials, &counters, i(outer), i(n), i(tile))?;
        } else if n <= SHORT_ROW {
            // A warp per row, THREADS / 32 rows a block.
            let blocks = outer.div_ceil(THREADS as usize / 32).clamp(1, super::launch::max_grid() as usize) as u32;
            let cfg = LaunchConfig { grid: (blocks, 1, 1), block: (THREADS, 1, 1), shared_bytes: 0 };
            let f = if to_f32 { k::sum_rows_warp_to_f32 } else { k::sum_rows_warp };
            f(dev, dt, cfg, x, &y, i(outer), i(n))?;
        } else {
            // Dynamic shared memory: one partial (at most 8 bytes) per warp.
            let cfg = LaunchConfig { shared_bytes: ROW_SHARED_BYTES, ..LaunchConfig::rows(outer, THREADS) };
            let f = if to_f32 { k::sum_rows_to_f32 } else { k::sum_rows };
            f(dev, dt, cfg, x, &y, i(outer), i(n))?;
        }
        return Ok(y);
    }
    let path = if path == SumPath::Auto { col_sum_plan(outer, n, inner) } else { path };
    if path == SumPath::Tiled && n > 0 {
        let (tile_rows, tiles) = col_sum_tiling(outer, n, inner);
        let strips = outer * inner.div_ceil(COL_STRIP);
        let acc = if x.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
        let partials = dev.alloc(acc, strips * tiles * COL_STRIP)?;
        // One arrival counter per strip (the device's kept zeroed counters).
        let counters = dev.arrivals(strips)?;
        let cfg = LaunchConfig {
            grid: (strips.min(super::launch::max_grid() as usize) as u32, tiles as u32, 1),
            block: ((COL_STRIP * ROW_LANES) as u32, 1, 1),
            shared_bytes: 0,
        };
        let f = if to_f32 { k::sum_cols_tiled_to_f32 } else { k::sum_cols_tiled };
        f(dev, dt, cfg, x, &y, &partials, &counters, i(outer), i(n), i(inner), i(tile_rows))?;
    } else {
        let f = if to_f32 { k::sum_cols_to_f32 } else { k::sum_cols };
        f(dev, dt, LaunchConfig::for_elems(outer * inner), x, &y, i(outer), i(n), i(inner))?;
    }
    Ok(y)
}

/// Max over the middle dim: values and the (i64) index of the first maximum.
pub fn max_dim(x: &CudaStorage, outer: usize, n: usize, inner: usize) -> Result<(CudaStorage, CudaStorage)> {
    float_only("max", x)?;
    check_len("max", x, outer * n * inner)?;
    if n == 0 {
        return Err(Error::invalid("max", "max over an empty dim"));
    }
    let dev = x.device();
    let val = dev.alloc(x.dtype(), outer * inner)?;
    let arg = dev.alloc(DType::I64, outer * inner)?;
    if outer * inner > 0 {
        k::max_dim(dev, x.dtype(), LaunchConfig::for_elems(outer * inner), x, &val, &arg, i(outer), i(n), i(inner))?;
    }
    Ok((val, arg))
}

/// The gradient of `max_dim`: `g` scattered to the arg-max positions.
pub fn max_dim_backward(g: &CudaStorage, arg: &CudaStorage, outer: usize, n: usize, inner: usize) -> Result<CudaStorage> {
    float_only("max_backward", g)?;
    check_len("max_backward", g, outer * inner)?;
    check_len("max_backward", arg, outer * inner)?;
    let dev = g.device();
    let out = dev.zeros(g.dtype(), outer * n * inner)?;
    if outer * inner > 0 {
        k::max_dim_bwd(dev, g.dtype(), LaunchConfig::for_elems(outer * inner), g, arg, &out, i(outer), i(n), i(inner))?;
    }
    Ok(out)
}

/// Repeats `(outer, inner)` along a new middle dim of size `n`.
pub fn expand_dim(x: &CudaStorage, outer: usize, n: usize, inner: usize) -> Result<CudaStorage> {
    float_only("expand", x)?;
    check_len("expand", x, outer * inner)?;
    let dev = x.device();
    let y = dev.alloc(x.dtype(), outer * n * inner)?;
    if !y.is_empty() {
        k::expand_dim(dev, x.dtype(), LaunchConfig::for_elems(outer * n * inner), x, &y, i(outer), i(n), i(inner))?;
    }
    Ok(y)
}
