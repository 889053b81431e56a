//! The gated linear unit on the GPU (`cuda/glu.cu`); mirrors
//! `backend::cpu::elementwise::glu`: x viewed as (outer, 2, hi), one launch
//! each way.

use super::kernels::glu as k;
use super::nn_common::{elems, expect_dtype, expect_len, same, FLOATS};
use super::CudaStorage;
use crate::error::Result;

/// `y (outer, hi) = a·σ(b)` for the halves a = x[:, 0], b = x[:, 1] of x (outer, 2, hi).
pub fn glu(x: &CudaStorage, outer: usize, hi: usize) -> Result<CudaStorage> {
    let op = "glu";
    expect_dtype(op, x, FLOATS)?;
    expect_len(op, "the input (outer, 2, h·inner)", x, outer * 2 * hi)?;
    let dev = x.device();
    let n = outer * hi;
    let y = dev.alloc(x.dtype(), n)?;
    if n > 0 {
        k::glu_fwd(dev, x.dtype(), elems(n), x, &y, n as u64, hi as u64)?;
    }
    Ok(y)
}

/// The input gradient (outer, 2, hi) of [`glu`] from x and the output gradient g (outer, hi).
pub fn glu_backward(x: &CudaStorage, g: &CudaStorage, outer: usize, hi: usize) -> Result<CudaStorage> {
    let op = "glu_backward";
    expect_dtype(op, x, FLOATS)?;
    same(op, x, g)?;
    expect_len(op, "the input (outer, 2, h·inner)", x, outer * 2 * hi)?;
    expect_len(op, "the output gradient (outer, h·inner)", g, outer * hi)?;
    let dev = x.device();
    let n = outer * hi;
    let gx = dev.alloc(x.dtype(), x.len())?;
    if n > 0 {
        k::glu_bwd(dev, x.dtype(), elems(n), x, g, &gx, n as u64, hi as u64)?;
    }
    Ok(gx)
}
