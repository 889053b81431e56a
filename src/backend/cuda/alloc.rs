//! The caching allocator. Requests are rounded up to a size class (512 B
//! steps up to 1 MiB, then four classes per power of two, so at most a
//! quarter is wasted); a freed block goes back to the free list of its
//! (stream, class) and the next request of that class from that stream
//! reuses it without a driver call. Only a miss calls cuMemAlloc.
//!
//! Streams. Every block belongs to the stream it was allocated for (the
//! compute stream, unless [`CudaDevice::alloc_on_stream`] names another),
//! and goes back only to that stream's free list: a block freed by the host
//! while that stream's queued kernels still read it is handed only to work
//! queued after them on the same stream, so reuse needs no event and no
//! wait. When a storage is handed to another stream (a copy on the copy
//! stream, a collective on NCCL's stream), the code that does it calls
//! [`CudaStorage::record_stream`](super::CudaStorage::record_stream) (as
//! PyTorch's `Tensor.record_stream`). When such a storage drops, an event
//! is recorded on each of those other streams and the block waits, counted
//! in the pool's `pending` bytes and handed to no request, until a
//! non-blocking query at a later allocation finds every event complete;
//! then it joins its own stream's free list. A block used only on its own
//! stream records nothing and costs no call: a single-stream step makes
//! exactly the driver calls, host waits and allocations it made before.
//!
//! Out of memory: a miss the driver refuses first returns every cached block
//! to the driver and retries once, then fails with the pool's state. Before
//! returning them, the host waits for the events of pending blocks (the
//! allocator's only host wait on events: a pending block cannot be freed
//! while another stream may still use it, and waiting is better than
//! failing) and synchronises the compute stream and every stream that owns
//! a cached block. `empty_cache` does the same.

use super::device::CudaDevice;
use super::driver::{DevPtr, Event, Stream, COMPUTE};
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

/// One device buffer of a size class, and the stream it was allocated for.
#[derive(Debug)]
pub(crate) struct Block {
    pub ptr: DevPtr,
    pub bytes: usize,
    pub stream: Stream,
}

/// A freed block that other streams used: it joins its stream's free list
/// once each of their events (recorded at the free, with their stream) has
/// completed.
#[derive(Debug)]
struct Waiting {
    ptr: DevPtr,
    class: usize,
    stream: Stream,
    events: Vec<(Stream, Event)>,
}

/// The pool's bookkeeping: free lists by (stream, class), the blocks
/// waiting for other streams, and byte counters. It makes no driver call:
/// event queries are passed in, so it is tested without a device.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    free: BTreeMap<(usize, usize), Vec<DevPtr>>,
    waiting: Vec<Waiting>,
    in_use: usize,
    /// Free-list and waiting bytes.
    cached: usize,
    /// Waiting bytes (part of `cached`).
    pending: usize,
    peak: usize,
    driver_allocs: u64,
}

impl Pool {
    fn stats(&self) -> PoolStats {
        PoolStats {
            in_use: self.in_use,
            cached: self.cached,
            reserved: self.in_use + self.cached,
            peak: self.peak,
            driver_allocs: self.driver_allocs,
            pending: self.pending,
        }
    }
    /// A free block of `class` for `stream` (blocks of other streams and
    /// waiting blocks are never handed out).
    fn take(&mut self, stream: Stream, class: usize) -> Option<DevPtr> {
        let list = self.free.get_mut(&(stream.0, class))?;
        let p = list.pop()?;
        if list.is_empty() {
            self.free.remove(&(stream.0, class));
        }
        self.cached -= class;
        Some(p)
    }
    /// Counts a block handed out (from the free list or the driver).
    fn taken(&mut self, class: usize) {
        self.in_use += class;
        self.peak = self.peak.max(self.in_use);
    }
    /// A block whose storage dropped: to its stream's free list at once when
    /// `events` is empty (used on its own stream only), else waiting for them.
    fn give_back(&mut self, ptr: DevPtr, class: usize, stream: Stream, events: Vec<(Stream, Event)>) {
        self.in_use -= class;
        self.cached += class;
        if events.is_empty() {
            self.free.entry((stream.0, class)).or_default().push(ptr);
        } else {
            self.pending += class;
            self.waiting.push(Waiting { ptr, class, stream, events });
        }
    }
    /// A block dropped whose other streams could not be ordered (a failed
    /// event record and host wait): it is never handed out again.
    fn forget(&mut self, class: usize) {
        self.in_use -= class;
    }
    /// Queries the waiting blocks' events without waiting: completed events
    /// move to `done` (for the caller to destroy), and a block with none
    /// left joins its stream's free list. Events of one stream complete in
    /// the order they were recorded, so once one is found pending the later
    /// ones of that stream are not queried: a poll costs at most one query
    /// per stream beyond the events that completed. Stops at the first
    /// failed query.
    fn poll(&mut self, query: &mut dyn FnMut(&Event) -> Result<bool>, done: &mut Vec<Event>) -> Result<()> {
        let mut blocked = 0u64;
        let mut i = 0;
        while i < self.waiting.len() {
            let w = &mut self.waiting[i];
            let mut j = 0;
            while j < w.events.len() {
                let (s, e) = &w.events[j];
                if blocked >> s.0 & 1 == 0 && query(e)? {
                    done.push(w.events.remove(j).1);
                } else {
                    blocked |= 1 << s.0;
                    j += 1;
                }
            }
            if w.events.is_empty() {
                let w = self.waiting.remove(i);
                self.pending -= w.class;
                self.free.entry((w.stream.0, w.class)).or_default().push(w.ptr);
            } else {
                i += 1;
            }
        }
        Ok(())
    }
    /// Every free-list block (ptr, class, stream), leaving waiting blocks.
    fn drain(&mut self) -> Vec<(DevPtr, usize, Stream)> {
        let out: Vec<_> =
            std::mem::take(&mut self.free).into_iter().flat_map(|((stream, class), v)| v.into_iter().map(move |p| (p, class, Stream(stream)))).collect();
        self.cached -= out.iter().map(|b| b.1).sum::<usize>();
        out
    }
}

/// The streams of a storage's use mask (bit s: stream s), but `own`.
pub(crate) fn other_streams(mask: u64, own: Stream) -> impl Iterator<Item = Stream> {
    (0..64).filter(move |&s| mask >> s & 1 == 1 && s != own.0).map(Stream)
}

impl CudaDevice {
    /// A block of at least `bytes` for work on `stream`, from that stream's
    /// free list, or from the driver on a miss.
    pub(crate) fn alloc_block(&self, bytes: usize, stream: Stream) -> Result<Block> {
        let class = size_class(bytes);
        if class == 0 {
            return Ok(Block { ptr: 0, bytes: 0, stream });
        }
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if !pool.waiting.is_empty() {
            self.poll_waiting(&mut pool)?;
        }
        let seam = self.seam();
        let ptr = match pool.take(stream, class) {
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
        pool.taken(class);
        Ok(Block { ptr, bytes: class, stream })
    }

    /// Moves waiting blocks whose events completed to their free lists (no wait).
    fn poll_waiting(&self, pool: &mut Pool) -> Result<()> {
        let drv = self.seam().driver();
        let mut done = Vec::new();
        let r = pool.poll(&mut |e| drv.event_query(e), &mut done);
        for e in done {
            drv.destroy_event(e);
        }
        r
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

    /// Returns a block to the pool (called when a storage drops); `used_on`
    /// is its storage's mask of the streams `record_stream` named. Used on
    /// its own stream only, the block is free at once; else an event is
    /// recorded on each other stream and the block waits for them.
    pub(crate) fn free_block(&self, b: &Block, used_on: u64) {
        if b.bytes == 0 {
            return;
        }
        let drv = self.seam().driver();
        drv.block_returned(b.ptr);
        let mut events = Vec::new();
        let mut ordered = true;
        for s in other_streams(used_on, b.stream) {
            match drv.record_event(s) {
                Ok(e) => events.push((s, e)),
                // No event (a broken context): wait on the host instead; if
                // even that fails the block is never reused.
                Err(_) => ordered &= self.seam().synchronize(s).is_ok(),
            }
        }
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if ordered {
            pool.give_back(b.ptr, b.bytes, b.stream, events);
        } else {
            pool.forget(b.bytes);
            drop(pool);
            for (_, e) in events {
                drv.destroy_event(e);
            }
        }
    }

    /// Returns every cached block to the driver: first the host waits for
    /// the events of the blocks waiting for other streams (the allocator's
    /// one host wait on events, only here: out of memory and `empty_cache`),
    /// then synchronises the compute stream and every stream owning a block.
    fn release_cached(&self, pool: &mut Pool) -> Result<()> {
        let seam = self.seam();
        while let Some(mut w) = pool.waiting.pop() {
            while let Some((s, e)) = w.events.pop() {
                if let Err(err) = seam.event_synchronize(&e) {
                    w.events.push((s, e));
                    pool.waiting.push(w);
                    return Err(err);
                }
                seam.driver().destroy_event(e);
            }
            pool.pending -= w.class;
            pool.free.entry((w.stream.0, w.class)).or_default().push(w.ptr);
        }
        let blocks = pool.drain();
        if blocks.is_empty() {
            return Ok(());
        }
        // Cached blocks may still be used by work queued on their streams: finish it first.
        let mut streams: Vec<Stream> = blocks.iter().map(|b| b.2).filter(|&s| s != COMPUTE).collect();
        streams.sort_by_key(|s| s.0);
        streams.dedup();
        seam.synchronize(COMPUTE)?;
        for s in streams {
            seam.synchronize(s)?;
        }
        for (p, bytes, _) in blocks {
            // SAFETY: `p` came from the driver's malloc of `bytes`, sits only
            // in the free list (no storage refers to it, the events of the
            // other streams that used it have completed) and its stream is idle.
            unsafe { seam.free(p, bytes) }?;
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
    use super::{other_streams, size_class, Event, Pool, Stream};
    use std::collections::HashSet;

    /// The pool's bookkeeping with a fake event query: `complete` lists the
    /// events that have finished.
    fn poll(pool: &mut Pool, complete: &HashSet<usize>) -> Vec<usize> {
        let mut done = Vec::new();
        pool.poll(&mut |e: &Event| Ok(complete.contains(&e.0)), &mut done).unwrap();
        let mut ids: Vec<usize> = done.into_iter().map(|e| e.0).collect();
        ids.sort();
        ids
    }

    #[test]
    fn a_block_used_only_on_its_stream_is_reused_at_once_by_that_stream_only() {
        let mut p = Pool::default();
        let (compute, side) = (Stream(0), Stream(2));
        p.taken(1024);
        p.give_back(0x1000, 1024, compute, Vec::new());
        assert_eq!((p.stats().cached, p.stats().pending, p.stats().in_use), (1024, 0, 0));
        assert_eq!(p.take(side, 1024), None, "another stream's block");
        assert_eq!(p.take(compute, 512), None, "another class");
        assert_eq!(p.take(compute, 1024), Some(0x1000));
        p.taken(1024);
        assert_eq!((p.stats().cached, p.stats().in_use, p.stats().peak), (0, 1024, 1024));
    }

    #[test]
    fn a_block_other_streams_used_waits_for_every_event() {
        let mut p = Pool::default();
        let (compute, copy, comm) = (Stream(0), Stream(1), Stream(2));
        p.taken(4096);
        p.give_back(0x2000, 4096, compute, vec![(copy, Event(7)), (comm, Event(8))]);
        assert_eq!((p.stats().cached, p.stats().pending), (4096, 4096));
        assert_eq!(p.take(compute, 4096), None, "pending: no request gets it");
        assert_eq!(poll(&mut p, &HashSet::new()), Vec::<usize>::new());
        assert_eq!(p.take(compute, 4096), None);
        // One of the two streams done: still waiting for the other.
        assert_eq!(poll(&mut p, &HashSet::from([7])), vec![7]);
        assert_eq!((p.take(compute, 4096), p.stats().pending), (None, 4096));
        assert_eq!(poll(&mut p, &HashSet::from([7, 8])), vec![8]);
        assert_eq!(p.stats().pending, 0);
        // Back on its own stream's list only.
        assert_eq!(p.take(copy, 4096), None);
        assert_eq!(p.take(comm, 4096), None);
        assert_eq!(p.take(compute, 4096), Some(0x2000));
        assert_eq!(p.stats().cached, 0);
    }

    #[test]
    fn a_failed_query_keeps_the_block_waiting_and_drain_leaves_waiting_blocks() {
        let mut p = Pool::default();
        p.taken(512);
        p.taken(512);
        p.give_back(0x10, 512, Stream(1), vec![(Stream(0), Event(1))]);
        p.give_back(0x20, 512, Stream(1), Vec::new());
        let mut done = Vec::new();
        let r = p.poll(&mut |_e: &Event| Err(crate::error::Error::Msg("context lost".into())), &mut done);
        assert!(r.is_err() && done.is_empty());
        assert_eq!(p.stats().pending, 512);
        assert_eq!(p.drain(), vec![(0x20, 512, Stream(1))]);
        assert_eq!((p.stats().cached, p.stats().pending, p.waiting.len()), (512, 512, 1));
    }

    /// Events of one stream complete in order: after a pending one, the
    /// later ones of that stream are not queried; other streams still are.
    #[test]
    fn a_poll_queries_no_event_behind_a_pending_one_of_its_stream() {
        let mut p = Pool::default();
        let (compute, copy, comm) = (Stream(0), Stream(1), Stream(2));
        for (i, s) in [copy, copy, comm, copy].into_iter().enumerate() {
            p.taken(512);
            p.give_back(0x100 * (i as u64 + 1), 512, compute, vec![(s, Event(i))]);
        }
        let mut asked = Vec::new();
        let mut done = Vec::new();
        p.poll(
            &mut |e: &Event| {
                asked.push(e.0);
                Ok(e.0 == 2)
            },
            &mut done,
        )
        .unwrap();
        assert_eq!(asked, vec![0, 2], "events 1 and 3 are behind pending event 0 of the copy stream");
        assert_eq!((done.len(), p.stats().pending), (1, 3 * 512));
        assert_eq!(p.take(compute, 512), Some(0x300));
    }

    #[test]
    fn other_streams_skip_the_blocks_own() {
        let mask = 1 | 1 << 1 | 1 << 5;
        assert_eq!(other_streams(mask, Stream(0)).collect::<Vec<_>>(), vec![Stream(1), Stream(5)]);
        assert_eq!(other_streams(mask, Stream(5)).collect::<Vec<_>>(), vec![Stream(0), Stream(1)]);
        assert_eq!(other_streams(0, Stream(0)).count(), 0);
    }

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
