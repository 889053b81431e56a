//! Dropout masks on the GPU (`cuda/dropout.cu`): the same Philox4x32-10
//! function of (seed, block offset, element) as `tensor::rng`, so the mask
//! equals the CPU's bit for bit and a recompute draws the same one.

use super::nn_common::{elems, launch, FLOATS};
use super::{Arg, CudaDevice, CudaStorage};
use crate::error::{Error, Result};
use crate::tensor::DType;
use std::sync::Arc;

/// The scaled keep mask of `n` elements in `dtype`: `1/(1−p)` where the
/// uniform draw `u` of element `i` (counter block `offset + i/4`, word `i%4`,
/// key `seed`) is below `1 − p`, else 0. The caller reserves the blocks
/// (`Rng::advance`) so the generator moves as the CPU's does.
pub fn dropout_mask(dev: &Arc<CudaDevice>, dtype: DType, n: usize, seed: u64, offset: u64, p: f64) -> Result<CudaStorage> {
    if !FLOATS.0.contains(&dtype) {
        return Err(Error::UnsupportedDType { op: "dropout", dtype, supported: FLOATS.1 });
    }
    if !(0.0..=1.0).contains(&p) {
        return Err(Error::invalid("dropout", format!("expected 0 <= p <= 1, got {p}")));
    }
    let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
    let mask = dev.alloc(dtype, n)?;
    let blocks = n.div_ceil(4);
    let args = [Arg::Ptr(&mask), Arg::U64(n as u64), Arg::U64(seed), Arg::U64(offset), Arg::F64(1.0 - p), Arg::F64(scale)];
    launch(dev, "dropout", "dropout_mask", dtype, blocks, elems(blocks), &args)?;
    Ok(mask)
}
