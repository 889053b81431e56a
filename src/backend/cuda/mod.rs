//! The CUDA backend. Its kernels, cudarc runtime and caching allocator are
//! built in the CUDA issue; until then every request for a GPU is a clear
//! error and no GPU storage can exist.

use crate::error::{Error, Result};
use crate::tensor::DType;

/// GPU storage. Uninhabited until the CUDA runtime lands, so every match on
/// a device is exhaustive and no GPU path can be reached by accident.
#[derive(Debug)]
pub enum CudaStorage {}

impl CudaStorage {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match *self {}
    }
    /// Bytes held.
    pub fn size_in_bytes(&self) -> usize {
        match *self {}
    }
}

/// Whether GPU `ordinal` can be used; the error says why not.
pub fn check_available(ordinal: usize) -> Result<()> {
    let why = if cfg!(feature = "cuda") {
        "this build has no CUDA runtime yet (the CUDA backend is not implemented in this version)"
    } else {
        "asrforge was built without the `cuda` feature"
    };
    Err(Error::CudaUnavailable(format!("cannot open cuda:{ordinal}: {why}")))
}
