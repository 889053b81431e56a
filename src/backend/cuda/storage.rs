//! `CudaStorage`: a pooled device buffer with a dtype and an element count,
//! and the copies between host and device. Host copies go through the
//! compute stream and wait for it, so they see every queued kernel's result
//! and the host buffer is never read after the call returns.

use super::alloc::Block;
use super::device::CudaDevice;
use super::driver::{DevPtr, COMPUTE};
use crate::backend::cpu::CpuStorage;
use crate::error::{Error, Result};
use crate::tensor::DType;
use half::{bf16, f16};
use std::sync::Arc;

/// Contiguous device storage of one dtype; its block returns to the pool on drop.
pub struct CudaStorage {
    block: Block,
    dtype: DType,
    len: usize,
    dev: Arc<CudaDevice>,
}

impl std::fmt::Debug for CudaStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaStorage({:?}, {} elements, cuda:{})", self.dtype, self.len, self.dev.ordinal())
    }
}

impl Drop for CudaStorage {
    fn drop(&mut self) {
        self.dev.free_block(&self.block);
    }
}

impl CudaStorage {
    pub(crate) fn new(block: Block, dtype: DType, len: usize, dev: Arc<CudaDevice>) -> CudaStorage {
        CudaStorage { block, dtype, len, dev }
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Bytes of data (the block may be larger: its size class).
    pub fn size_in_bytes(&self) -> usize {
        self.len * self.dtype.size_in_bytes()
    }
    /// The GPU it lives on.
    pub fn ordinal(&self) -> usize {
        self.dev.ordinal()
    }
    /// Its device.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }
    /// The raw device pointer (0 for an empty storage).
    pub(crate) fn ptr(&self) -> DevPtr {
        self.block.ptr
    }
    /// The device address of the first element: which pool block this
    /// storage holds (tests of the allocator's reuse, debugging).
    pub fn address(&self) -> u64 {
        self.block.ptr
    }

    /// Sets every byte to `byte` (stream-ordered).
    pub(crate) fn memset(&self, byte: u8) -> Result<()> {
        let n = self.size_in_bytes();
        if n == 0 {
            return Ok(());
        }
        // SAFETY: the block holds at least `n` bytes and lives as long as
        // `self`; the memset is ordered on the compute stream before any
        // later use of the buffer.
        unsafe { self.dev.seam().memset_d8(self.ptr(), byte, n, COMPUTE) }
    }

    /// A device copy of host storage.
    pub fn from_cpu(dev: &Arc<CudaDevice>, c: &CpuStorage) -> Result<CudaStorage> {
        let s = dev.alloc(c.dtype(), c.len())?;
        match c {
            CpuStorage::F32(v) => s.upload(v)?,
            CpuStorage::F64(v) => s.upload(v)?,
            CpuStorage::F16(v) => s.upload(v)?,
            CpuStorage::BF16(v) => s.upload(v)?,
            CpuStorage::I64(v) => s.upload(v)?,
            CpuStorage::U8(v) => s.upload(v)?,
        }
        Ok(s)
    }

    fn upload<T: bytemuck::Pod>(&self, v: &[T]) -> Result<()> {
        let bytes: &[u8] = bytemuck::cast_slice(v);
        if bytes.len() != self.size_in_bytes() {
            return Err(Error::invalid("cuda upload", format!("expected {} bytes, got {}", self.size_in_bytes(), bytes.len())));
        }
        if bytes.is_empty() {
            return Ok(());
        }
        // SAFETY: the destination block holds `bytes.len()` bytes. The source
        // is pageable host memory, which cuMemcpyHtoDAsync copies to a
        // staging buffer before it returns ("API synchronization behavior"
        // in the CUDA driver API reference: pageable host-to-device async
        // copies stage the source immediately, with no device
        // synchronisation), so the slice may be dropped as soon as the call
        // returns, and the copy stays ordered on the compute stream. The
        // emulator copies at once. No host wait: an upload inside a step
        // costs no synchronisation.
        unsafe { self.dev.seam().htod(self.ptr(), bytes, COMPUTE) }
    }

    fn download<T: bytemuck::Pod + Default>(&self) -> Result<Vec<T>> {
        let mut v = vec![T::default(); self.len];
        if self.len == 0 {
            return Ok(v);
        }
        {
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut v);
            // SAFETY: the source block holds exactly `bytes.len()` bytes of
            // this storage; the destination is borrowed mutably until the
            // synchronisation below completes the copy.
            unsafe { self.dev.seam().dtoh(bytes, self.ptr(), COMPUTE) }?;
        }
        self.dev.synchronize()?;
        Ok(v)
    }

    /// A host copy (waits for queued work).
    pub fn to_cpu(&self) -> Result<CpuStorage> {
        Ok(match self.dtype {
            DType::F32 => CpuStorage::F32(self.download::<f32>()?),
            DType::F64 => CpuStorage::F64(self.download::<f64>()?),
            DType::F16 => CpuStorage::F16(self.download::<f16>()?),
            DType::BF16 => CpuStorage::BF16(self.download::<bf16>()?),
            DType::I64 => CpuStorage::I64(self.download::<i64>()?),
            DType::U8 => CpuStorage::U8(self.download::<u8>()?),
        })
    }

    /// Overwrites this storage with `src` (same dtype, length and device; stream-ordered).
    pub fn copy_from(&self, src: &CudaStorage) -> Result<()> {
        if src.dtype != self.dtype || src.len != self.len || src.ordinal() != self.ordinal() {
            return Err(Error::invalid(
                "cuda copy_from",
                format!(
                    "expected {} elements of {:?} on cuda:{}, got {} of {:?} on cuda:{}",
                    self.len,
                    self.dtype,
                    self.ordinal(),
                    src.len,
                    src.dtype,
                    src.ordinal()
                ),
            ));
        }
        let n = self.size_in_bytes();
        if n == 0 {
            return Ok(());
        }
        // SAFETY: both blocks hold at least `n` bytes and live until the
        // stream has run the copy (see the allocator's reuse rule).
        unsafe { self.dev.seam().dtod(self.ptr(), src.ptr(), n, COMPUTE) }
    }

    /// A fresh device copy.
    pub fn try_clone(&self) -> Result<CudaStorage> {
        let s = self.dev.alloc(self.dtype, self.len)?;
        s.copy_from(self)?;
        Ok(s)
    }
}
