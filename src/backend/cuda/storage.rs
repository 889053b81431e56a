//! `CudaStorage`: a pooled device buffer with a dtype and an element count,
//! and the copies between host and device. Host copies go through the
//! compute stream and wait for it, so they see every queued kernel's result
//! and the host buffer is never read after the call returns.
//!
//! A storage belongs to the stream its block was allocated for (the compute
//! stream unless `CudaDevice::alloc_on_stream` named another). Work that
//! uses it on another stream must be ordered after its stream's writes by
//! an event, and must call [`CudaStorage::record_stream`] so that the
//! block, once dropped, is not reused before that work has finished (see
//! `alloc.rs`).

use super::alloc::Block;
use super::device::CudaDevice;
use super::driver::{DevPtr, Stream, COMPUTE};
use crate::backend::cpu::CpuStorage;
use crate::error::{Error, Result};
use crate::tensor::DType;
use half::{bf16, f16};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Contiguous device storage of one dtype; its block returns to the pool on drop.
pub struct CudaStorage {
    block: Block,
    dtype: DType,
    len: usize,
    dev: Arc<CudaDevice>,
    /// Bit s: stream s used this storage (`record_stream`); 0 when only its own stream did.
    used_on: AtomicU64,
}

impl std::fmt::Debug for CudaStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaStorage({:?}, {} elements, cuda:{})", self.dtype, self.len, self.dev.ordinal())
    }
}

impl Drop for CudaStorage {
    fn drop(&mut self) {
        self.dev.free_block(&self.block, self.used_on.load(Ordering::Acquire));
    }
}

impl CudaStorage {
    pub(crate) fn new(block: Block, dtype: DType, len: usize, dev: Arc<CudaDevice>) -> CudaStorage {
        CudaStorage { block, dtype, len, dev, used_on: AtomicU64::new(0) }
    }
    /// The stream its block was allocated for (0: the compute stream).
    pub fn stream(&self) -> usize {
        self.block.stream.0
    }
    /// Marks this storage as used by work queued on `stream` (as PyTorch's
    /// `Tensor.record_stream`): when it drops, its block is not reused
    /// until an event recorded then on `stream` has completed. Its own
    /// stream needs no call (a no-op). The stream must be one of its
    /// device's (numbered below 64): a number that is not could record no
    /// event when the storage drops, and its block would never be reused.
    pub fn record_stream(&self, stream: usize) -> Result<()> {
        let have = self.dev.seam().driver().streams();
        if stream >= have.min(64) {
            return Err(Error::invalid(
                "cuda record_stream",
                format!("expected a stream of cuda:{} (0 to {}, and below 64), found {stream}", self.dev.ordinal(), have - 1),
            ));
        }
        if stream != self.block.stream.0 && self.block.bytes > 0 {
            self.used_on.fetch_or(1 << stream, Ordering::AcqRel);
        }
        Ok(())
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

    /// Sets every byte to `byte` (ordered on the compute stream).
    pub(crate) fn memset(&self, byte: u8) -> Result<()> {
        self.memset_on(byte, COMPUTE)
    }
    /// Sets every byte to `byte`, ordered on `stream`.
    pub(crate) fn memset_on(&self, byte: u8, stream: Stream) -> Result<()> {
        let n = self.size_in_bytes();
        if n == 0 {
            return Ok(());
        }
        // SAFETY: the block holds at least `n` bytes and lives as long as
        // `self`; the memset is ordered on `stream` before any later use of
        // the buffer there (other streams order after it by events).
        unsafe { self.dev.seam().memset_d8(self.ptr(), byte, n, stream) }
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

    /// Overwrites this storage with `src` (same dtype, length and device;
    /// ordered on the compute stream).
    pub fn copy_from(&self, src: &CudaStorage) -> Result<()> {
        self.copy_from_on(src, COMPUTE.0)
    }

    /// Overwrites this storage with `src`, ordered on stream `stream`. The
    /// caller orders `stream` after the storages' earlier writes (an event
    /// it waits on) and calls [`CudaStorage::record_stream`] on a storage
    /// `stream` does not own, so its block waits for the copy when dropped.
    pub fn copy_from_on(&self, src: &CudaStorage, stream: usize) -> Result<()> {
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
        // stream has run the copy: a block is reused only after work queued
        // on its own stream, or once the events of the other streams
        // `record_stream` named have completed (the allocator's reuse rule).
        unsafe { self.dev.seam().dtod(self.ptr(), src.ptr(), n, Stream(stream)) }
    }

    /// A fresh device copy.
    pub fn try_clone(&self) -> Result<CudaStorage> {
        let s = self.dev.alloc(self.dtype, self.len)?;
        s.copy_from(self)?;
        Ok(s)
    }
}
