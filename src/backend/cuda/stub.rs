//! The CUDA backend of a build without the `cuda` feature: the same names
//! as the real runtime, but no device can be opened, so no value of these
//! types can exist and every GPU path is unreachable by construction.

use super::launch::LaunchConfig;
use super::PoolStats;
use crate::backend::cpu::CpuStorage;
use crate::error::Result;
use crate::tensor::DType;
use std::sync::Arc;

/// What a driver is (only GPUs would exist, and none can in this build).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriverKind {
    /// The CUDA driver on a GPU.
    Gpu,
    /// The CPU emulator: its module folder and thread schedule.
    Emulated { dir: String, schedule: String },
}

/// A GPU (cannot exist in this build).
#[derive(Debug)]
pub enum CudaDevice {}

/// GPU storage (cannot exist in this build).
#[derive(Debug)]
pub enum CudaStorage {}

/// A pinned host buffer (cannot exist in this build).
pub enum PinnedBuffer {}

/// Scalars on their way to the host (cannot exist in this build).
pub enum ScalarReadback {}

impl ScalarReadback {
    /// Queues the read-back (no storage can exist to read).
    pub fn start(xs: &[&CudaStorage]) -> Result<ScalarReadback> {
        match xs.first() {
            Some(x) => match **x {},
            None => Err(crate::error::Error::invalid("scalar read-back", "expected at least one value, found none")),
        }
    }
    /// The values.
    pub fn values(self) -> Result<Vec<f64>> {
        match self {}
    }
}

impl CudaDevice {
    /// The GPU's ordinal.
    pub fn ordinal(&self) -> usize {
        match *self {}
    }
    /// Uninitialised storage.
    pub fn alloc(self: &Arc<Self>, _dtype: DType, _len: usize) -> Result<CudaStorage> {
        match **self {}
    }
    /// Zero-filled storage.
    pub fn zeros(self: &Arc<Self>, _dtype: DType, _len: usize) -> Result<CudaStorage> {
        match **self {}
    }
    /// Zeroed arrival counters for a folding kernel.
    pub(crate) fn arrivals(self: &Arc<Self>, _n: usize) -> Result<super::launch::Arrivals<'_>> {
        match **self {}
    }
    /// Launches a kernel (what the generated functions of `kernels` call).
    ///
    /// # Safety
    /// Unreachable without the `cuda` feature (no device can be opened).
    pub(crate) unsafe fn launch_kernel(
        &self,
        _id: usize,
        _cfg: LaunchConfig,
        _params: &mut [*mut std::ffi::c_void],
        _bufs: &[&CudaStorage],
        _moved: Option<(u64, u64)>,
    ) -> Result<()> {
        match *self {}
    }
    /// Waits for queued work.
    pub fn synchronize(&self) -> Result<()> {
        match *self {}
    }
    /// The driver seam's counters.
    pub fn counters(&self) -> super::Counters {
        match *self {}
    }
    /// Whether this device is the CPU emulator.
    pub fn is_emulated(&self) -> bool {
        match *self {}
    }
    /// The allocator's counters.
    pub fn pool_stats(&self) -> PoolStats {
        match *self {}
    }
    /// Starts the pool's peak over from the bytes in use now.
    pub fn reset_peak(&self) {
        match *self {}
    }
    /// The most bytes in use at once since the device opened (or the last reset).
    pub fn peak_bytes(&self) -> usize {
        match *self {}
    }
    /// The bytes in use now.
    pub fn current_bytes(&self) -> usize {
        match *self {}
    }
    /// Returns cached blocks to the driver.
    pub fn empty_cache(&self) -> Result<()> {
        match *self {}
    }
}

impl CudaStorage {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match *self {}
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        match *self {}
    }
    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        match *self {}
    }
    /// Bytes of data.
    pub fn size_in_bytes(&self) -> usize {
        match *self {}
    }
    /// The GPU it lives on.
    pub fn ordinal(&self) -> usize {
        match *self {}
    }
    /// The device address of the first element.
    pub fn address(&self) -> u64 {
        match *self {}
    }
    /// Its device.
    pub fn device(&self) -> &Arc<CudaDevice> {
        match *self {}
    }
    /// A device copy of host storage.
    pub fn from_cpu(dev: &Arc<CudaDevice>, _c: &CpuStorage) -> Result<CudaStorage> {
        match **dev {}
    }
    /// A host copy.
    pub fn to_cpu(&self) -> Result<CpuStorage> {
        match *self {}
    }
    /// Overwrites this storage with `src`.
    pub fn copy_from(&self, _src: &CudaStorage) -> Result<()> {
        match *self {}
    }
    /// The raw device pointer.
    pub(crate) fn ptr(&self) -> u64 {
        match *self {}
    }
    /// A fresh device copy.
    pub fn try_clone(&self) -> Result<CudaStorage> {
        match *self {}
    }
}

impl PinnedBuffer {
    /// A pinned buffer.
    pub fn new(dev: &Arc<CudaDevice>, _dtype: DType, _len: usize) -> Result<PinnedBuffer> {
        match **dev {}
    }
    /// Queues the copy to the device.
    pub fn to_device(&mut self) -> Result<CudaStorage> {
        match *self {}
    }
}

/// Host storage to the device through a pinned staging buffer.
pub fn upload_staged(dev: &Arc<CudaDevice>, _c: &CpuStorage) -> Result<CudaStorage> {
    match **dev {}
}

/// A table of 64-bit words to the device through a pinned buffer.
pub fn upload_words(dev: &Arc<CudaDevice>, _words: Vec<i64>) -> Result<CudaStorage> {
    match **dev {}
}

/// cuBLAS products (none in this build).
pub mod blas {
    use super::CudaStorage;
    use crate::backend::cpu::matmul::MatmulDims;
    use crate::error::Result;

    /// The batched product.
    pub fn matmul(_d: &MatmulDims, a: &CudaStorage, _b: &CudaStorage) -> Result<CudaStorage> {
        match *a {}
    }
    /// `alpha·a·b (+ acc)`.
    pub fn matmul_scaled(_d: &MatmulDims, a: &CudaStorage, _b: &CudaStorage, _alpha: f64, _acc: Option<CudaStorage>) -> Result<CudaStorage> {
        match *a {}
    }
    /// Allows TF32 for f32 products (no effect in this build).
    pub fn set_allow_tf32(_allow: bool) {}
    /// Whether f32 products may use TF32.
    pub fn allow_tf32() -> bool {
        false
    }
}

/// cuBLASLt products (none in this build).
pub mod blaslt {
    use super::CudaStorage;
    use crate::error::Result;

    /// `x·wᵀ + bias`.
    pub fn linear_bias(x: &CudaStorage, _w: &CudaStorage, _b: &CudaStorage, _m: usize, _n: usize, _k: usize) -> Result<CudaStorage> {
        match *x {}
    }
    /// `linear`'s weight and bias gradients.
    pub fn linear_grad_weight_bias(g: &CudaStorage, _x: &CudaStorage, _m: usize, _n: usize, _k: usize) -> Result<(CudaStorage, CudaStorage)> {
        match *g {}
    }
    /// Sets cuBLASLt's workspace size (no effect in this build).
    pub fn set_workspace_mib(_mib: usize) {}
}
