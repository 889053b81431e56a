//! A block's chain of residual branches, shared by the encoder and decoder
//! layers: for each branch, pre-norm `x = x + scale·dropout(f(norm(x)))` or
//! post-norm `x = norm(x + scale·dropout(f(x)))`, then the block's final
//! norm if it has one. With the fusion family `norm` on, each residual add
//! goes into the norm that reads its sum (`ops::add_layer_norm`, one launch
//! each way instead of two): pre-norm, the add closing branch i with branch
//! i + 1's norm (the last with the final norm); post-norm, each add with its
//! own norm. The branch's dropout goes into the same kernels (its mask
//! drawn there from the same generator words, so the same elements drop).
//! In a stack of blocks without final norms (the decoder, the transformer
//! encoder) the last add of a block goes into the next block's first norm
//! ([`chain_into`]). The composition is the reference; both give the same
//! values up to the rounding of the gradients' sums.

use crate::autograd;
use crate::error::{Error, Result};
use crate::nn::{Dropout, LayerNorm};
use crate::ops::{self, fusion};
use crate::tensor::Tensor;

/// One residual branch: its norm (before it, pre-norm; after its add,
/// post-norm), the scale of its add (the macaron ½) and the branch.
pub(crate) type Branch<'a> = (&'a LayerNorm, f64, Box<dyn Fn(&Tensor) -> Result<Tensor> + 'a>);

/// x + scale·y in one launch.
fn add(x: &Tensor, y: &Tensor, scale: f64) -> Result<Tensor> {
    if scale != 1.0 {
        ops::add_scaled(x, y, scale)
    } else {
        ops::add(x, y)
    }
}

/// Runs `branches` on `x` in order, then `final_norm`.
pub(crate) fn chain(x: &Tensor, branches: &[Branch], normalize_before: bool, dropout: &Dropout, final_norm: Option<&LayerNorm>) -> Result<Tensor> {
    Ok(chain_into(x, None, branches, normalize_before, dropout, final_norm, None)?.0)
}

/// [`chain`] inside a stack of blocks: `h`, when given, is the first
/// branch's norm of `x` that the block before formed; `next_norm` is the
/// next block's first norm (or the stack's final one). With the norm
/// fusion on, pre-norm and no final norm of its own, the block's last add
/// goes into `next_norm` (one launch each way where the add, its dropout
/// and that norm took three forward and two backward) and its output comes
/// back beside the sum: `(x, Some(next_norm(x)))`. Otherwise `(x, None)`.
pub(crate) fn chain_into(
    x: &Tensor,
    h: Option<&Tensor>,
    branches: &[Branch],
    normalize_before: bool,
    dropout: &Dropout,
    final_norm: Option<&LayerNorm>,
    next_norm: Option<&LayerNorm>,
) -> Result<(Tensor, Option<Tensor>)> {
    if fusion::enabled(fusion::Fusion::Norm) {
        return chain_fused(x, h, branches, normalize_before, dropout, final_norm, next_norm);
    }
    let mut x = x.clone();
    for (norm, scale, f) in branches {
        if normalize_before {
            let y = dropout.forward(&f(&norm.forward(&x)?)?)?;
            x = add(&x, &y, *scale)?;
        } else {
            let y = dropout.forward(&f(&x)?)?;
            x = norm.forward(&add(&x, &y, *scale)?)?;
        }
    }
    finish(x, final_norm)
}

/// The block's output after its last add: `final_norm(x)`, or x.
fn finish(x: Tensor, final_norm: Option<&LayerNorm>) -> Result<(Tensor, Option<Tensor>)> {
    match final_norm {
        Some(n) => Ok((n.forward(&x)?, None)),
        None => Ok((x, None)),
    }
}

/// [`chain_into`] with each add fused into the norm that reads its sum.
fn chain_fused(
    x: &Tensor,
    h: Option<&Tensor>,
    branches: &[Branch],
    normalize_before: bool,
    dropout: &Dropout,
    final_norm: Option<&LayerNorm>,
    next_norm: Option<&LayerNorm>,
) -> Result<(Tensor, Option<Tensor>)> {
    if !normalize_before {
        let mut x = x.clone();
        for (norm, scale, f) in branches {
            let y = f(&x)?;
            x = norm.add_forward(&x, &y, *scale, dropout)?.1;
        }
        return finish(x, final_norm);
    }
    let Some((first, _, _)) = branches.first() else {
        return finish(x.clone(), final_norm);
    };
    let (mut x, mut h) = match h {
        Some(h) => (x.clone(), h.clone()),
        None => (x.clone(), first.forward(x)?),
    };
    for (i, (_, scale, f)) in branches.iter().enumerate() {
        let y = f(&h)?;
        let last = i + 1 == branches.len();
        match branches.get(i + 1).map(|b| b.0).or(final_norm) {
            Some(n) => (x, h) = n.add_forward(&x, &y, *scale, dropout)?,
            None => match next_norm {
                // The next block's first norm reads this sum: hand it both.
                Some(n) if last => {
                    let (x, h) = n.add_forward(&x, &y, *scale, dropout)?;
                    return Ok((x, Some(h)));
                }
                _ => return Ok((add(&x, &dropout.forward(&y)?, *scale)?, None)),
            },
        }
    }
    // The last add went into the final norm: its output is the block's.
    Ok((h, None))
}

/// A block of a stack run as one activation-checkpointed segment:
/// `f(x, h, other)` as in [`chain_into`]'s callers, over the segment's
/// inputs x, `other` (the memory or the positional rows) and h when given;
/// its sum and next-norm output come back as the block's.
pub(crate) fn checkpointed_block(
    x: Tensor,
    other: &Tensor,
    h: Option<Tensor>,
    f: impl Fn(&Tensor, Option<&Tensor>, &Tensor) -> Result<(Tensor, Option<Tensor>)> + 'static,
) -> Result<(Tensor, Option<Tensor>)> {
    let given = h.is_some();
    let mut ins = vec![x, other.clone()];
    ins.extend(h);
    let outs = autograd::checkpoint(
        move |xs: &[Tensor]| {
            let (x, h) = f(&xs[0], if given { xs.get(2) } else { None }, &xs[1])?;
            Ok([x].into_iter().chain(h).collect())
        },
        &ins,
    )?;
    let mut outs = outs.into_iter();
    Ok((outs.next().ok_or_else(|| Error::Autograd("checkpoint returned no output".into()))?, outs.next()))
}
