//! Dtype conversions on the GPU (`cuda/cast.cu`), the twin of
//! `CpuStorage::to_dtype`: any of f32, f64, f16, bf16, i64, u8 to any other.

use super::{dtype_suffix, Arg, CudaStorage, LaunchConfig};
use crate::error::Result;
use crate::tensor::DType;

/// `x` converted to `dtype` (a copy when it already is).
pub fn to_dtype(x: &CudaStorage, dtype: DType) -> Result<CudaStorage> {
    if x.dtype() == dtype {
        return x.try_clone();
    }
    let dev = x.device();
    let y = dev.alloc(dtype, x.len())?;
    if x.is_empty() {
        return Ok(y);
    }
    let kernel = format!("cast_{}_{}", dtype_suffix(x.dtype()), dtype_suffix(dtype));
    dev.launch("cast", &kernel, LaunchConfig::for_elems(x.len()), &[Arg::Ptr(x), Arg::Ptr(&y), Arg::I64(x.len() as i64)])?;
    Ok(y)
}
