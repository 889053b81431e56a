//! Page-locked host buffers for the data loader's batches: the loader
//! writes a batch into one, and `to_device` queues an asynchronous copy that
//! overlaps with the kernels already on the stream. Until that copy has run
//! the buffer must not change, so any later write (and the drop) first waits
//! for that copy's event — only when it has not finished, and never for the
//! rest of the stream.
//!
//! `upload_staged` (the batches of training) copies on the device's copy
//! stream into a staging buffer on the device (allocated for the copy
//! stream, recorded as read by the compute stream), and the compute stream
//! takes the batch from there after an event: the host never waits for the
//! training kernels, and the copy runs beside them.

use super::device::{CudaDevice, DeviceEvent};
use super::driver::{Stream, COMPUTE};
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
    /// The last copy out of or into the buffer, until it is known to have run.
    copied: Option<DeviceEvent>,
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
        Ok(PinnedBuffer { ptr, bytes, dtype, len, dev: dev.clone(), copied: None })
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
        // SAFETY: the destination block holds `src.len()` bytes.
        unsafe { self.queue_copy(s.ptr(), src.len(), COMPUTE) }?;
        Ok(s)
    }
    /// Queues the copy to a fresh device storage and returns without waiting.
    pub fn to_device(&mut self) -> Result<CudaStorage> {
        let s = self.dev.alloc(self.dtype, self.len)?;
        if self.bytes == 0 {
            return Ok(s);
        }
        // SAFETY: the destination block holds `bytes` bytes.
        unsafe { self.queue_copy(s.ptr(), self.bytes, COMPUTE) }?;
        Ok(s)
    }
    /// Queues the copy of the first `n` bytes to `dst` on `stream` and
    /// records its event (writes and the drop wait for it).
    ///
    /// # Safety
    /// `dst` addresses at least `n` bytes of a live device buffer that
    /// nothing else touches until the copy has run on `stream`.
    unsafe fn queue_copy(&mut self, dst: super::driver::DevPtr, n: usize, stream: Stream) -> Result<()> {
        debug_assert!(n <= self.bytes);
        // SAFETY: `ptr` holds `bytes` ≥ n bytes of page-locked memory that
        // stays allocated and unmodified until the copy has run: writes and
        // the drop wait for `copied` first.
        let src = unsafe { std::slice::from_raw_parts(self.ptr, n) };
        // SAFETY: the destination is the caller's; the source is above.
        unsafe { self.dev.seam().htod(dst, src, stream) }?;
        self.copied = Some(self.dev.record_event(stream.0)?);
        Ok(())
    }
    /// Queues the copy of `src` (of this buffer's dtype, at most its
    /// length) into the front of the buffer on the compute stream and
    /// records its event: reads (`as_bytes`), writes and the drop wait for it.
    pub fn queue_download(&mut self, src: &CudaStorage) -> Result<()> {
        let n = src.len() * src.dtype().size_in_bytes();
        if src.dtype() != self.dtype || n > self.bytes || src.ordinal() != self.dev.ordinal() {
            return Err(Error::invalid(
                "pinned buffer",
                format!(
                    "expected at most {} elements of {:?} on cuda:{}, got {} of {:?} on cuda:{}",
                    self.len,
                    self.dtype,
                    self.dev.ordinal(),
                    src.len(),
                    src.dtype(),
                    src.ordinal()
                ),
            ));
        }
        if n == 0 {
            return Ok(());
        }
        let dev = self.dev.clone();
        let dst = &mut self.as_bytes_mut()?[..n];
        // SAFETY: `src` holds `n` bytes and its block is reused only by work
        // queued after this copy on the compute stream (the allocator's
        // stream order); `dst` is `n` bytes of page-locked memory owned by
        // this buffer that the host does not touch until `copied` has
        // completed: reads, writes and the drop wait for it first.
        unsafe { dev.seam().dtoh(dst, src.ptr(), COMPUTE) }?;
        self.copied = Some(dev.record_event(COMPUTE.0)?);
        Ok(())
    }
    /// The bytes, for reading (waits for a queued copy into or out of the
    /// buffer first, only if it has not run yet).
    pub fn as_bytes(&mut self) -> Result<&[u8]> {
        Ok(self.as_bytes_mut()?)
    }
    fn wait(&mut self) -> Result<()> {
        if let Some(e) = self.copied.take() {
            if let Err(err) = e.wait_if_pending() {
                self.copied = Some(e);
                return Err(err);
            }
        }
        Ok(())
    }
}

/// One staging slot of a (GPU, dtype): pinned host memory, the device
/// buffer the copy stream fills from it, and the point of the compute
/// stream after which that device buffer has been read.
struct Slot {
    host: PinnedBuffer,
    dev_buf: CudaStorage,
    consumed: Option<DeviceEvent>,
}

thread_local! {
    /// Staging slots for `upload_staged`: two per (GPU, dtype), used in
    /// turn, so a batch is written while the previous one's copy may still
    /// be queued.
    static STAGING: std::cell::RefCell<Vec<(usize, DType, [Option<Slot>; 2], usize)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Host storage to `dev` through reused staging (the data loader's
/// batches): the bytes go into a pinned buffer, the copy stream copies them
/// into the slot's device buffer once the compute stream has read that
/// buffer's previous batch, and the compute stream copies them out into the
/// returned storage after the copy's event. The host waits for nothing but
/// a copy of this slot that has not run yet (two batches back). A slot grows
/// to the next power of two when a batch does not fit.
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
        let (_, _, slots, next) = &mut all[i];
        let slot = &mut slots[*next];
        *next = 1 - *next;
        if slot.as_ref().is_none_or(|s| s.host.len() < c.len()) {
            let cap = c.len().max(1).next_power_of_two();
            // The slot's device buffer belongs to the copy stream, which
            // writes it: a block from the copy stream's free list was last
            // used by work queued before on that stream or by other streams
            // whose events have completed (the allocator's rule), so the
            // copy needs no wait on the compute stream, and the poison fill
            // runs on the copy stream before it. The compute stream reads
            // it: recorded, so when the slot grows and drops it the block
            // waits for the compute stream's last read. (An H200 once showed
            // the race this replaces: a block from the compute-ordered pool
            // poisoned on the compute stream after the copy stream wrote it;
            // an event recorded on the compute stream after the allocation
            // fixed it then.)
            let copy = dev.copy_stream()?;
            let dev_buf = dev.alloc_on_stream(c.dtype(), cap, copy)?;
            dev_buf.record_stream(COMPUTE.0)?;
            *slot = Some(Slot { host: PinnedBuffer::new(dev, c.dtype(), cap)?, dev_buf, consumed: None });
        }
        let Some(slot) = slot.as_mut() else { return Err(Error::invalid("pinned buffer", "no staging slot")) };
        let src = c.as_bytes();
        slot.host.as_bytes_mut()?[..src.len()].copy_from_slice(src);
        let out = dev.alloc(c.dtype(), c.len())?;
        if src.is_empty() {
            return Ok(out);
        }
        let copy = Stream(dev.copy_stream()?);
        if let Some(e) = &slot.consumed {
            e.wait_on(copy.0)?;
        }
        // SAFETY: the slot's device buffer holds `cap` ≥ c.len() elements;
        // the copy stream waited (above, on the device) for the compute
        // stream's last read of it, and the compute stream reads it next
        // only after the copy's event (below).
        unsafe { slot.host.queue_copy(slot.dev_buf.ptr(), src.len(), copy) }?;
        if let Some(e) = &slot.host.copied {
            e.wait_on(COMPUTE.0)?;
        }
        // SAFETY: both buffers hold at least `src.len()` bytes and stay
        // allocated until the compute stream has run the copy (the slot's
        // buffer until `consumed`, `out` in compute order).
        unsafe { dev.seam().dtod(out.ptr(), slot.dev_buf.ptr(), src.len(), COMPUTE) }?;
        slot.consumed = Some(dev.record_event(COMPUTE.0)?);
        Ok(out)
    })
}

thread_local! {
    /// The pinned buffer of `upload_words`, one per GPU.
    static WORDS: std::cell::RefCell<Vec<(usize, PinnedBuffer)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A small table of 64-bit words (a kernel's launch table: addresses and
/// sizes) to a fresh I64 device buffer, for the kernels queued after it on
/// the compute stream: the words go into a pinned buffer kept per GPU and
/// the copy is queued on the compute stream. The host waits only when the
/// previous table's copy has not run yet; the buffer grows to the next
/// power of two when a table does not fit.
pub fn upload_words(dev: &Arc<CudaDevice>, words: Vec<i64>) -> Result<CudaStorage> {
    WORDS.with(|cell| {
        let mut all = cell.borrow_mut();
        let i = match all.iter().position(|(o, b)| *o == dev.ordinal() && b.len() >= words.len()) {
            Some(i) => i,
            None => {
                // A smaller buffer of this GPU drops here (after its last copy has run).
                all.retain(|(o, _)| *o != dev.ordinal());
                all.push((dev.ordinal(), PinnedBuffer::new(dev, DType::I64, words.len().max(1).next_power_of_two())?));
                all.len() - 1
            }
        };
        all[i].1.upload(&CpuStorage::I64(words))
    })
}

thread_local! {
    /// Free pinned buffers of [`ScalarReadback`]s, per GPU: one for each
    /// read-back in flight at once (a step's batches), kept for the next.
    static READBACKS: std::cell::RefCell<Vec<(usize, PinnedBuffer)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Free read-back buffers kept per GPU (more in flight at once are freed when they finish).
const READBACKS_KEPT: usize = 16;

/// Float scalars of one GPU on their way to the host: gathered as f64 on
/// the device (`cast::gather_scalars_f64`: one launch per dtype among
/// them), their copy queued into page-locked memory on the compute stream,
/// and read by [`ScalarReadback::values`] once it has run. Starting one
/// costs the host no wait, so a step can queue its losses' read-back after
/// the backward and read them after the optimizer's own read-back has
/// waited for the stream: one host synchronisation per step, not two.
pub struct ScalarReadback {
    host: Option<PinnedBuffer>,
    n: usize,
}

impl ScalarReadback {
    /// Queues the read-back of `xs` (one float element each, one GPU, at
    /// most [`super::cast::CAST_TENSORS`]); returns without waiting.
    pub fn start(xs: &[&CudaStorage]) -> Result<ScalarReadback> {
        let y = super::cast::gather_scalars_f64(xs)?;
        let dev = y.device().clone();
        let kept = READBACKS.with(|cell| {
            let mut all = cell.borrow_mut();
            let i = all.iter().position(|(o, _)| *o == dev.ordinal())?;
            Some(all.swap_remove(i).1)
        });
        let mut host = match kept {
            Some(b) => b,
            None => PinnedBuffer::new(&dev, DType::F64, super::cast::CAST_TENSORS)?,
        };
        host.queue_download(&y)?;
        Ok(ScalarReadback { host: Some(host), n: xs.len() })
    }
    /// The values, in order. Waits for their copy only if it has not run
    /// yet (a counted host synchronisation then; none after a wait that
    /// covered it, such as the optimizer step's read-back).
    pub fn values(mut self) -> Result<Vec<f64>> {
        let Some(host) = self.host.as_mut() else { return Err(Error::invalid("scalar read-back", "its buffer was already returned")) };
        let bytes = host.as_bytes()?;
        Ok(bytes[..8 * self.n].chunks_exact(8).map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect())
    }
}

impl Drop for ScalarReadback {
    fn drop(&mut self) {
        if let Some(host) = self.host.take() {
            // The buffer's pending copy (if any) is waited for by its next
            // use or its drop; here it only goes back to the free list.
            READBACKS.with(|cell| {
                let mut all = cell.borrow_mut();
                if all.iter().filter(|(o, _)| *o == host.dev.ordinal()).count() < READBACKS_KEPT {
                    all.push((host.dev.ordinal(), host));
                }
            });
        }
    }
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
