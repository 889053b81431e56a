//! `to_dtype`: a differentiable dtype conversion (the gradient is converted
//! back), so a layer can run one step (softmax) in f32 on half inputs.

use super::{cpu, out};
use crate::autograd::record;
use crate::error::Result;
use crate::tensor::{DType, Tensor};

/// `x` converted to `dtype` (the same handle when it already is).
pub fn to_dtype(x: &Tensor, dtype: DType) -> Result<Tensor> {
    if x.dtype() == dtype {
        return Ok(x.clone());
    }
    let y = out(cpu(&x.storage()).to_dtype(dtype), x.shape().clone());
    let from = x.dtype();
    Ok(record("to_dtype", &[x], y, vec![], move |g, _| Ok(vec![Some(to_dtype(g, from)?)])))
}
