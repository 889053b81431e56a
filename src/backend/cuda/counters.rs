//! The seam's counters: what the host asked of the device, counted the same
//! way on a GPU and on the emulator.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of one device's counters. Take one before and one after a
/// piece of work; [`Counters::since`] gives what the work cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Kernel launches, cuBLAS and cuBLASLt calls included.
    pub launches: u64,
    /// cuBLAS/cuBLASLt matrix products (also counted in `launches`).
    pub gemms: u64,
    /// Device memsets (not counted in `launches`; on a GPU each is a stream
    /// operation with about a launch's host cost).
    pub memsets: u64,
    /// cuBLASLt algorithm heuristic calls (one per new product shape; a cached shape makes none).
    pub lt_heuristics: u64,
    /// Calls that made the host wait for the device: explicit synchronisations
    /// and those inside copies to the host and synchronous uploads.
    pub host_syncs: u64,
    /// Nanoseconds the host spent in those waits: near 0 per step means the
    /// device had finished before the host asked (the host's enqueueing is
    /// the bottleneck); close to the step time means the device is.
    pub host_wait_ns: u64,
    /// Host→device copies and their bytes.
    pub htod_copies: u64,
    /// Bytes copied host→device.
    pub htod_bytes: u64,
    /// Device→host copies.
    pub dtoh_copies: u64,
    /// Bytes copied device→host.
    pub dtoh_bytes: u64,
    /// Bytes copied device→device.
    pub dtod_bytes: u64,
    /// Buffers obtained from the driver (cuMemAlloc).
    pub driver_allocs: u64,
    /// Buffers returned to the driver (cuMemFree).
    pub driver_frees: u64,
    /// Allocations served from the caching allocator's free lists.
    pub pool_reuses: u64,
    /// Bytes held by live storages now (size classes).
    pub in_use_bytes: u64,
    /// The most bytes in use at once since the device opened or the peak was reset.
    pub peak_bytes: u64,
}

impl Counters {
    /// What happened between `earlier` and `self` (`in_use_bytes` and
    /// `peak_bytes` stay `self`'s: they are levels, not counts).
    pub fn since(&self, earlier: &Counters) -> Counters {
        Counters {
            launches: self.launches - earlier.launches,
            gemms: self.gemms - earlier.gemms,
            memsets: self.memsets - earlier.memsets,
            lt_heuristics: self.lt_heuristics - earlier.lt_heuristics,
            host_syncs: self.host_syncs - earlier.host_syncs,
            host_wait_ns: self.host_wait_ns - earlier.host_wait_ns,
            htod_copies: self.htod_copies - earlier.htod_copies,
            htod_bytes: self.htod_bytes - earlier.htod_bytes,
            dtoh_copies: self.dtoh_copies - earlier.dtoh_copies,
            dtoh_bytes: self.dtoh_bytes - earlier.dtoh_bytes,
            dtod_bytes: self.dtod_bytes - earlier.dtod_bytes,
            driver_allocs: self.driver_allocs - earlier.driver_allocs,
            driver_frees: self.driver_frees - earlier.driver_frees,
            pool_reuses: self.pool_reuses - earlier.pool_reuses,
            in_use_bytes: self.in_use_bytes,
            peak_bytes: self.peak_bytes,
        }
    }
    /// Every count divided by `n` (per step of `n` steps), as `key=value` pairs.
    pub fn per_step_line(&self, n: u64) -> String {
        let n = n.max(1) as f64;
        let f = |v: u64| v as f64 / n;
        format!(
            "launches={:.1} gemms={:.1} memsets={:.1} lt_heuristics={:.1} host_syncs={:.1} host_wait_ms={:.3} htod_copies={:.1} htod_bytes={:.0} dtoh_copies={:.1} dtoh_bytes={:.0} dtod_bytes={:.0} driver_allocs={:.1} pool_reuses={:.1} peak_mib={:.1}",
            f(self.launches),
            f(self.gemms),
            f(self.memsets),
            f(self.lt_heuristics),
            f(self.host_syncs),
            self.host_wait_ns as f64 / 1e6 / n,
            f(self.htod_copies),
            f(self.htod_bytes),
            f(self.dtoh_copies),
            f(self.dtoh_bytes),
            f(self.dtod_bytes),
            f(self.driver_allocs),
            f(self.pool_reuses),
            self.peak_bytes as f64 / (1u64 << 20) as f64
        )
    }
}

/// The live counters of one device (levels come from the allocator).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[derive(Debug, Default)]
pub(crate) struct CounterCells {
    pub launches: AtomicU64,
    pub gemms: AtomicU64,
    pub memsets: AtomicU64,
    pub lt_heuristics: AtomicU64,
    pub host_syncs: AtomicU64,
    pub host_wait_ns: AtomicU64,
    pub htod_copies: AtomicU64,
    pub htod_bytes: AtomicU64,
    pub dtoh_copies: AtomicU64,
    pub dtoh_bytes: AtomicU64,
    pub dtod_bytes: AtomicU64,
    pub driver_allocs: AtomicU64,
    pub driver_frees: AtomicU64,
    pub pool_reuses: AtomicU64,
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl CounterCells {
    /// Adds `v` to `cell`.
    pub fn add(&self, cell: &AtomicU64, v: u64) {
        cell.fetch_add(v, Ordering::Relaxed);
    }
    /// The counts now, with the allocator's levels.
    pub fn snapshot(&self, in_use_bytes: u64, peak_bytes: u64) -> Counters {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counters {
            launches: g(&self.launches),
            gemms: g(&self.gemms),
            memsets: g(&self.memsets),
            lt_heuristics: g(&self.lt_heuristics),
            host_syncs: g(&self.host_syncs),
            host_wait_ns: g(&self.host_wait_ns),
            htod_copies: g(&self.htod_copies),
            htod_bytes: g(&self.htod_bytes),
            dtoh_copies: g(&self.dtoh_copies),
            dtoh_bytes: g(&self.dtoh_bytes),
            dtod_bytes: g(&self.dtod_bytes),
            driver_allocs: g(&self.driver_allocs),
            driver_frees: g(&self.driver_frees),
            pool_reuses: g(&self.pool_reuses),
            in_use_bytes,
            peak_bytes,
        }
    }
}
