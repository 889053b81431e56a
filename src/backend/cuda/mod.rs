//! The CUDA backend. Its kernels, cudarc runtime and caching allocator are
//! built in the CUDA issue; until then every request for a GPU is a clear
//! error and no GPU storage can exist.

pub mod conv;
pub mod dropout;
pub mod index;
pub mod layout;
mod nn_common;
pub mod norm;
pub mod softmax;

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

// ---- Placeholder for the runtime API the `cuda` branch provides ----
// The names and signatures of the plan (CudaDevice::alloc/launch,
// LaunchConfig, Arg, dtype_suffix), so the nn families type-check before
// the runtime merges; every call is an error and no storage can exist.
// Replaced wholesale by the `cuda` branch's runtime on merge.
use crate::backend::cpu::CpuStorage;
use std::sync::Arc;
#[derive(Debug)]
pub struct CudaDevice;
pub(crate) fn device(_o: usize) -> Result<Arc<CudaDevice>> { Err(Error::CudaUnavailable("stub".into())) }
impl CudaStorage {
    pub fn len(&self) -> usize { match *self {} }
    pub fn ordinal(&self) -> usize { match *self {} }
    pub fn device(&self) -> &Arc<CudaDevice> { match *self {} }
    pub fn to_cpu(&self) -> Result<CpuStorage> { match *self {} }
    pub fn copy_from(&self, _o: &CudaStorage) -> Result<()> { match *self {} }
    pub fn from_cpu(_dev: &Arc<CudaDevice>, _c: &CpuStorage) -> Result<CudaStorage> { Err(Error::CudaUnavailable("stub".into())) }
}
impl CudaDevice {
    pub fn alloc(self: &Arc<Self>, _d: DType, _n: usize) -> Result<CudaStorage> { Err(Error::CudaUnavailable("stub".into())) }
    pub fn zeros(self: &Arc<Self>, _d: DType, _n: usize) -> Result<CudaStorage> { Err(Error::CudaUnavailable("stub".into())) }
    pub fn synchronize(&self) -> Result<()> { Ok(()) }
    pub fn launch(&self, _m: &str, _k: &str, _c: LaunchConfig, _a: &[Arg]) -> Result<()> { Ok(()) }
}
#[derive(Clone, Copy, Debug)]
pub struct LaunchConfig { pub grid: (u32, u32, u32), pub block: (u32, u32, u32), pub shared_bytes: u32 }
pub enum Arg<'a> { Ptr(&'a CudaStorage), U32(u32), I32(i32), U64(u64), I64(i64), F32(f32), F64(f64) }
pub(crate) fn dtype_suffix(d: DType) -> &'static str { match d { DType::F32 => "f32", DType::F64 => "f64", DType::F16 => "f16", DType::BF16 => "bf16", DType::I64 => "i64", DType::U8 => "u8" } }
