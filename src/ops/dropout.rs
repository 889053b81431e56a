//! Inverted dropout: `y = x·m/(1−p)` with `m ~ Bernoulli(1−p)` drawn from the
//! thread's default counter-based generator (so a recompute after restoring
//! its state draws the same mask). No mask is stored: the forward reserves
//! the generator's words and keeps their (seed, offset) on the tape, and the
//! backward draws the same mask again (`gx = g·m/(1−p)`). On the GPU each
//! pass is one kernel drawing the same (seed, offset, element) Philox words
//! as the CPU, so both devices drop the same elements bit for bit.

use super::out_storage;
use crate::autograd::record;
use crate::backend::cpu::elementwise::Unary;
use crate::backend::cpu::{pool, CpuStorage};
use crate::backend::cuda::dropout as gpu;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::tensor::{rng, DType, Tensor};

/// The scaled keep mask of the draw at `(seed, offset)` for `n` elements of
/// `dtype`, on the CPU (the f64 scale rounded once to the dtype).
fn cpu_mask(dtype: DType, n: usize, seed: u64, offset: u64, p: f64) -> CpuStorage {
    let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
    let mut r = rng::Rng { seed, offset };
    match dtype {
        DType::F32 => {
            let mut m = pool::zeroed::<f32>(n);
            r.bernoulli_into(&mut m, 1.0 - p, scale as f32, 0.0);
            CpuStorage::F32(m)
        }
        dt => CpuStorage::F64(r.bernoulli_map(n, 1.0 - p, scale, 0.0)).to_dtype(dt),
    }
}

/// Reserves the generator words of a draw over `n` elements (one each, so
/// the generator moves as it always did): its `(seed, offset)`.
pub(super) fn reserve(n: usize) -> (u64, u64) {
    rng::with_default(|r| (r.seed, r.advance(n)))
}

/// A draw of probability `p` over `n` elements for a kernel that applies
/// the mask inside another op: its generator words reserved now, as
/// [`dropout`] reserves them at this point.
pub(super) fn draw(n: usize, p: f64) -> gpu::DropoutDraw {
    let (seed, offset) = reserve(n);
    gpu::DropoutDraw { seed, offset, p }
}

/// [`draw`] when a dropout of `p` applies (`training` and p > 0), else None.
fn draw_if(n: usize, p: f64, training: bool) -> Option<gpu::DropoutDraw> {
    (training && p > 0.0).then(|| draw(n, p))
}

/// Checks a dropout probability: 0 <= p <= 1.
fn check_p(op: &'static str, p: f64) -> Result<()> {
    if (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(Error::invalid(op, format!("expected 0 <= p <= 1, got {p}")))
    }
}

/// Checks a positional table, (1, max_len, D) or (max_len, D) with D = `d`
/// where given, holding rows `offset .. offset + t`; returns its D.
fn table_width(op: &'static str, pe: &Tensor, offset: usize, t: usize, d: Option<usize>) -> Result<usize> {
    let (pd, rank) = (pe.dims(), pe.rank());
    let ok = matches!(rank, 2 | 3) && (rank == 2 || pd[0] == 1) && d.is_none_or(|d| pd[rank - 1] == d) && offset + t <= pd[rank - 2];
    if !ok {
        let dd = d.map_or("D".to_string(), |d| d.to_string());
        return Err(Error::ShapeMismatch {
            op,
            expected: format!("a table (1, max_len, {dd}) or (max_len, {dd}) holding rows {offset}..{}", offset + t),
            got: format!("{}", pe.shape()),
        });
    }
    Ok(pd[rank - 1])
}

/// `x` (the input, or the output gradient in backward) times the mask of
/// the draw at `(seed, offset)`, on x's device.
pub(super) fn apply(x: &Tensor, seed: u64, offset: u64, p: f64) -> Result<Tensor> {
    let s = match &*x.storage() {
        Storage::Cpu(_) => None,
        Storage::Cuda(g) => Some(Storage::Cuda(gpu::dropout_apply(g, seed, offset, p)?)),
    };
    match s {
        Some(s) => Ok(out_storage(s, x.shape().clone())),
        None => {
            let dt = x.dtype();
            let mask = cpu_mask(dt, x.elem_count(), seed, offset, p);
            crate::autograd::no_grad(|| match dt {
                // Half: the product of the half value and the half mask, exact
                // in f32, rounded once to the half type (as the GPU kernel).
                DType::F16 | DType::BF16 => {
                    let m = Tensor::from_cpu(mask.to_dtype(DType::F32), x.shape().clone())?;
                    super::to_dtype(&super::mul(&super::to_dtype(x, DType::F32)?, &m)?, dt)
                }
                _ => super::mul(x, &Tensor::from_cpu(mask, x.shape().clone())?),
            })
        }
    }
}

/// Dropout with probability `p`; the identity when not `training` or p = 0.
pub fn dropout(x: &Tensor, p: f64, training: bool) -> Result<Tensor> {
    check_p("dropout", p)?;
    if !training || p == 0.0 {
        return Ok(x.clone());
    }
    if !x.dtype().is_float() {
        return Err(Error::UnsupportedDType { op: "dropout", dtype: x.dtype(), supported: "f32, f64, f16, bf16" });
    }
    // The words of this draw, reserved now so the generator moves as it
    // always did (n words); the backward redraws them from (seed, offset).
    let (seed, offset) = reserve(x.elem_count());
    let y = apply(x, seed, offset, p)?;
    Ok(record("dropout", &[x], y, vec![], move |g, _| Ok(vec![Some(apply(g, seed, offset, p)?)])))
}

/// `dropout(f(x), p)` for the activation `f` = relu, silu, gelu or tanh (the
/// feed-forward block's `dropout(act(w_1·x))`; fusion family `ffn`). On a
/// GPU, one launch each way (`cuda/dropout.cu`'s `{f}_dropout_fwd/_bwd`):
/// f(x) is never written, the backward recomputes it from x, and the mask
/// is drawn from the words `ops::dropout` reserves at this point, so the
/// result is the composition's bit for bit. On the CPU, and when not
/// `training` or p = 0, it is the composition.
pub fn activation_dropout(x: &Tensor, f: Unary, p: f64, training: bool) -> Result<Tensor> {
    let op = "activation_dropout";
    let act = match f {
        Unary::Relu => super::relu,
        Unary::Silu => super::silu,
        Unary::Gelu => super::gelu,
        Unary::Tanh => super::tanh,
        other => return Err(Error::invalid(op, format!("expected relu, silu, gelu or tanh, found {}", other.name()))),
    };
    check_p(op, p)?;
    let on_gpu = matches!(&*x.storage(), Storage::Cuda(_));
    if !on_gpu || !training || p == 0.0 {
        return dropout(&act(x)?, p, training);
    }
    if !x.dtype().is_float() {
        return Err(Error::UnsupportedDType { op, dtype: x.dtype(), supported: "f32, f64, f16, bf16" });
    }
    let draw = draw(x.elem_count(), p);
    let y = match &*x.storage() {
        Storage::Cuda(c) => gpu::act_dropout(f, c, draw)?,
        Storage::Cpu(_) => return Err(Error::invalid(op, "expected a GPU tensor")),
    };
    let y = out_storage(Storage::Cuda(y), x.shape().clone());
    let xs = x.detach();
    Ok(record(op, &[x], y, vec![xs.clone()], move |g, _| {
        let gx = match (&*xs.storage(), &*g.storage()) {
            (Storage::Cuda(xc), Storage::Cuda(gc)) => gpu::act_dropout_backward(f, xc, gc, draw)?,
            _ => return Err(super::mixed("activation_dropout backward")),
        };
        Ok(vec![Some(out_storage(Storage::Cuda(gx), xs.shape().clone()))])
    }))
}

/// WeNet's positional encoding with its dropout (fusion family `posenc`):
/// `dropout(x·scale + pe[offset .. offset + T])` of x (B, T, D), the sum
/// rounded to `out` before the dropout (x's dtype, or under autocast the
/// half type where x is f32). `table` is the (1, max_len, D) or
/// (max_len, D) table and the first row to add, or None (relative
/// positions: `dropout(x·scale)`). On a GPU, one launch each way
/// (`cuda/dropout.cu`'s `pos_enc_dropout_fwd/_bwd`) instead of the narrow,
/// affine, add, cast and dropout, with the mask drawn from the words
/// `ops::dropout` reserves at this point: the composition's bits. On the
/// CPU, for a table that needs a gradient, or for dtypes the kernels lack,
/// it is the composition.
pub fn pos_enc_dropout(x: &Tensor, scale: f64, table: Option<(&Tensor, usize)>, out: DType, p: f64, training: bool) -> Result<Tensor> {
    let op = "pos_enc_dropout";
    if x.rank() != 3 {
        return Err(Error::ShapeMismatch { op, expected: "an input (B, T, D)".into(), got: format!("{}", x.shape()) });
    }
    check_p(op, p)?;
    let (t, d) = (x.dims()[1], x.dims()[2]);
    if let Some((pe, offset)) = table {
        table_width(op, pe, offset, t, Some(d))?;
    }
    let fused = matches!(&*x.storage(), Storage::Cuda(_))
        && gpu::pos_enc_dtypes_supported(x.dtype(), out)
        && table.is_none_or(|(pe, _)| pe.dtype() == x.dtype() && pe.device() == x.device() && !pe.requires_grad());
    if !fused {
        let mut y = super::mul_scalar(x, scale)?;
        if let Some((pe, offset)) = table {
            y = super::add(&y, &super::narrow(pe, pe.rank() as isize - 2, offset, t)?)?;
        }
        if y.dtype() != out {
            y = super::to_dtype(&y, out)?;
        }
        return dropout(&y, p, training);
    }
    let draw = draw_if(x.elem_count(), p, training);
    let y = {
        let pe_storage = table.map(|(pe, _)| pe.storage());
        match (&*x.storage(), pe_storage.as_deref()) {
            (Storage::Cuda(xc), None) => gpu::pos_enc_dropout(xc, t, d, scale, None, out, draw)?,
            (Storage::Cuda(xc), Some(Storage::Cuda(pc))) => {
                let rows = gpu::PosRows { table: pc, offset: table.map_or(0, |(_, o)| o) };
                gpu::pos_enc_dropout(xc, t, d, scale, Some(rows), out, draw)?
            }
            _ => return Err(super::mixed(op)),
        }
    };
    let y = out_storage(Storage::Cuda(y), x.shape().clone());
    let x_dtype = x.dtype();
    Ok(record(op, &[x], y, vec![], move |g, _| {
        let gx = match &*g.storage() {
            Storage::Cuda(gc) => gpu::pos_enc_dropout_backward(gc, x_dtype, scale, draw)?,
            Storage::Cpu(_) => return Err(super::mixed("pos_enc_dropout backward")),
        };
        Ok(vec![Some(out_storage(Storage::Cuda(gx), g.shape().clone()))])
    }))
}

/// The relative positional encoding's rows with their dropout (fusion
/// family `posenc`): `dropout(pe[offset .. offset + t])` of the
/// (1, max_len, D) or (max_len, D) table, of the table's rank, rounded to
/// `out` after the dropout (under autocast, the half type the first
/// attention layer's projection would cast the rows to). On a GPU, one
/// launch (`cuda/dropout.cu`'s `pos_rows_dropout`) instead of the narrow,
/// the dropout and the cast, with the mask drawn from the words
/// `ops::dropout` reserves at this point: the composition's bits. On the
/// CPU, for a table that needs a gradient, or for dtypes the kernel lacks,
/// it is the composition.
pub fn pos_rows_dropout(table: &Tensor, offset: usize, t: usize, out: DType, p: f64, training: bool) -> Result<Tensor> {
    let op = "pos_rows_dropout";
    check_p(op, p)?;
    let d = table_width(op, table, offset, t, None)?;
    let rank = table.rank();
    let fused = matches!(&*table.storage(), Storage::Cuda(_)) && gpu::pos_enc_dtypes_supported(table.dtype(), out) && !table.requires_grad();
    if !fused {
        let rows = dropout(&super::narrow(table, rank as isize - 2, offset, t)?, p, training)?;
        return if rows.dtype() == out { Ok(rows) } else { super::to_dtype(&rows, out) };
    }
    let draw = draw_if(t * d, p, training);
    let y = match &*table.storage() {
        Storage::Cuda(c) => gpu::pos_rows_dropout(c, offset, t, d, out, draw)?,
        Storage::Cpu(_) => return Err(super::mixed(op)),
    };
    let shape: Vec<usize> = if rank == 3 { vec![1, t, d] } else { vec![t, d] };
    Ok(out_storage(Storage::Cuda(y), shape))
}
