//! A pool of large host buffers, so that a training step reuses
//! the buffers the previous ops freed instead of asking the kernel for fresh
//! pages. A large `Vec` is mapped and unmapped by the allocator on every
//! alloc/free; each fresh page then costs a fault, the kernel's zeroing and,
//! in a multi-threaded process, a TLB shootdown on unmap. Reusing a buffer
//! costs one memset. (The lead's profile of the 4x144 conformer step found
//! about a quarter of its CPU time in page faults, memset and unmap paths.)
//!
//! Buffers of at least [`MIN_BYTES`] come back here when a tensor's storage
//! drops ([`give`]); kernels take their outputs with [`zeroed`], which
//! reuses the most recently pooled buffer whose capacity is at least the
//! request and at most 1/8 above it (within a run the shapes repeat, so
//! most requests find a buffer of exactly their size).
//!
//! Only buffers of at least [`MIN_BYTES`] (32 MiB) are pooled: glibc maps
//! every allocation that large with its own mmap and unmaps it on free (its
//! mmap threshold never rises above 32 MiB), while smaller ones are reused
//! from its heap. Pooling those too kept two caches of free memory, the
//! pool's and the heap's, and raised the AISHELL config's peak RSS by
//! ~390 MiB; above the threshold an evicted buffer really goes back to the
//! kernel.
//!
//! Peak memory does not rise: the pool remembers the most tensor bytes ever
//! live (`HIGH`), and a request that finds no buffer frees pooled buffers
//! (oldest first) until live + pooled + the request fit under it. So live +
//! pooled bytes only pass that mark when the pool is empty, exactly when
//! live bytes alone would pass it without a pool. `ASRFORGE_CPU_POOL=0`
//! turns the pool off, to compare.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Buffers smaller than this (bytes) are left to the allocator, which
/// reuses them from its heap without system calls (glibc's largest mmap
/// threshold, `DEFAULT_MMAP_THRESHOLD_MAX` on 64-bit).
pub const MIN_BYTES: usize = 32 << 20;

/// The pooled buffers of one element type, oldest first.
pub struct Shelf<T> {
    bufs: Mutex<Vec<Vec<T>>>,
}

impl<T> Shelf<T> {
    const fn new() -> Shelf<T> {
        Shelf { bufs: Mutex::new(Vec::new()) }
    }
}

/// The most bytes live tensors plus one request have reached (see the module doc).
static HIGH: AtomicUsize = AtomicUsize::new(0);

static F32: Shelf<f32> = Shelf::new();
static F64: Shelf<f64> = Shelf::new();

/// An element type with a pool: zero is its `Default`.
pub trait Pooled: Copy + Default + Send + 'static {
    /// This type's shelf.
    fn shelf() -> &'static Shelf<Self>;
}

impl Pooled for f32 {
    fn shelf() -> &'static Shelf<f32> {
        &F32
    }
}

impl Pooled for f64 {
    fn shelf() -> &'static Shelf<f64> {
        &F64
    }
}

/// Whether buffers of `n` elements of `T` are pooled: large, and the pool
/// not turned off by `ASRFORGE_CPU_POOL=0`.
fn big<T>(n: usize) -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    n.saturating_mul(std::mem::size_of::<T>()) >= MIN_BYTES && *ON.get_or_init(|| std::env::var("ASRFORGE_CPU_POOL").map_or(true, |v| v != "0"))
}

/// Whether a buffer of capacity `cap` serves `n` elements (at most 1/8 spare).
fn fits(cap: usize, n: usize) -> bool {
    cap >= n && cap - n <= n / 8
}

/// `n` zeros, in a pooled buffer when one fits.
pub fn zeroed<T: Pooled>(n: usize) -> Vec<T> {
    if !big::<T>(n) {
        return vec![T::default(); n];
    }
    let size = std::mem::size_of::<T>();
    let (found, evicted) = {
        let mut bufs = T::shelf().bufs.lock().unwrap_or_else(|e| e.into_inner());
        match bufs.iter().rposition(|v| fits(v.capacity(), n)) {
            Some(i) => (Some(bufs.remove(i)), Vec::new()),
            None => {
                // Live bytes after this allocation; the pool may hold what
                // keeps the total under the high-water mark.
                let after = crate::tensor::live_bytes() as usize + n * size;
                let high = HIGH.fetch_max(after, Ordering::Relaxed).max(after);
                let allowed = high - after;
                let mut pooled: usize = bufs.iter().map(|v| v.capacity() * size).sum();
                let mut k = 0;
                while k < bufs.len() && pooled > allowed {
                    pooled -= bufs[k].capacity() * size;
                    k += 1;
                }
                (None, bufs.drain(..k).collect::<Vec<_>>())
            }
        }
    };
    drop(evicted);
    // A fresh buffer comes zeroed from the allocator (its own mmap: pages
    // the kernel zeroes when the kernel writing the output first touches
    // them, on the worker threads), not from a serial fill here.
    let Some(mut v) = found else {
        return vec![T::default(); n];
    };
    v.clear();
    v.resize(n, T::default());
    v
}

/// Keeps `v`'s buffer for a later [`zeroed`] when it is large.
pub fn give<T: Pooled>(v: Vec<T>) {
    if big::<T>(v.capacity()) {
        T::shelf().bufs.lock().unwrap_or_else(|e| e.into_inner()).push(v);
    }
}

/// Frees every pooled buffer of type `T`.
pub fn clear<T: Pooled>() {
    let bufs = std::mem::take(&mut *T::shelf().bufs.lock().unwrap_or_else(|e| e.into_inner()));
    drop(bufs);
}

/// Bytes held by the pool for type `T`.
pub fn pooled_bytes<T: Pooled>() -> usize {
    T::shelf().bufs.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|v| v.capacity() * std::mem::size_of::<T>()).sum()
}
