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
//! ([`Block::chain_into`], [`run_stack`]). A branch may name rows of its
//! output to zero before its dropout and add (the conformer convolution
//! module's padded frames): the fused add takes that mask into its launches
//! (`ops::add_layer_norm_masked`), the composition runs `masked_fill`. The
//! composition is the reference; both give the same values up to the
//! rounding of the gradients' sums.

use crate::autograd;
use crate::error::{Error, Result};
use crate::nn::{Dropout, LayerNorm};
use crate::ops::{self, fusion};
use crate::tensor::Tensor;

/// One residual branch: its norm (before it, pre-norm; after its add,
/// post-norm), the scale of its add (the macaron ½), the rows of its output
/// to zero (u8 of the output's shape with the last dim 1, 1 = zero) and the
/// branch.
pub(crate) struct Branch<'a> {
    pub norm: &'a LayerNorm,
    pub scale: f64,
    pub rows: Option<Tensor>,
    pub f: Box<dyn Fn(&Tensor) -> Result<Tensor> + 'a>,
}

impl<'a> Branch<'a> {
    /// A branch whose output is added whole.
    pub(crate) fn new(norm: &'a LayerNorm, scale: f64, f: Box<dyn Fn(&Tensor) -> Result<Tensor> + 'a>) -> Self {
        Branch { norm, scale, rows: None, f }
    }

    /// The branch's output `y` with its masked rows zeroed (the composition's
    /// `masked_fill`; the fused add zeroes them in its own launches).
    fn masked(&self, y: Tensor) -> Result<Tensor> {
        match &self.rows {
            Some(m) => ops::masked_fill(&y, m, 0.0),
            None => Ok(y),
        }
    }
}

/// x + scale·y in one launch.
fn add(x: &Tensor, y: &Tensor, scale: f64) -> Result<Tensor> {
    if scale != 1.0 {
        ops::add_scaled(x, y, scale)
    } else {
        ops::add(x, y)
    }
}

/// A block's residual chain: its branches in order, pre-norm or post-norm,
/// the dropout on each branch's output and the block's final norm.
pub(crate) struct Block<'a> {
    pub branches: &'a [Branch<'a>],
    pub normalize_before: bool,
    pub dropout: &'a Dropout,
    pub final_norm: Option<&'a LayerNorm>,
}

impl Block<'_> {
    /// Runs the branches on `x` in order, then the final norm.
    pub(crate) fn chain(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.chain_into(x, None, None)?.0)
    }

    /// [`Block::chain`] inside a stack of blocks: `h`, when given, is the
    /// first branch's norm of `x` that the block before formed; `next_norm`
    /// is the next block's first norm (or the stack's final one). With the
    /// norm fusion on, pre-norm and no final norm of its own, the block's
    /// last add goes into `next_norm` (one launch each way where the add,
    /// its dropout and that norm took three forward and two backward) and
    /// its output comes back beside the sum: `(x, Some(next_norm(x)))`.
    /// Otherwise `(x, None)`.
    pub(crate) fn chain_into(&self, x: &Tensor, h: Option<&Tensor>, next_norm: Option<&LayerNorm>) -> Result<(Tensor, Option<Tensor>)> {
        if fusion::enabled(fusion::Fusion::Norm) {
            return self.chain_fused(x, h, next_norm);
        }
        let mut x = x.clone();
        for br in self.branches {
            if self.normalize_before {
                let y = self.dropout.forward(&br.masked((br.f)(&br.norm.forward(&x)?)?)?)?;
                x = add(&x, &y, br.scale)?;
            } else {
                let y = self.dropout.forward(&br.masked((br.f)(&x)?)?)?;
                x = br.norm.forward(&add(&x, &y, br.scale)?)?;
            }
        }
        finish(x, self.final_norm)
    }

    /// [`Block::chain_into`] with each add fused into the norm that reads its sum.
    fn chain_fused(&self, x: &Tensor, h: Option<&Tensor>, next_norm: Option<&LayerNorm>) -> Result<(Tensor, Option<Tensor>)> {
        let (branches, dropout) = (self.branches, self.dropout);
        if !self.normalize_before {
            let mut x = x.clone();
            for br in branches {
                let y = (br.f)(&x)?;
                x = br.norm.add_forward(&x, &y, br.rows.as_ref(), br.scale, dropout)?.1;
            }
            return finish(x, self.final_norm);
        }
        let Some(first) = branches.first() else {
            return finish(x.clone(), self.final_norm);
        };
        let (mut x, mut h) = match h {
            Some(h) => (x.clone(), h.clone()),
            None => (x.clone(), first.norm.forward(x)?),
        };
        for (i, br) in branches.iter().enumerate() {
            let y = (br.f)(&h)?;
            let last = i + 1 == branches.len();
            let rows = br.rows.as_ref();
            match branches.get(i + 1).map(|b| b.norm).or(self.final_norm) {
                Some(n) => (x, h) = n.add_forward(&x, &y, rows, br.scale, dropout)?,
                None => match next_norm {
                    // The next block's first norm reads this sum: hand it both.
                    Some(n) if last => {
                        let (x, h) = n.add_forward(&x, &y, rows, br.scale, dropout)?;
                        return Ok((x, Some(h)));
                    }
                    _ => return Ok((add(&x, &dropout.forward(&br.masked(y)?)?, br.scale)?, None)),
                },
            }
        }
        // The last add went into the final norm: its output is the block's.
        Ok((h, None))
    }
}

/// The block's output after its last add: `final_norm(x)`, or x.
fn finish(x: Tensor, final_norm: Option<&LayerNorm>) -> Result<(Tensor, Option<Tensor>)> {
    match final_norm {
        Some(n) => Ok((n.forward(&x)?, None)),
        None => Ok((x, None)),
    }
}

/// A block of a stack run as one activation-checkpointed segment:
/// `f(x, h, other)` as in [`Block::chain_into`]'s callers, over the segment's
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

/// A stack of blocks, each run by `block(layer, x, h, next_norm)` (through
/// [`Block::chain_into`], checkpointed or not), then `final_norm`: each
/// block gets the next block's first norm (`first_norm`), the last one
/// `final_norm`, so that with the norm fusion a block's last add goes into
/// the norm after it, and the norm output it hands on (`h`) is the next
/// block's input norm or the stack's output.
pub(crate) fn run_stack<L>(
    mut x: Tensor,
    layers: &[L],
    first_norm: impl Fn(&L) -> &LayerNorm,
    final_norm: Option<&LayerNorm>,
    mut block: impl FnMut(&L, Tensor, Option<Tensor>, Option<&LayerNorm>) -> Result<(Tensor, Option<Tensor>)>,
) -> Result<Tensor> {
    let mut h: Option<Tensor> = None;
    for (i, layer) in layers.iter().enumerate() {
        let next = match layers.get(i + 1) {
            Some(l) => Some(first_norm(l)),
            None => final_norm,
        };
        (x, h) = block(layer, x, h, next)?;
    }
    match (final_norm, h) {
        (Some(_), Some(h)) => Ok(h),
        (Some(n), None) => n.forward(&x),
        (None, _) => Ok(x),
    }
}
