//! A block's chain of residual branches, shared by the encoder and decoder
//! layers: for each branch, pre-norm `x = x + scale·dropout(f(norm(x)))` or
//! post-norm `x = norm(x + scale·dropout(f(x)))`, then the block's final
//! norm if it has one. With the fusion family `norm` on, each residual add
//! goes into the norm that reads its sum (`ops::add_layer_norm`, one launch
//! each way instead of two): pre-norm, the add closing branch i with branch
//! i + 1's norm (the last with the final norm); post-norm, each add with its
//! own norm. The branch's dropout goes into the same kernels (its mask
//! drawn there from the same generator words, so the same elements drop).
//! The composition is the reference; both give the same values up to the
//! rounding of the gradients' sums.

use crate::error::Result;
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
    if fusion::enabled(fusion::Fusion::Norm) {
        return chain_fused(x, branches, normalize_before, dropout, final_norm);
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
    match final_norm {
        Some(n) => n.forward(&x),
        None => Ok(x),
    }
}

/// [`chain`] with each add fused into the norm that reads its sum.
fn chain_fused(x: &Tensor, branches: &[Branch], normalize_before: bool, dropout: &Dropout, final_norm: Option<&LayerNorm>) -> Result<Tensor> {
    if !normalize_before {
        let mut x = x.clone();
        for (norm, scale, f) in branches {
            let y = f(&x)?;
            x = norm.add_forward(&x, &y, *scale, dropout)?.1;
        }
        return match final_norm {
            Some(n) => n.forward(&x),
            None => Ok(x),
        };
    }
    let Some((first, _, _)) = branches.first() else {
        return match final_norm {
            Some(n) => n.forward(x),
            None => Ok(x.clone()),
        };
    };
    let (mut x, mut h) = (x.clone(), first.forward(x)?);
    for (i, (_, scale, f)) in branches.iter().enumerate() {
        let y = f(&h)?;
        match branches.get(i + 1).map(|b| b.0).or(final_norm) {
            Some(n) => (x, h) = n.add_forward(&x, &y, *scale, dropout)?,
            None => return add(&x, &dropout.forward(&y)?, *scale),
        }
    }
    // The last add went into the final norm: its output is the block's.
    Ok(h)
}
