//! Dropout on the GPU in one pass (`cuda/dropout.cu`): the mask is drawn
//! inside the kernel from the same Philox4x32-10 function of (seed, block
//! offset, element) as `tensor::rng`, so it equals the CPU's bit for bit,
//! is never stored, and the backward regenerates it from the same
//! (seed, offset). The activations of the feed-forward block fused with
//! the dropout after them (`act_dropout`) draw the same mask.

use super::nn_common::{elems, expect_dtype, expect_len, same, FLOATS};
use super::{kernels, CudaStorage};
use crate::backend::cpu::elementwise::Unary;
use crate::error::{Error, Result};
use crate::tensor::DType;

/// One dropout draw: the generator words reserved at `(seed, offset)` (one
/// per element, `Rng::advance`) and the drop probability `p`, for kernels
/// that apply a dropout mask inside another op (`norm::add_layer_norm`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropoutDraw {
    pub seed: u64,
    pub offset: u64,
    pub p: f64,
}

impl DropoutDraw {
    /// The kernels' `(keep, scale)`: 1 − p and 1/(1 − p) (0 when p = 1), or
    /// an error naming `op` for a p outside [0, 1].
    pub fn keep_scale(&self, op: &'static str) -> Result<(f64, f64)> {
        let p = self.p;
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::invalid(op, format!("expected 0 <= p <= 1, got {p}")));
        }
        Ok((1.0 - p, if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 }))
    }
}

/// `x` times the scaled keep mask: `x·1/(1−p)` where the uniform draw `u`
/// of element `i` (counter block `offset + i/4`, word `i%4`, key `seed`) is
/// below `1 − p`, else `x·0`. The forward passes x, the backward the output
/// gradient with the forward's (seed, offset); the caller reserved the
/// blocks (`Rng::advance`) so the generator moves as the CPU's does.
pub fn dropout_apply(x: &CudaStorage, seed: u64, offset: u64, p: f64) -> Result<CudaStorage> {
    let op = "dropout";
    expect_dtype(op, x, FLOATS)?;
    let (keep, scale) = DropoutDraw { seed, offset, p }.keep_scale(op)?;
    let n = x.len();
    let dev = x.device();
    let y = dev.alloc(x.dtype(), n)?;
    let blocks = n.div_ceil(4);
    if blocks > 0 {
        kernels::dropout::dropout_apply(dev, x.dtype(), elems(blocks), x, &y, n as u64, seed, offset, keep, scale)?;
    }
    Ok(y)
}

/// `dropout(f(x))` for the activation `op` (relu, silu, gelu or tanh) in one
/// launch (`{op}_dropout_fwd`): f(x) rounded to the dtype, times the mask of
/// `draw`, rounded again; the same bits as the activation's kernel then
/// [`dropout_apply`], without writing f(x).
pub fn act_dropout(op: Unary, x: &CudaStorage, draw: DropoutDraw) -> Result<CudaStorage> {
    let name = "activation dropout";
    let (keep, scale) = act_check(name, op, x, draw)?;
    use kernels::dropout as k;
    let f = match op {
        Unary::Relu => k::relu_dropout_fwd,
        Unary::Silu => k::silu_dropout_fwd,
        Unary::Gelu => k::gelu_dropout_fwd,
        _ => k::tanh_dropout_fwd,
    };
    let (n, dev) = (x.len(), x.device());
    let y = dev.alloc(x.dtype(), n)?;
    if n > 0 {
        f(dev, x.dtype(), elems(n.div_ceil(4)), x, &y, n as u64, draw.seed, draw.offset, keep, scale)?;
    }
    Ok(y)
}

/// The backward of [`act_dropout`] from its input x and the output gradient
/// g (`{op}_dropout_bwd`): (g times the mask, rounded) times f'(x, f(x)),
/// f(x) recomputed; the same bits as [`dropout_apply`] then the
/// activation's backward kernel.
pub fn act_dropout_backward(op: Unary, x: &CudaStorage, g: &CudaStorage, draw: DropoutDraw) -> Result<CudaStorage> {
    let name = "activation dropout backward";
    let (keep, scale) = act_check(name, op, x, draw)?;
    same(name, x, g)?;
    expect_len(name, "the output gradient", g, x.len())?;
    use kernels::dropout as k;
    let f = match op {
        Unary::Relu => k::relu_dropout_bwd,
        Unary::Silu => k::silu_dropout_bwd,
        Unary::Gelu => k::gelu_dropout_bwd,
        _ => k::tanh_dropout_bwd,
    };
    let (n, dev) = (x.len(), x.device());
    let gx = dev.alloc(x.dtype(), n)?;
    if n > 0 {
        f(dev, x.dtype(), elems(n.div_ceil(4)), x, g, &gx, n as u64, draw.seed, draw.offset, keep, scale)?;
    }
    Ok(gx)
}

/// The checks of the fused activation dropout: a float x, one of the four
/// activations, p in [0, 1]; the kernels' (keep, scale).
fn act_check(name: &'static str, op: Unary, x: &CudaStorage, draw: DropoutDraw) -> Result<(f64, f64)> {
    expect_dtype(name, x, FLOATS)?;
    if !matches!(op, Unary::Relu | Unary::Silu | Unary::Gelu | Unary::Tanh) {
        return Err(Error::invalid(name, format!("expected relu, silu, gelu or tanh, found {}", op.name())));
    }
    draw.keep_scale(name)
}

/// The positional table a [`pos_enc_dropout`] adds: rows `offset ..` of a
/// (max_len, D) table, of the input's dtype.
#[derive(Clone, Copy)]
pub struct PosRows<'a> {
    pub table: &'a CudaStorage,
    pub offset: usize,
}

/// The pairs of (input, output) dtypes the fused positional encoding has
/// kernels for: each float type to itself, f32 to f16 and bf16 (autocast).
pub fn pos_enc_dtypes_supported(x: DType, out: DType) -> bool {
    FLOATS.0.contains(&x) && (x == out || (x == DType::F32 && matches!(out, DType::F16 | DType::BF16)))
}

/// [`pos_enc_dtypes_supported`] as a check naming `op`.
fn expect_pos_enc_dtypes(op: &'static str, x: DType, out: DType) -> Result<()> {
    if pos_enc_dtypes_supported(x, out) {
        Ok(())
    } else {
        Err(Error::invalid(op, format!("expected each float dtype to itself or f32 to f16/bf16, found {x:?} to {out:?}")))
    }
}

/// Checks that `table` holds rows `offset .. offset + t` of `d` elements;
/// returns the first row's element offset.
fn table_rows(op: &'static str, table: &CudaStorage, offset: usize, t: usize, d: usize) -> Result<usize> {
    if d == 0 || table.len() % d != 0 || (offset + t) * d > table.len() {
        return Err(Error::ShapeMismatch {
            op,
            expected: format!("a table of rows of {d} holding rows {offset}..{}", offset + t),
            got: format!("{} elements", table.len()),
        });
    }
    Ok(offset * d)
}

/// `dropout(x·s + pe[offset + t])` of x (B, T, D) in one launch
/// (`pos_enc_dropout_fwd`), the sum rounded to `out` before the dropout;
/// `rows` None adds no table, `draw` None drops nothing. The same bits as
/// the composition affine, add, cast, [`dropout_apply`].
pub fn pos_enc_dropout(x: &CudaStorage, t: usize, d: usize, s: f64, rows: Option<PosRows>, out: DType, draw: Option<DropoutDraw>) -> Result<CudaStorage> {
    let op = "positional encoding dropout";
    expect_pos_enc_dtypes(op, x.dtype(), out)?;
    let (n, dev) = (x.len(), x.device());
    let td = t * d;
    if td == 0 || n % td != 0 {
        return Err(Error::ShapeMismatch { op, expected: format!("an input (B, {t}, {d})"), got: format!("{n} elements") });
    }
    let (pe, pe_off) = match rows {
        Some(r) => {
            same(op, x, r.table)?;
            (r.table, table_rows(op, r.table, r.offset, t, d)?)
        }
        None => (x, 0),
    };
    let (drop, seed, offset, keep, scale) = draw_words(op, draw)?;
    let y = dev.alloc(out, n)?;
    if n > 0 {
        kernels::dropout::pos_enc_dropout_fwd(
            dev,
            x.dtype(),
            out,
            elems(n.div_ceil(4)),
            x,
            pe,
            &y,
            n as u64,
            td as u64,
            pe_off as u64,
            u32::from(rows.is_some()),
            s,
            drop,
            seed,
            offset,
            keep,
            scale,
        )?;
    }
    Ok(y)
}

/// The backward of [`pos_enc_dropout`] from the output gradient g (of the
/// output dtype) to x's dtype `x_dtype` (`pos_enc_dropout_bwd`): g times
/// the mask rounded, widened, times s rounded; the composition's bits.
pub fn pos_enc_dropout_backward(g: &CudaStorage, x_dtype: DType, s: f64, draw: Option<DropoutDraw>) -> Result<CudaStorage> {
    let op = "positional encoding dropout backward";
    expect_pos_enc_dtypes(op, x_dtype, g.dtype())?;
    let (drop, seed, offset, keep, scale) = draw_words(op, draw)?;
    let (n, dev) = (g.len(), g.device());
    let gx = dev.alloc(x_dtype, n)?;
    if n > 0 {
        kernels::dropout::pos_enc_dropout_bwd(dev, x_dtype, g.dtype(), elems(n.div_ceil(4)), g, &gx, n as u64, s, drop, seed, offset, keep, scale)?;
    }
    Ok(gx)
}

/// The kernels' (drop, seed, offset, keep, scale) of an optional draw.
fn draw_words(op: &'static str, draw: Option<DropoutDraw>) -> Result<(u32, u64, u64, f64, f64)> {
    match draw {
        Some(dw) => {
            let (keep, scale) = dw.keep_scale(op)?;
            Ok((1, dw.seed, dw.offset, keep, scale))
        }
        None => Ok((0, 0, 0, 1.0, 1.0)),
    }
}

/// Rows `offset .. offset + t` of a (max_len, D) table times the mask of
/// `draw` (None: as they are), rounded to `out` after it, in one launch
/// (`pos_rows_dropout`): the composition's narrow, [`dropout_apply`] and
/// cast, the same bits.
pub fn pos_rows_dropout(table: &CudaStorage, offset: usize, t: usize, d: usize, out: DType, draw: Option<DropoutDraw>) -> Result<CudaStorage> {
    let op = "positional rows dropout";
    expect_pos_enc_dtypes(op, table.dtype(), out)?;
    let pe_off = table_rows(op, table, offset, t, d)?;
    let (drop, seed, off, keep, scale) = draw_words(op, draw)?;
    let (n, dev) = (t * d, table.device());
    let y = dev.alloc(out, n)?;
    if n > 0 {
        kernels::dropout::pos_rows_dropout(dev, table.dtype(), out, elems(n.div_ceil(4)), table, &y, n as u64, pe_off as u64, drop, seed, off, keep, scale)?;
    }
    Ok(y)
}
