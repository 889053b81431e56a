//! The emulated driver (`ASRFORGE_CUDA_EMU=1`): device memory is host
//! memory, 256-byte aligned, with guard bytes before and after every buffer
//! and after every storage inside its pooled block; modules are the
//! emulator's shared libraries (`lib<stem>.so`, cuda/emu/abi.h) and a launch
//! runs the whole grid before it returns. Streams and events exist and keep
//! their order trivially (everything has run when a call returns). Host
//! threads that queue work on one stream at once are serialised, as a
//! GPU's stream runs its work one item after another: a launch, a product,
//! a fill or a copy holds its stream's lock while it runs (work on other
//! streams may overlap it). Without that, two threads' kernels on the
//! compute stream would run at the same time, which no GPU does, and the
//! device's shared arrival counters (`CudaDevice::arrivals`) would be
//! counted by both.
//!
//! What a GPU would not keep is checked instead: the stream order. Every
//! operation on a stream (launch, product, copy, fill) stamps the buffers it
//! touches with its place in that stream; an operation on another stream
//! that touches a stamped buffer must be ordered after the stamp, by an
//! event it waited for or by the host having seen the stamp's work
//! complete (a synchronize, an event synchronize or a query that said
//! done). Otherwise it fails naming both streams and the buffer: on a GPU
//! the two could run in either order. Blocks the caching allocator hands
//! out again keep their stamps, so a block freed in one stream's order and
//! reused on another without an event is caught too (an H200 showed this
//! once: a staging copy overwritten by a fill queued earlier on the compute
//! stream).
//!
//! Pending work can be staged for tests of code that polls events: while a
//! stream is held (`CudaDevice::emu_hold_stream`), queries of its events say
//! "not finished" (and the host has not seen its work complete); a host wait
//! on the stream or one of its events ends the hold, as the wait would end
//! once a GPU finished the work. A memory limit (`emu_limit_memory`) makes
//! `malloc` refuse, for tests of the out-of-memory path.
//!
//! Guards are checked after every launch (the buffers it was passed), when
//! a storage is dropped, when a buffer is freed, and at every
//! synchronisation (every buffer). A corruption found where no error can be
//! returned (a drop) is kept and reported by the next synchronisation or
//! launch, as the GPU reports an asynchronous fault.

use super::{emu_blas, DevPtr, Driver, DriverKind, Event, Func, Gemm, LaunchConfig, LtKey, LtMatmul, LtPlan, Stream};
use crate::error::{Error, Result};
use std::alloc::Layout;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{c_char, c_void, CStr};
use std::sync::Mutex;

/// Bytes of guard before and after each buffer (also the alignment).
pub(crate) const GUARD: usize = 256;

/// The guard byte at offset `i` of a guard zone: a pattern no NaN poison or
/// zero fill produces.
fn guard_byte(i: usize) -> u8 {
    [0xDE, 0xAD, 0xBE, 0xEF][i % 4]
}

/// One host allocation standing for a device buffer.
struct Buf {
    /// The allocation, `GUARD + bytes + GUARD` bytes.
    base: *mut u8,
    layout: Layout,
    /// The buffer's usable size (a multiple of the guard size).
    bytes: usize,
    /// The bytes of the storage it holds now (guarded up to `bytes`), if any.
    requested: Option<usize>,
}

// SAFETY: `base` is plain host memory owned by the map entry; it is only
// touched under the map's mutex (guards) or by kernels and copies that the
// backend orders.
unsafe impl Send for Buf {}

impl Buf {
    fn ptr(&self) -> DevPtr {
        self.base as u64 + GUARD as u64
    }
    /// Writes the guard pattern into `[from, to)` of the allocation.
    fn fill(&self, from: usize, to: usize) {
        for i in from..to {
            // SAFETY: `i < GUARD + bytes + GUARD`, inside the allocation.
            unsafe { *self.base.add(i) = guard_byte(i) };
        }
    }
    /// The first corrupted guard byte, as a message, or None.
    fn check(&self) -> Option<String> {
        let end = GUARD + self.requested.unwrap_or(self.bytes);
        let total = 2 * GUARD + self.bytes;
        // SAFETY: the allocation holds `total` bytes.
        let all = unsafe { std::slice::from_raw_parts(self.base, total) };
        if let Some(i) = (0..GUARD).rev().find(|&i| all[i] != guard_byte(i)) {
            return Some(format!("{} byte(s) before its start were overwritten", GUARD - i));
        }
        if let Some(i) = (end..total).find(|&i| all[i] != guard_byte(i)) {
            return Some(format!("the byte {} past its end was overwritten", i - end));
        }
        None
    }
    fn describe(&self) -> String {
        match self.requested {
            Some(r) => format!("device buffer of {r} bytes at {:#x} (pool block of {} bytes)", self.ptr(), self.bytes),
            None => format!("cached device block of {} bytes at {:#x}", self.bytes, self.ptr()),
        }
    }
}

/// The stream-order check's state: vector clocks over the streams.
#[derive(Default)]
struct Order {
    /// `known[s][t]`: work queued on stream `s` from now on runs after
    /// operation `known[s][t]` of stream `t`; `known[s][s]` counts the
    /// operations queued on `s`.
    known: Vec<Vec<u64>>,
    /// `done[t]`: the host has seen operation `done[t]` of stream `t` complete.
    done: Vec<u64>,
    /// Recorded events: their stream and the clock of that stream then.
    events: HashMap<usize, (usize, Vec<u64>)>,
    next_event: usize,
    /// Per driver buffer: the last operation of each stream that touched it.
    touched: HashMap<DevPtr, Vec<(usize, u64)>>,
    /// Streams whose events report pending work (module doc).
    held: HashSet<usize>,
}

impl Order {
    fn at(v: &[u64], t: usize) -> u64 {
        v.get(t).copied().unwrap_or(0)
    }
    fn row(&mut self, s: usize) -> &mut Vec<u64> {
        if self.known.len() <= s {
            self.known.resize(s + 1, Vec::new());
        }
        &mut self.known[s]
    }
    fn raise(v: &mut Vec<u64>, by: &[u64]) {
        if v.len() < by.len() {
            v.resize(by.len(), 0);
        }
        for (a, b) in v.iter_mut().zip(by) {
            *a = (*a).max(*b);
        }
    }
    /// Marks everything `clock` covers as complete (the host saw it).
    fn complete(&mut self, clock: &[u64]) {
        let mut done = std::mem::take(&mut self.done);
        Order::raise(&mut done, clock);
        self.done = done;
    }
}

/// The C entry points of one emulated module.
struct Module {
    _lib: libloading::Library,
    launch: unsafe extern "C" fn(usize, u32, u32, u32, u32, u32, u32, u32, *mut *mut c_void, *mut c_char, usize) -> i32,
    names: Vec<String>,
}

/// The emulated device.
pub(crate) struct EmuDriver {
    ordinal: usize,
    dir: String,
    bufs: Mutex<BTreeMap<DevPtr, Buf>>,
    modules: Mutex<(Vec<Module>, HashMap<String, usize>)>,
    /// The kernel launched last (for guard messages).
    last: Mutex<String>,
    /// A fault found where it could not be returned.
    pending: Mutex<Option<String>>,
    streams: Mutex<usize>,
    /// The cuBLASLt plans made, by handle (the key each was made for).
    lt_plans: Mutex<Vec<LtKey>>,
    /// The stream-order check (module doc).
    order: Mutex<Order>,
    /// The most bytes of buffers `malloc` may hold (module doc).
    limit: Mutex<Option<usize>>,
    /// One lock per stream number (mod 64), held while that stream's work runs (module doc).
    exec: Vec<Mutex<()>>,
}

impl EmuDriver {
    /// Holds stream `s` for one piece of its work: work other threads queue
    /// on it waits (the stream runs one item at a time).
    fn in_order(&self, s: Stream) -> std::sync::MutexGuard<'_, ()> {
        self.exec[(s.0 % 64) as usize].lock().unwrap_or_else(|e| e.into_inner())
    }
    /// The emulated device `ordinal`, loading modules from `dir`.
    pub(crate) fn new(ordinal: usize, dir: String) -> EmuDriver {
        EmuDriver {
            ordinal,
            dir,
            bufs: Mutex::new(BTreeMap::new()),
            modules: Mutex::new((Vec::new(), HashMap::new())),
            last: Mutex::new(String::from("(none yet)")),
            pending: Mutex::new(None),
            streams: Mutex::new(1),
            lt_plans: Mutex::new(Vec::new()),
            order: Mutex::new(Order::default()),
            exec: (0..64).map(|_| Mutex::new(())).collect(),
            limit: Mutex::new(None),
        }
    }
    /// Queues one operation (`what`) on stream `s` touching the buffers
    /// holding `ptrs`: fails if another stream touched one of them last at
    /// an operation `s` is not ordered after (module doc), else stamps them.
    fn touch(&self, s: Stream, ptrs: &[DevPtr], what: &str) -> Result<()> {
        let bufs = self.bufs.lock().unwrap_or_else(|e| e.into_inner());
        let mut o = self.order.lock().unwrap_or_else(|e| e.into_inner());
        let s = s.0;
        let seq = {
            let row = o.row(s);
            if row.len() <= s {
                row.resize(s + 1, 0);
            }
            row[s] += 1;
            row[s]
        };
        for &p in ptrs {
            let Some((&base, b)) = bufs.range(..=p).next_back() else { continue };
            if p >= b.ptr() + b.bytes as u64 {
                continue;
            }
            if let Some(stamps) = o.touched.get(&base) {
                for &(t, q) in stamps {
                    let ordered = Order::at(&o.known[s], t);
                    if t != s && q > ordered && q > Order::at(&o.done, t) {
                        return Err(Error::Cuda {
                            kernel: what.into(),
                            msg: format!(
                                "stream-order race on cuda:{} (emulated): {what} on stream {s} touches the {}, which stream {t} touched at its operation {q}, \
                                 but stream {s} is ordered only after operation {ordered} of stream {t} and the host has not seen it complete; on a GPU the \
                                 two may run in either order: record an event on stream {t} after its use and make stream {s} wait for it. Last kernel \
                                 launched: {}",
                                self.ordinal,
                                b.describe(),
                                self.last_kernel()
                            ),
                        });
                    }
                }
            }
            let stamps = o.touched.entry(base).or_default();
            match stamps.iter_mut().find(|(t, _)| *t == s) {
                Some(e) => e.1 = seq,
                None => stamps.push((s, seq)),
            }
        }
        Ok(())
    }
    fn last_kernel(&self) -> String {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    fn fault(&self, buf: &Buf, what: String) -> String {
        format!("{} of cuda:{} (emulated): {what}; last kernel launched: {}", buf.describe(), self.ordinal, self.last_kernel())
    }
    /// Reports a kept fault, once.
    fn take_pending(&self) -> Result<()> {
        match self.pending.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(msg) => Err(Error::Cuda { kernel: "device memory guard".into(), msg }),
            None => Ok(()),
        }
    }
    /// Checks the guards of every buffer.
    fn check_all(&self) -> Result<()> {
        self.take_pending()?;
        let bufs = self.bufs.lock().unwrap_or_else(|e| e.into_inner());
        for b in bufs.values() {
            if let Some(w) = b.check() {
                return Err(Error::Cuda { kernel: "device memory guard".into(), msg: self.fault(b, w) });
            }
        }
        Ok(())
    }
    /// The buffer holding `[p, p + n)`, checked against its storage's size.
    pub(crate) fn check_range(&self, p: DevPtr, n: usize, what: &str) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let bufs = self.bufs.lock().unwrap_or_else(|e| e.into_inner());
        let Some((_, b)) = bufs.range(..=p).next_back() else {
            return Err(Error::Cuda { kernel: what.into(), msg: format!("address {p:#x} is not in any device buffer of cuda:{} (emulated)", self.ordinal) });
        };
        let len = b.requested.unwrap_or(b.bytes) as u64;
        if p + n as u64 > b.ptr() + len || p < b.ptr() {
            return Err(Error::Cuda {
                kernel: what.into(),
                msg: format!("{n} bytes at {p:#x} reach past the {} (emulated cuda:{})", b.describe(), self.ordinal),
            });
        }
        Ok(())
    }
}

fn mem_total() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("MemTotal:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse::<usize>().ok()))
        .map_or(16 << 30, |kib| kib * 1024)
}

impl Driver for EmuDriver {
    fn kind(&self) -> DriverKind {
        let schedule = std::env::var("ASRFORGE_EMU_SCHEDULE").unwrap_or_else(|_| "asc".into());
        let schedule =
            if schedule == "random" { format!("random (seed {})", std::env::var("ASRFORGE_EMU_SEED").unwrap_or_else(|_| "0".into())) } else { schedule };
        DriverKind::Emulated { dir: self.dir.clone(), schedule }
    }
    fn name(&self) -> Result<String> {
        Ok("asrforge CUDA emulator (kernels run on the CPU)".into())
    }
    fn compute_capability(&self) -> Result<(i32, i32)> {
        Ok((9, 0))
    }
    fn mem_info(&self) -> Result<(usize, usize)> {
        let total = self.limit.lock().unwrap_or_else(|e| e.into_inner()).unwrap_or_else(mem_total);
        let used: usize = self.bufs.lock().unwrap_or_else(|e| e.into_inner()).values().map(|b| b.bytes).sum();
        Ok((total.saturating_sub(used), total))
    }
    fn bind(&self) -> Result<()> {
        Ok(())
    }
    fn new_stream(&self) -> Result<Stream> {
        let mut n = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        *n += 1;
        Ok(Stream(*n - 1))
    }
    fn streams(&self) -> usize {
        *self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn malloc(&self, bytes: usize) -> Result<Option<DevPtr>> {
        let bytes = bytes.div_ceil(GUARD) * GUARD;
        if let Some(limit) = *self.limit.lock().unwrap_or_else(|e| e.into_inner()) {
            let used: usize = self.bufs.lock().unwrap_or_else(|e| e.into_inner()).values().map(|b| b.bytes).sum();
            if used + bytes > limit {
                return Ok(None);
            }
        }
        let Ok(layout) = Layout::from_size_align(bytes + 2 * GUARD, GUARD) else { return Ok(None) };
        // SAFETY: the layout has a non-zero size.
        let base = unsafe { std::alloc::alloc(layout) };
        if base.is_null() {
            return Ok(None);
        }
        let b = Buf { base, layout, bytes, requested: None };
        b.fill(0, GUARD);
        b.fill(GUARD + bytes, 2 * GUARD + bytes);
        let p = b.ptr();
        self.bufs.lock().unwrap_or_else(|e| e.into_inner()).insert(p, b);
        Ok(Some(p))
    }
    unsafe fn free(&self, p: DevPtr, _bytes: usize) -> Result<()> {
        let b = self.bufs.lock().unwrap_or_else(|e| e.into_inner()).remove(&p).ok_or_else(|| Error::Cuda {
            kernel: "cuMemFree".into(),
            msg: format!("{p:#x} is not a live device buffer of cuda:{} (emulated)", self.ordinal),
        })?;
        self.order.lock().unwrap_or_else(|e| e.into_inner()).touched.remove(&p);
        let bad = b.check().map(|w| self.fault(&b, w));
        // SAFETY: `base` was allocated with `layout` in `malloc` and is removed from the map.
        unsafe { std::alloc::dealloc(b.base, b.layout) };
        match bad {
            Some(msg) => Err(Error::Cuda { kernel: "device memory guard".into(), msg }),
            None => Ok(()),
        }
    }
    fn block_taken(&self, p: DevPtr, requested: usize, _class: usize) {
        let mut bufs = self.bufs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = bufs.get_mut(&p) {
            b.requested = Some(requested.min(b.bytes));
            b.fill(GUARD + requested.min(b.bytes), GUARD + b.bytes);
        }
    }
    fn block_returned(&self, p: DevPtr) {
        let mut bufs = self.bufs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = bufs.get(&p) {
            if let Some(w) = b.check() {
                let msg = self.fault(b, w);
                let mut pend = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                pend.get_or_insert(msg);
            }
        }
        if let Some(b) = bufs.get_mut(&p) {
            b.requested = None;
        }
    }
    fn malloc_host(&self, bytes: usize) -> Result<*mut u8> {
        let layout = Layout::from_size_align(bytes.max(1), 4096).map_err(|e| Error::Cuda { kernel: "cuMemHostAlloc".into(), msg: e.to_string() })?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return Err(Error::Cuda { kernel: "cuMemHostAlloc".into(), msg: format!("out of host memory for {bytes} bytes") });
        }
        Ok(p)
    }
    unsafe fn free_host(&self, p: *mut u8, bytes: usize) -> Result<()> {
        let layout = Layout::from_size_align(bytes.max(1), 4096).map_err(|e| Error::Cuda { kernel: "cuMemFreeHost".into(), msg: e.to_string() })?;
        // SAFETY: the caller guarantees `p` came from `malloc_host(bytes)`, i.e. this layout.
        unsafe { std::alloc::dealloc(p, layout) };
        Ok(())
    }
    unsafe fn memset_d8(&self, p: DevPtr, byte: u8, n: usize, s: Stream) -> Result<()> {
        self.check_range(p, n, "cuMemsetD8Async")?;
        self.touch(s, &[p], "cuMemsetD8Async")?;
        let _running = self.in_order(s);
        // SAFETY: checked above: `n` bytes of a live buffer.
        unsafe { std::ptr::write_bytes(p as *mut u8, byte, n) };
        Ok(())
    }
    unsafe fn htod(&self, dst: DevPtr, src: &[u8], s: Stream) -> Result<()> {
        self.check_range(dst, src.len(), "cuMemcpyHtoDAsync")?;
        self.touch(s, &[dst], "cuMemcpyHtoDAsync")?;
        let _running = self.in_order(s);
        // SAFETY: checked above; host and device memory never overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }
    unsafe fn dtoh(&self, dst: &mut [u8], src: DevPtr, s: Stream) -> Result<()> {
        self.check_range(src, dst.len(), "cuMemcpyDtoHAsync")?;
        self.touch(s, &[src], "cuMemcpyDtoHAsync")?;
        let _running = self.in_order(s);
        // SAFETY: checked above; `dst` is a distinct host slice.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
    unsafe fn dtod(&self, dst: DevPtr, src: DevPtr, n: usize, s: Stream) -> Result<()> {
        self.check_range(dst, n, "cuMemcpyDtoDAsync")?;
        self.check_range(src, n, "cuMemcpyDtoDAsync")?;
        self.touch(s, &[dst, src], "cuMemcpyDtoDAsync")?;
        let _running = self.in_order(s);
        // SAFETY: checked above; `copy` allows overlap as cuMemcpy does not promise.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
        Ok(())
    }
    fn function(&self, module: &str, kernel: &str) -> Result<Func> {
        let mut mods = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        let mi = match mods.1.get(module) {
            Some(&i) => i,
            None => {
                let m = load_module(&self.dir, module)?;
                mods.0.push(m);
                let i = mods.0.len() - 1;
                mods.1.insert(module.to_string(), i);
                i
            }
        };
        let m = &mods.0[mi];
        let ki = m.names.iter().position(|n| n == kernel).ok_or_else(|| Error::Cuda {
            kernel: format!("{module}/{kernel}"),
            msg: format!("the emulated module {module:?} ({}/lib{module}.so) has no kernel {kernel:?} ({} kernels)", self.dir, m.names.len()),
        })?;
        Ok(Func(mi << 32 | ki))
    }
    unsafe fn launch(&self, f: Func, name: &str, cfg: LaunchConfig, params: &mut [*mut c_void], buffers: &[DevPtr], s: Stream) -> Result<()> {
        self.take_pending()?;
        self.touch(s, buffers, name)?;
        let (mi, ki) = (f.0 >> 32, f.0 & 0xFFFF_FFFF);
        let launch = {
            let mods = self.modules.lock().unwrap_or_else(|e| e.into_inner());
            let m = mods.0.get(mi).ok_or_else(|| Error::Cuda { kernel: name.into(), msg: "not a function of this emulated device".into() })?;
            m.launch
        };
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = name.to_string();
        let mut err = vec![0u8; 2048];
        let (g, b) = (cfg.grid, cfg.block);
        let running = self.in_order(s);
        // SAFETY: `launch` is the module's asrforge_emu_launch (the library
        // stays loaded while the driver lives); `ki` is a kernel index it
        // listed; the caller guarantees `params`; `err` is a writable buffer
        // of the length passed.
        let rc = unsafe { launch(ki, g.0, g.1, g.2, b.0, b.1, b.2, cfg.shared_bytes, params.as_mut_ptr(), err.as_mut_ptr() as *mut c_char, err.len()) };
        drop(running);
        if rc != 0 {
            let msg = CStr::from_bytes_until_nul(&err).map(|c| c.to_string_lossy().into_owned()).unwrap_or_else(|_| String::from_utf8_lossy(&err).into_owned());
            return Err(Error::Cuda { kernel: name.into(), msg: format!("emulated launch {cfg:?} failed: {msg}") });
        }
        let bufs = self.bufs.lock().unwrap_or_else(|e| e.into_inner());
        for p in buffers {
            if let Some(bf) = bufs.get(p) {
                if let Some(w) = bf.check() {
                    return Err(Error::Cuda { kernel: name.into(), msg: self.fault(bf, w) });
                }
            }
        }
        Ok(())
    }
    fn synchronize(&self, s: Stream) -> Result<()> {
        let mut o = self.order.lock().unwrap_or_else(|e| e.into_inner());
        o.held.remove(&s.0);
        let clock = o.row(s.0).clone();
        o.complete(&clock);
        drop(o);
        self.check_all()
    }
    fn record_event(&self, s: Stream) -> Result<Event> {
        if s.0 >= *self.streams.lock().unwrap_or_else(|e| e.into_inner()) {
            return Err(Error::Cuda { kernel: "cuEventRecord".into(), msg: format!("no stream {} on cuda:{} (emulated)", s.0, self.ordinal) });
        }
        let mut o = self.order.lock().unwrap_or_else(|e| e.into_inner());
        let clock = o.row(s.0).clone();
        let id = o.next_event;
        o.next_event += 1;
        o.events.insert(id, (s.0, clock));
        Ok(Event(id))
    }
    fn stream_wait_event(&self, s: Stream, e: &Event) -> Result<()> {
        let mut o = self.order.lock().unwrap_or_else(|e| e.into_inner());
        let Some((_, clock)) = o.events.get(&e.0).cloned() else {
            return Err(Error::Cuda {
                kernel: "cuStreamWaitEvent".into(),
                msg: format!("event {} is not a live event of cuda:{} (emulated)", e.0, self.ordinal),
            });
        };
        Order::raise(o.row(s.0), &clock);
        Ok(())
    }
    fn event_synchronize(&self, e: &Event) -> Result<()> {
        let mut o = self.order.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((s, clock)) = o.events.get(&e.0).cloned() {
            o.held.remove(&s);
            o.complete(&clock);
        }
        drop(o);
        self.check_all()
    }
    fn event_query(&self, e: &Event) -> Result<bool> {
        // Work runs when it is queued here, so every recorded event is
        // complete unless its stream is held (module doc); a fault found
        // since is reported as the GPU would at its next query.
        self.take_pending()?;
        let mut o = self.order.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((s, clock)) = o.events.get(&e.0).cloned() {
            if o.held.contains(&s) {
                return Ok(false);
            }
            o.complete(&clock);
        }
        Ok(true)
    }
    fn destroy_event(&self, e: Event) {
        self.order.lock().unwrap_or_else(|e| e.into_inner()).events.remove(&e.0);
    }
    fn emu_hold_stream(&self, s: Stream, held: bool) -> Result<()> {
        if s.0 >= *self.streams.lock().unwrap_or_else(|e| e.into_inner()) {
            return Err(Error::invalid("emu_hold_stream", format!("expected a stream of cuda:{} (emulated), found stream {}", self.ordinal, s.0)));
        }
        let mut o = self.order.lock().unwrap_or_else(|e| e.into_inner());
        if held {
            o.held.insert(s.0);
        } else {
            o.held.remove(&s.0);
        }
        Ok(())
    }
    fn emu_limit_memory(&self, bytes: Option<usize>) -> Result<()> {
        *self.limit.lock().unwrap_or_else(|e| e.into_inner()) = bytes;
        Ok(())
    }
    unsafe fn gemm(&self, g: &Gemm, s: Stream) -> Result<()> {
        self.take_pending()?;
        self.touch(s, &[g.a, g.b, g.c], "cublas/gemm")?;
        let _running = self.in_order(s);
        // SAFETY: forwarded from the caller; the ranges are checked inside.
        unsafe { emu_blas::gemm(self, g) }
    }
    fn lt_plan(&self, key: &LtKey) -> Result<LtPlan> {
        emu_blas::check_plan(key)?;
        let mut plans = self.lt_plans.lock().unwrap_or_else(|e| e.into_inner());
        plans.push(*key);
        Ok(LtPlan(plans.len() - 1))
    }
    unsafe fn lt_matmul(&self, plan: LtPlan, g: &LtMatmul, s: Stream) -> Result<()> {
        self.take_pending()?;
        let mut ptrs = vec![g.a, g.b, g.d, g.workspace];
        ptrs.extend(g.bias);
        self.touch(s, &ptrs, "cublasLt/matmul")?;
        let made_for = self.lt_plans.lock().unwrap_or_else(|e| e.into_inner()).get(plan.0).copied();
        if made_for != Some(g.key) {
            return Err(Error::Cuda {
                kernel: "cublasLt/Matmul (emulated)".into(),
                msg: format!("CUBLAS_STATUS_INVALID_VALUE: plan {} was made for {made_for:?}, used for {:?}", plan.0, g.key),
            });
        }
        let _running = self.in_order(s);
        // SAFETY: forwarded from the caller; the ranges are checked inside.
        unsafe { emu_blas::lt_matmul(self, g) }
    }
    fn blas_version(&self) -> Result<i32> {
        Ok(0)
    }
}

impl Drop for EmuDriver {
    fn drop(&mut self) {
        let bufs = std::mem::take(self.bufs.get_mut().unwrap_or_else(|e| e.into_inner()));
        for b in bufs.into_values() {
            // SAFETY: every buffer was allocated with its layout and nothing uses it any more.
            unsafe { std::alloc::dealloc(b.base, b.layout) };
        }
    }
}

/// Opens `dir/lib<stem>.so` and lists its kernels.
fn load_module(dir: &str, stem: &str) -> Result<Module> {
    let path = std::path::Path::new(dir).join(format!("lib{stem}.so"));
    let err = |msg: String| Error::Cuda { kernel: format!("{stem}/*"), msg };
    if !path.is_file() {
        return Err(err(format!("no emulated kernel module {} (built modules: [{}])", path.display(), super::super::kernels::EMU_MODULES.join(", "))));
    }
    // SAFETY: the library is an emulated module built by build.rs from
    // cuda/<stem>.cu; loading runs only C++ static initialisers of that code.
    let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| err(format!("cannot load {}: {e}", path.display())))?;
    // SAFETY: the symbols have the C signatures of cuda/emu/abi.h (ABI 1, checked first).
    unsafe {
        let abi = lib.get::<unsafe extern "C" fn() -> i32>(b"asrforge_emu_abi\0").map_err(|e| err(format!("{}: {e}", path.display())))?;
        let v = abi();
        if v != 1 {
            return Err(err(format!("{} speaks emulator ABI {v}, this build expects 1; rebuild", path.display())));
        }
        let count = lib.get::<unsafe extern "C" fn() -> usize>(b"asrforge_emu_kernel_count\0").map_err(|e| err(format!("{}: {e}", path.display())))?;
        let name =
            lib.get::<unsafe extern "C" fn(usize) -> *const c_char>(b"asrforge_emu_kernel_name\0").map_err(|e| err(format!("{}: {e}", path.display())))?;
        let launch = *lib
            .get::<unsafe extern "C" fn(usize, u32, u32, u32, u32, u32, u32, u32, *mut *mut c_void, *mut c_char, usize) -> i32>(b"asrforge_emu_launch\0")
            .map_err(|e| err(format!("{}: {e}", path.display())))?;
        let mut names = Vec::new();
        for i in 0..count() {
            let p = name(i);
            if p.is_null() {
                return Err(err(format!("{}: kernel {i} has no name", path.display())));
            }
            names.push(CStr::from_ptr(p).to_string_lossy().into_owned());
        }
        Ok(Module { _lib: lib, launch, names })
    }
}

#[cfg(test)]
mod tests {
    use super::{EmuDriver, Stream};
    use crate::backend::cuda::driver::Driver;

    fn two_streams() -> (EmuDriver, Stream, Stream, u64) {
        let d = EmuDriver::new(0, String::new());
        let copy = d.new_stream().unwrap();
        let p = d.malloc(1024).unwrap().unwrap();
        (d, Stream(0), copy, p)
    }

    /// A buffer the compute stream filled, written by the copy stream with
    /// nothing ordering the two, is the race an H200 showed (the fill landed
    /// after the copy): refused, naming both streams.
    #[test]
    fn a_write_on_another_stream_without_an_event_is_a_race() {
        let (d, compute, copy, p) = two_streams();
        // SAFETY: `p` holds 1024 bytes.
        unsafe { d.memset_d8(p, 0xFF, 1024, compute) }.unwrap();
        // SAFETY: as above.
        let e = unsafe { d.htod(p, &[1u8; 64], copy) }.unwrap_err().to_string();
        assert!(e.contains("stream-order race") && e.contains("on stream 1") && e.contains("stream 0 touched"), "{e}");
    }

    /// An event recorded after the use and waited for orders the two; so
    /// does the host having seen the work complete. Each direction counts.
    #[test]
    fn an_event_or_a_host_synchronisation_orders_the_streams() {
        let (d, compute, copy, p) = two_streams();
        // SAFETY: `p` holds 1024 bytes in every call below.
        unsafe { d.memset_d8(p, 0, 1024, compute) }.unwrap();
        let ev = d.record_event(compute).unwrap();
        d.stream_wait_event(copy, &ev).unwrap();
        unsafe { d.htod(p, &[1u8; 64], copy) }.unwrap();
        // The compute stream reading the copy's result before waiting for it: a race.
        let e = unsafe { d.dtod(p + 512, p, 64, compute) }.unwrap_err().to_string();
        assert!(e.contains("stream-order race") && e.contains("on stream 0"), "{e}");
        let copied = d.record_event(copy).unwrap();
        d.stream_wait_event(compute, &copied).unwrap();
        unsafe { d.dtod(p + 512, p, 64, compute) }.unwrap();
        // The host saw the compute stream finish: the copy stream may write.
        d.synchronize(compute).unwrap();
        unsafe { d.htod(p, &[2u8; 64], copy) }.unwrap();
        // A completed query counts as well; an event recorded before the
        // last use does not.
        let early = d.record_event(copy).unwrap();
        unsafe { d.htod(p, &[3u8; 64], copy) }.unwrap();
        d.stream_wait_event(compute, &early).unwrap();
        assert!(unsafe { d.memset_d8(p, 0, 8, compute) }.is_err(), "an event recorded before the copy does not order it");
        let late = d.record_event(copy).unwrap();
        assert!(d.event_query(&late).unwrap());
        unsafe { d.memset_d8(p, 0, 8, compute) }.unwrap();
    }

    /// A held stream's events are pending to queries (and order nothing for
    /// the host) until released or waited for; a limit refuses malloc.
    #[test]
    fn a_held_stream_reports_pending_events_until_released_or_waited_for() {
        let (d, compute, copy, p) = two_streams();
        d.emu_hold_stream(copy, true).unwrap();
        // SAFETY: `p` holds 1024 bytes.
        unsafe { d.htod(p, &[1u8; 64], copy) }.unwrap();
        let e = d.record_event(copy).unwrap();
        assert!(!d.event_query(&e).unwrap());
        assert!(unsafe { d.memset_d8(p, 0, 8, compute) }.is_err(), "a pending query orders nothing");
        d.emu_hold_stream(copy, false).unwrap();
        assert!(d.event_query(&e).unwrap());
        unsafe { d.memset_d8(p, 0, 8, compute) }.unwrap();
        d.emu_hold_stream(copy, true).unwrap();
        let f = d.record_event(copy).unwrap();
        d.event_synchronize(&f).unwrap();
        assert!(d.event_query(&f).unwrap(), "a host wait ends the hold");
        assert!(d.emu_hold_stream(Stream(9), true).is_err());
        d.emu_limit_memory(Some(2000)).unwrap();
        assert!(d.malloc(1024).unwrap().is_none(), "1024 B held + 1024 > 2000");
        assert!(d.malloc(256).unwrap().is_some());
        d.emu_limit_memory(None).unwrap();
        assert!(d.malloc(1 << 20).unwrap().is_some());
    }

    /// Work on one stream needs no event, and other buffers are not affected.
    #[test]
    fn one_stream_is_ordered_by_itself() {
        let (d, compute, copy, p) = two_streams();
        let q = d.malloc(256).unwrap().unwrap();
        for _ in 0..3 {
            // SAFETY: `p` holds 1024 bytes, `q` 256.
            unsafe { d.memset_d8(p, 1, 1024, compute) }.unwrap();
            unsafe { d.htod(q, &[1u8; 256], copy) }.unwrap();
        }
    }
}
