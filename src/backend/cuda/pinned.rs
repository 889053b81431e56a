//! Page-locked host buffers for the data loader's batches: the loader
//! writes a batch into one, and `to_device` queues an asynchronous copy that
//! overlaps with the kernels already on the stream. Until that copy has run
//! the buffer must not change, so any later write (and the drop) first waits
//! for the stream.

use super::device::CudaDevice;
use super::driver::COMPUTE;
use super::CudaStorage;
use crate::backend::cpu::CpuStorage;
use crate::error::{Error, Result};
use crate::tensor::DType;
use std::sync::Arc;

/// A page-locked host buffer of `len` elements of one dtype.
pub struct PinnedBuffer {
    ptr: *mut u8,
    bytes: usize,
    dtype: DType,
    len: usize,
    dev: Arc<CudaDevice>,
    in_flight: bool,
}

// SAFETY: the buffer is plain host memory owned by this value; access goes
// through `&self`/`&mut self`, so Rust's borrow rules order it.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    /// A zeroed pinned buffer for `len` elements of `dtype`.
    pub fn new(dev: &Arc<CudaDevice>, dtype: DType, len: usize) -> Result<PinnedBuffer> {
        let bytes = len.checked_mul(dtype.size_in_bytes()).ok_or_else(|| Error::invalid("pinned buffer", format!("{len} elements overflow")))?;
        let ptr = if bytes == 0 {
            std::ptr::NonNull::<u64>::dangling().as_ptr() as *mut u8
        } else {
            let p = dev.seam().driver().malloc_host(bytes)?;
            // SAFETY: `p` points to `bytes` writable bytes just allocated.
            unsafe { std::ptr::write_bytes(p, 0, bytes) };
            p
        };
        Ok(PinnedBuffer { ptr, bytes, dtype, len, dev: dev.clone(), in_flight: false })
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
    /// The bytes, for writing (waits for a queued copy out of the buffer first).
    pub fn as_bytes_mut(&mut self) -> Result<&mut [u8]> {
        self.wait()?;
        // SAFETY: `ptr` points to `bytes` bytes owned by this buffer (or is a
        // dangling, aligned pointer with `bytes == 0`); no copy reads them
        // any more (waited above) and `&mut self` makes the borrow unique.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) })
    }
    /// Copies host storage of the same dtype and length in.
    pub fn copy_from_cpu(&mut self, c: &CpuStorage) -> Result<()> {
        if c.dtype() != self.dtype || c.len() != self.len {
            return Err(Error::invalid("pinned buffer", format!("expected {} elements of {:?}, got {} of {:?}", self.len, self.dtype, c.len(), c.dtype())));
        }
        let src = c.as_bytes();
        self.as_bytes_mut()?.copy_from_slice(src);
        Ok(())
    }
    /// Copies `c` into the front of the buffer (which may be larger: one
    /// buffer serves batches of any size up to its capacity) and queues its
    /// copy to a fresh device storage of `c.len()` elements.
    pub fn upload(&mut self, c: &CpuStorage) -> Result<CudaStorage> {
        let src = c.as_bytes();
        if c.dtype() != self.dtype || src.len() > self.bytes {
            return Err(Error::invalid(
                "pinned buffer",
                format!("expected at most {} elements of {:?}, got {} of {:?}", self.len, self.dtype, c.len(), c.dtype()),
            ));
        }
        self.as_bytes_mut()?[..src.len()].copy_from_slice(src);
        let s = self.dev.alloc(self.dtype, c.len())?;
        if src.is_empty() {
            return Ok(s);
        }
        // SAFETY: the first `src.len()` bytes of `ptr` are page-locked memory
        // owned by this buffer, kept allocated and unmodified until the copy
        // has run (writes and drop wait for the stream while `in_flight`).
        let staged = unsafe { std::slice::from_raw_parts(self.ptr, src.len()) };
        // SAFETY: the destination block holds `src.len()` bytes; the source is
        // pinned memory kept alive as described above.
        unsafe { self.dev.seam().htod(s.ptr(), staged, COMPUTE) }?;
        self.in_flight = true;
        Ok(s)
    }
    /// Queues the copy to a fresh device storage and returns without waiting.
    pub fn to_device(&mut self) -> Result<CudaStorage> {
        let s = self.dev.alloc(self.dtype, self.len)?;
        if self.bytes == 0 {
            return Ok(s);
        }
        // SAFETY: `ptr` holds `bytes` bytes of page-locked memory that stays
        // allocated and unmodified until the copy has run: writes and drop
        // wait for the stream while `in_flight` is set.
        let src = unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) };
        // SAFETY: the destination block holds `bytes` bytes; the source is
        // pinned memory kept alive as described above.
        unsafe { self.dev.seam().htod(s.ptr(), src, COMPUTE) }?;
        self.in_flight = true;
        Ok(s)
    }
    fn wait(&mut self) -> Result<()> {
        if self.in_flight {
            self.dev.synchronize()?;
            self.in_flight = false;
        }
        Ok(())
    }
}

thread_local! {
    /// Staging buffers for `upload_staged`: two per (GPU, dtype), used in
    /// turn, so a batch is written while the previous one's copy may still
    /// be queued.
    static STAGING: std::cell::RefCell<Vec<(usize, DType, [Option<PinnedBuffer>; 2], usize)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Host storage to `dev` through a reused pinned staging buffer (the data
/// loader's batches): an asynchronous copy instead of a pageable one, and no
/// page-locking per batch. A buffer grows to the next power of two when a
/// batch does not fit.
pub fn upload_staged(dev: &Arc<CudaDevice>, c: &CpuStorage) -> Result<CudaStorage> {
    STAGING.with(|cell| {
        let mut all = cell.borrow_mut();
        let key = (dev.ordinal(), c.dtype());
        let i = match all.iter().position(|(o, d, _, _)| (*o, *d) == key) {
            Some(i) => i,
            None => {
                all.push((key.0, key.1, [None, None], 0));
                all.len() - 1
            }
        };
        let (_, _, bufs, next) = &mut all[i];
        let slot = &mut bufs[*next];
        *next = 1 - *next;
        if slot.as_ref().is_none_or(|b| b.len() < c.len()) {
            *slot = Some(PinnedBuffer::new(dev, c.dtype(), c.len().max(1).next_power_of_two())?);
        }
        match slot.as_mut() {
            Some(b) => b.upload(c),
            None => Err(Error::invalid("pinned buffer", "no staging buffer")),
        }
    })
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        // A failed wait means the context is broken; freeing is then still
        // the best that can be done.
        let _ = self.wait();
        // SAFETY: `ptr` came from the driver's malloc_host(bytes) and no queued copy reads it.
        let _ = unsafe { self.dev.seam().driver().free_host(self.ptr, self.bytes) };
    }
}
