//! `to_dtype`: a differentiable dtype conversion (the gradient is converted
//! back), so a layer can run one step (softmax) in f32 on half inputs.

use super::out_storage;
use crate::autograd::record;
use crate::backend::{cuda, Storage};
use crate::error::Result;
use crate::tensor::{DType, Tensor};

/// `x` converted to `dtype` (the same handle when it already is).
pub fn to_dtype(x: &Tensor, dtype: DType) -> Result<Tensor> {
    if x.dtype() == dtype {
        return Ok(x.clone());
    }
    let y = match &*x.storage() {
        Storage::Cpu(c) => Storage::Cpu(c.to_dtype(dtype)),
        Storage::Cuda(g) => Storage::Cuda(cuda::cast::to_dtype(g, dtype)?),
    };
    let y = out_storage(y, x.shape().clone());
    let from = x.dtype();
    Ok(record("to_dtype", &[x], y, vec![], move |g, _| Ok(vec![Some(to_dtype(g, from)?)])))
}
