//! Dropout on the GPU in one pass (`cuda/dropout.cu`): the mask is drawn
//! inside the kernel from the same Philox4x32-10 function of (seed, block
//! offset, element) as `tensor::rng`, so it equals the CPU's bit for bit,
//! is never stored, and the backward regenerates it from the same
//! (seed, offset).

use super::nn_common::{elems, expect_dtype, FLOATS};
use super::{kernels, CudaStorage};
use crate::error::{Error, Result};

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
