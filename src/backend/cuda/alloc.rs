//! The caching allocator. Requests are rounded up to a size class (512 B
//! steps up to 1 MiB, then four classes per power of two, so at most a
//! quarter is wasted); a freed block goes back to its class's free list and
//! the next request of that class reuses it without a driver call. Only a
//! miss calls cuMemAlloc; an out-of-memory miss first returns every cached
//! block to the driver and retries once, then fails with the pool's state.
//!
//! Reuse is safe because all work runs on the device's single compute
//! stream: a block freed by the host while kernels still read it is handed
//! only to work queued after those kernels on the same stream.

use super::device::CudaDevice;
use super::driver::{DevPtr, COMPUTE};
use super::PoolStats;
use crate::error::{Error, Result};
use std::collections::BTreeMap;

const SMALL_STEP: usize = 512;
const SMALL_MAX: usize = 1 << 20;

/// The size class of a request of `bytes` (0 stays 0).
pub fn size_class(bytes: usize) -> usize {
    if bytes == 0 {
        return 0;
    }
    if bytes <= SMALL_MAX {
        return bytes.div_ceil(SMALL_STEP) * SMALL_STEP;
    }
    // Four classes between consecutive powers of two: p, 1.25p, 1.5p, 1.75p.
    let p = 1usize << (usize::BITS - 1 - bytes.leading_zeros());
    let quarter = p / 4;
    bytes.div_ceil(quarter).saturating_mul(quarter)
}

/// One device buffer of a size class.
#[derive(Debug)]
pub(crate) struct Block {
    pub ptr: DevPtr,
    pub bytes: usize,
}

/// The pool's bookkeeping: free lists by class and byte counters.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    free: BTreeMap<usize, Vec<DevPtr>>,
    in_use: usize,
    cached: usize,
    peak: usize,
    driver_allocs: u64,
}

impl Pool {
    fn stats(&self) -> PoolStats {
        PoolStats { in_use: self.in_use, cached: self.cached, reserved: self.in_use + self.cached, peak: self.peak, driver_allocs: self.driver_allocs }
    }
    fn take(&mut self, class: usize) -> Option<DevPtr> {
        let list = self.free.get_mut(&class)?;
        let p = list.pop()?;
        if list.is_empty() {
            self.free.remove(&class);
        }
        self.cached -= class;
        Some(p)
    }
    fn drain(&mut self) -> Vec<(DevPtr, usize)> {
        self.cached = 0;
        std::mem::take(&mut self.free).into_iter().flat_map(|(class, v)| v.into_iter().map(move |p| (p, class))).collect()
    }
}

impl CudaDevice {
    /// A block of at least `bytes` from the pool, or from the driver on a miss.
    pub(crate) fn alloc_block(&self, bytes: usize) -> Result<Block> {
        let class = size_class(bytes);
        if class == 0 {
            return Ok(Block { ptr: 0, bytes: 0 });
        }
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        let seam = self.seam();
        let ptr = match pool.take(class) {
            Some(p) => {
                seam.counts.add(&seam.counts.pool_reuses, 1);
                p
            }
            None => {
                pool.driver_allocs += 1;
                match seam.malloc(class)? {
                    Some(p) => p,
                    None => {
                        self.release_cached(&mut pool)?;
                        match seam.malloc(class)? {
                            Some(p) => p,
                            None => return Err(self.oom(bytes, &pool)),
                        }
                    }
                }
            }
        };
        seam.driver().block_taken(ptr, bytes, class);
        pool.in_use += class;
        pool.peak = pool.peak.max(pool.in_use);
        Ok(Block { ptr, bytes: class })
    }

    /// The out-of-memory error for a request of `requested` bytes.
    fn oom(&self, requested: usize, pool: &Pool) -> Error {
        let s = pool.stats();
        let (device_free, device_total) = self.mem_info().unwrap_or((0, 0));
        Error::CudaOutOfMemory {
            ordinal: self.ordinal(),
            requested,
            requested_mib: requested as f64 / (1u64 << 20) as f64,
            in_use: s.in_use,
            cached: s.cached,
            reserved: s.reserved,
            peak: s.peak,
            device_free,
            device_total,
        }
    }

    /// Returns a block to its free list (called when a storage drops).
    pub(crate) fn free_block(&self, b: &Block) {
        if b.bytes == 0 {
            return;
        }
        self.seam().driver().block_returned(b.ptr);
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        pool.in_use -= b.bytes;
        pool.cached += b.bytes;
        pool.free.entry(b.bytes).or_default().push(b.ptr);
    }

    fn release_cached(&self, pool: &mut Pool) -> Result<()> {
        let ptrs = pool.drain();
        if ptrs.is_empty() {
            return Ok(());
        }
        // Cached blocks may still be read by queued kernels: finish them first.
        self.seam().synchronize(COMPUTE)?;
        for (p, bytes) in ptrs {
            // SAFETY: `p` came from the driver's malloc of `bytes`, sits only
            // in the free list (no storage refers to it) and the stream is idle.
            unsafe { self.seam().free(p, bytes) }?;
        }
        Ok(())
    }

    /// The allocator's counters.
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).stats()
    }
    /// Bytes held by live storages.
    pub fn current_bytes(&self) -> usize {
        self.pool_stats().in_use
    }
    /// The highest `current_bytes` so far.
    pub fn peak_bytes(&self) -> usize {
        self.pool_stats().peak
    }
    /// Bytes obtained from the driver (in use plus cached).
    pub fn reserved_bytes(&self) -> usize {
        self.pool_stats().reserved
    }
    /// Restarts the peak at the current usage.
    pub fn reset_peak(&self) {
        let mut p = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        p.peak = p.in_use;
    }
    /// Returns every cached block to the driver (as `torch.cuda.empty_cache`).
    pub fn empty_cache(&self) -> Result<()> {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        self.release_cached(&mut pool)
    }
}

#[cfg(test)]
mod tests {
    use super::size_class;

    #[test]
    fn classes_round_up_and_waste_at_most_a_quarter() {
        assert_eq!(size_class(0), 0);
        assert_eq!(size_class(1), 512);
        assert_eq!(size_class(512), 512);
        assert_eq!(size_class(513), 1024);
        assert_eq!(size_class(1 << 20), 1 << 20);
        // Just above 1 MiB: the next quarter step of 1 MiB.
        assert_eq!(size_class((1 << 20) + 1), (1 << 20) + (1 << 18));
        assert_eq!(size_class(3 << 20), 3 << 20);
        for b in [(1usize << 20) + 7, 5_000_000, 123_456_789, 1 << 33] {
            let c = size_class(b);
            assert!(c >= b && (c - b) * 4 <= b, "{b} -> {c}");
        }
    }
}
