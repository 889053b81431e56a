//! NCCL, loaded at run time: the handful of entry points the NCCL
//! communicator (`dist::nccl`) uses, with cudarc's NCCL bindings
//! (`cudarc::nccl::sys`) for the ABI's types and enum values.
//!
//! cudarc's own loader looks for `libnccl.so` (and `.so.<CUDA major>`,
//! `.so.12`, ...), while pip's `nvidia-nccl-cu*` wheels ship only
//! `libnccl.so.2`, and its loader panics when it finds nothing; so the
//! library is opened here instead — `libnccl.so.2` first (the SONAME every
//! NCCL 2 install has), then `libnccl.so` — and a missing NCCL is an error
//! that says what to install, never a panic.
//!
//! Every collective is enqueued on a stream of the communicator's device
//! (a communication stream of its own, which waits on an event of the
//! compute stream's queued work, or the compute stream); its buffers are
//! recorded as used on that stream (`CudaStorage::record_stream`), so a
//! buffer dropped after it returns to the pool only once an event on the
//! communication stream says the collective is done, however the call
//! returns. It is then waited for by polling: the completion event
//! and `ncclCommGetAsyncError`, every millisecond, until a deadline; so a
//! dead or stuck peer is an error naming the collective, not a hang. After
//! an error the communicator must be aborted (`abort`); a clean one is
//! destroyed (`destroy`, or on drop).
//!
//! The communicator is created non-blocking (`ncclCommInitRankConfig` with
//! `blocking = 0`, NCCL >= 2.14) so that its initialisation is bounded too:
//! NCCL returns at once and the bootstrap is polled with
//! `ncclCommGetAsyncError` until it is done or the timeout passes (then
//! `ncclCommAbort`), instead of `ncclCommInitRank` waiting forever for a
//! peer that never comes. On such a communicator `ncclGroupEnd` may return
//! `ncclInProgress` before the collectives are enqueued, so `run` polls it
//! to completion before recording the completion event, and teardown is
//! `ncclCommFinalize`, polled, then `ncclCommDestroy`. An NCCL without
//! `ncclCommInitRankConfig` gets the blocking `ncclCommInitRank` (a note on
//! stderr says its initialisation is unbounded).

use super::CudaDevice;
use super::CudaStorage;
use crate::error::{Error, Result};
use crate::tensor::DType;
use cudarc::nccl::sys::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclUniqueId};
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// What to do when NCCL cannot be loaded.
pub const NCCL_INSTALL: &str = "install NCCL 2 for your CUDA (e.g. `pip install nvidia-nccl-cu13` and add its nvidia/nccl/lib folder to LD_LIBRARY_PATH, or the distribution's libnccl2 package), or use --dist_backend gloo";

type Res = c_int;
const SUCCESS: Res = 0;
const IN_PROGRESS: Res = 7;

/// nccl.h's `NCCL_CONFIG_UNDEF_INT`: "let NCCL choose".
const CONFIG_UNDEF_INT: c_int = c_int::MIN;

/// nccl.h's `ncclConfig_t` as NCCL 2.14 introduced it (`ncclConfig_v21400`):
/// `size_t size; unsigned magic; unsigned version; int blocking;`, 24 bytes
/// with the tail padding. NCCL copies `min(size, its own sizeof)` bytes over
/// its defaults and, by `version`, resets every field newer than that
/// version to its default, so this prefix is valid for every NCCL >= 2.14.
/// The padding is written explicitly (it overlaps `cgaClusterSize` in later
/// layouts, which the 2.14 version resets anyway).
#[repr(C)]
struct Config {
    size: usize,
    /// nccl.h's `NCCL_API_MAGIC` (0xcafebeef).
    magic: u32,
    /// `NCCL_VERSION(2, 14, 0)` = 2·10000 + 14·100 + 0.
    version: u32,
    /// 0: every call returns at once, `ncclInProgress` while work goes on.
    blocking: c_int,
    tail: c_int,
}

impl Config {
    fn non_blocking() -> Config {
        Config { size: std::mem::size_of::<Config>(), magic: 0xcafe_beef, version: 21400, blocking: 0, tail: CONFIG_UNDEF_INT }
    }
}

/// `ncclCommInitRankConfig(comm, nranks, id, rank, config)`.
type InitRankConfig = unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int, *mut Config) -> Res;

/// The NCCL entry points, resolved once.
struct Api {
    _lib: libloading::Library,
    name: &'static str,
    get_version: unsafe extern "C" fn(*mut c_int) -> Res,
    get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> Res,
    comm_init_rank: unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> Res,
    /// NCCL >= 2.14 (the non-blocking initialisation).
    comm_init_rank_config: Option<InitRankConfig>,
    /// NCCL >= 2.14 (the non-blocking teardown).
    comm_finalize: Option<unsafe extern "C" fn(ncclComm_t) -> Res>,
    all_reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, ncclComm_t, *mut c_void) -> Res,
    reduce_scatter: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, ncclComm_t, *mut c_void) -> Res,
    all_gather: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, ncclComm_t, *mut c_void) -> Res,
    broadcast: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, ncclComm_t, *mut c_void) -> Res,
    group_start: unsafe extern "C" fn() -> Res,
    group_end: unsafe extern "C" fn() -> Res,
    get_async_error: unsafe extern "C" fn(ncclComm_t, *mut Res) -> Res,
    comm_abort: unsafe extern "C" fn(ncclComm_t) -> Res,
    comm_destroy: unsafe extern "C" fn(ncclComm_t) -> Res,
    error_string: unsafe extern "C" fn(Res) -> *const c_char,
}

fn open() -> std::result::Result<Api, String> {
    let mut why = Vec::new();
    for name in ["libnccl.so.2", "libnccl.so"] {
        // SAFETY: loading NCCL runs no initialiser with preconditions (the
        // same load `asrforge info` makes to read its version).
        let lib = match unsafe { libloading::Library::new(name) } {
            Ok(l) => l,
            Err(e) => {
                why.push(format!("{name}: {e}"));
                continue;
            }
        };
        macro_rules! sym {
            ($s:literal) => {
                // SAFETY: each symbol is NCCL 2's function of that name, with
                // the C signature of the field it is stored in (nccl.h of
                // NCCL >= 2.10: enums are C ints, the unique id a 128-byte
                // struct passed by value, streams and communicators pointers).
                *unsafe { lib.get(concat!($s, "\0").as_bytes()) }.map_err(|e| format!("{name} lacks {}: {e}", $s))?
            };
        }
        let get_version = sym!("ncclGetVersion");
        let get_unique_id = sym!("ncclGetUniqueId");
        let comm_init_rank = sym!("ncclCommInitRank");
        // SAFETY: as `sym!`: NCCL's functions of those names and signatures (nccl.h >= 2.14), absent from older NCCLs.
        let comm_init_rank_config: Option<InitRankConfig> = unsafe { lib.get(b"ncclCommInitRankConfig\0") }.ok().map(|f| *f);
        // SAFETY: as above.
        let comm_finalize: Option<unsafe extern "C" fn(ncclComm_t) -> Res> = unsafe { lib.get(b"ncclCommFinalize\0") }.ok().map(|f| *f);
        let all_reduce = sym!("ncclAllReduce");
        let reduce_scatter = sym!("ncclReduceScatter");
        let all_gather = sym!("ncclAllGather");
        let broadcast = sym!("ncclBroadcast");
        let group_start = sym!("ncclGroupStart");
        let group_end = sym!("ncclGroupEnd");
        let get_async_error = sym!("ncclCommGetAsyncError");
        let comm_abort = sym!("ncclCommAbort");
        let comm_destroy = sym!("ncclCommDestroy");
        let error_string = sym!("ncclGetErrorString");
        return Ok(Api {
            name,
            get_version,
            get_unique_id,
            comm_init_rank,
            comm_init_rank_config,
            comm_finalize,
            all_reduce,
            reduce_scatter,
            all_gather,
            broadcast,
            group_start,
            group_end,
            get_async_error,
            comm_abort,
            comm_destroy,
            error_string,
            _lib: lib,
        });
    }
    Err(format!("NCCL was not found on the loader path ({}); {NCCL_INSTALL}", why.join("; ")))
}

fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(open).as_ref().map_err(|m| Error::CudaUnavailable(m.clone()))
}

/// Whether NCCL can be loaded, and its version (`major.minor.patch`) or why not.
pub fn version() -> Result<String> {
    let a = api()?;
    let mut v: c_int = 0;
    // SAFETY: ncclGetVersion writes one int.
    check(a, "ncclGetVersion", unsafe { (a.get_version)(&mut v) })?;
    Ok(format!("{}.{}.{} ({})", v / 10000, (v / 100) % 100, v % 100, a.name))
}

fn message(a: &Api, r: Res) -> String {
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
    let p = unsafe { (a.error_string)(r) };
    if p.is_null() {
        return format!("NCCL error {r}");
    }
    // SAFETY: non-null, static and NUL-terminated (above).
    let s = unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned();
    format!("{s} (NCCL error {r})")
}

fn check(a: &Api, what: &str, r: Res) -> Result<()> {
    if r == SUCCESS {
        Ok(())
    } else {
        Err(Error::Msg(format!("{what}: {}", message(a, r))))
    }
}

/// NCCL's name for an element type.
fn nccl_dtype(d: DType) -> Result<c_int> {
    Ok(match d {
        DType::F32 => ncclDataType_t::ncclFloat32 as c_int,
        DType::F16 => ncclDataType_t::ncclFloat16 as c_int,
        DType::BF16 => ncclDataType_t::ncclBfloat16 as c_int,
        DType::F64 => ncclDataType_t::ncclFloat64 as c_int,
        DType::I64 => ncclDataType_t::ncclInt64 as c_int,
        DType::U8 => ncclDataType_t::ncclUint8 as c_int,
    })
}

/// A reduction NCCL knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedOp {
    /// Sum.
    Sum,
    /// Sum divided by the number of ranks (NCCL >= 2.10).
    Avg,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

fn nccl_op(op: RedOp) -> c_int {
    (match op {
        RedOp::Sum => ncclRedOp_t::ncclSum,
        RedOp::Avg => ncclRedOp_t::ncclAvg,
        RedOp::Max => ncclRedOp_t::ncclMax,
        RedOp::Min => ncclRedOp_t::ncclMin,
    }) as c_int
}

/// The 128-byte id rank 0 creates and every rank initialises with.
pub fn unique_id() -> Result<Vec<u8>> {
    let a = api()?;
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: writes the 128-byte struct.
    check(a, "ncclGetUniqueId", unsafe { (a.get_unique_id)(&mut id) })?;
    Ok(id.internal.iter().map(|&c| c as u8).collect())
}

/// One rank's NCCL communicator on one device and stream.
pub struct NcclHandle {
    api: &'static Api,
    comm: ncclComm_t,
    dev: Arc<CudaDevice>,
    /// The stream collectives run on (0: the compute stream).
    stream: usize,
    /// Whether the communicator was aborted (it is then never destroyed).
    aborted: bool,
    /// Created with `blocking = 0`: calls may return `ncclInProgress`.
    non_blocking: bool,
}

// SAFETY: an NCCL communicator may be used from any thread as long as calls
// on it do not overlap; every use goes through `&mut self` (or drop).
unsafe impl Send for NcclHandle {}

impl NcclHandle {
    /// The communicator of rank `rank` of `nranks` on `dev`, running
    /// collectives on a communication stream of its own when `own_stream`,
    /// else on the compute stream. Non-blocking where NCCL has
    /// `ncclCommInitRankConfig`: an error naming the rank and `timeout` (the
    /// communicator aborted) when every rank has not arrived by then.
    pub fn init(dev: &Arc<CudaDevice>, id: &[u8], nranks: usize, rank: usize, own_stream: bool, timeout: Duration) -> Result<NcclHandle> {
        let a = api()?;
        if id.len() != 128 {
            return Err(Error::invalid("nccl init", format!("expected a unique id of 128 bytes, found {}", id.len())));
        }
        dev.raw_stream(0)?;
        dev.bind()?;
        let stream = if own_stream { dev.new_stream()? } else { 0 };
        let mut uid = ncclUniqueId { internal: [0; 128] };
        for (d, s) in uid.internal.iter_mut().zip(id) {
            *d = *s as c_char;
        }
        let mut comm: ncclComm_t = std::ptr::null_mut();
        let Some(init_config) = a.comm_init_rank_config else {
            eprintln!("note: {} lacks ncclCommInitRankConfig (NCCL < 2.14): rank {rank} initialises NCCL blocking, not bounded by --timeout", a.name);
            // SAFETY: `comm` receives the new communicator; the id is the 128
            // bytes rank 0 got from ncclGetUniqueId; the device is current.
            check(a, "ncclCommInitRank", unsafe { (a.comm_init_rank)(&mut comm, nranks as c_int, uid, rank as c_int) })?;
            return Ok(NcclHandle { api: a, comm, dev: dev.clone(), stream, aborted: false, non_blocking: false });
        };
        let mut config = Config::non_blocking();
        // SAFETY: as ncclCommInitRank, plus `config`, a valid ncclConfig_t
        // prefix (see `Config`) that NCCL copies before returning.
        let r = unsafe { init_config(&mut comm, nranks as c_int, uid, rank as c_int, &mut config) };
        // The handle aborts the communicator on every error path below (drop after `abort`).
        let mut h = NcclHandle { api: a, comm, dev: dev.clone(), stream, aborted: comm.is_null(), non_blocking: true };
        if r != SUCCESS && r != IN_PROGRESS {
            h.abort();
            return Err(Error::Msg(format!("ncclCommInitRankConfig (rank {rank} of {nranks}): {}", message(a, r))));
        }
        let deadline = Instant::now() + timeout;
        let state = h.poll_until_ready(deadline);
        match state {
            Ok(SUCCESS) => Ok(h),
            Ok(_) => {
                h.abort();
                Err(Error::Msg(format!(
                    "rank {rank} of {nranks}: NCCL's initialisation did not complete within {:.0} s (--timeout; a peer never joined); the communicator was aborted",
                    timeout.as_secs_f64()
                )))
            }
            Err(e) => {
                h.abort();
                Err(Error::Msg(format!("rank {rank} of {nranks}: NCCL's initialisation failed: {e}")))
            }
        }
    }

    /// Polls `ncclCommGetAsyncError` every millisecond while it says
    /// `ncclInProgress` and `deadline` has not passed: `Ok(SUCCESS)` when
    /// the pending work is done, `Ok(IN_PROGRESS)` at the deadline, the
    /// error NCCL reported otherwise.
    fn poll_until_ready(&self, deadline: Instant) -> Result<Res> {
        let a = self.api;
        loop {
            let mut e: Res = SUCCESS;
            // SAFETY: writes one result code; the communicator is live.
            check(a, "ncclCommGetAsyncError", unsafe { (a.get_async_error)(self.comm, &mut e) })?;
            match e {
                SUCCESS => return Ok(SUCCESS),
                IN_PROGRESS if Instant::now() >= deadline => return Ok(IN_PROGRESS),
                IN_PROGRESS => std::thread::sleep(Duration::from_millis(1)),
                _ => return Err(Error::Msg(message(a, e))),
            }
        }
    }

    fn ptr(s: &CudaStorage) -> *mut c_void {
        s.ptr() as *mut c_void
    }

    /// Records the collective's buffers as used on the communication stream
    /// (the allocator then keeps a dropped one until that stream's event).
    fn record(&self, bufs: &[&CudaStorage]) -> Result<()> {
        if self.stream != 0 {
            for b in bufs {
                b.record_stream(self.stream)?;
            }
        }
        Ok(())
    }

    /// Runs `enqueue` (NCCL calls on the communicator's stream, inside one
    /// group) after the compute stream's queued work (an event), and polls
    /// until it is done, NCCL reports an asynchronous error, or `timeout`
    /// passes.
    fn run(&mut self, what: &str, timeout: Duration, enqueue: impl FnOnce(&Api, ncclComm_t, *mut c_void) -> Res) -> Result<()> {
        let a = self.api;
        self.dev.bind()?;
        let raw = self.dev.raw_stream(self.stream)?;
        if self.stream != 0 {
            self.dev.record_event(0)?.wait_on(self.stream)?;
        }
        let deadline = Instant::now() + timeout;
        // SAFETY: group calls take no arguments.
        check(a, "ncclGroupStart", unsafe { (a.group_start)() })?;
        let r = enqueue(a, self.comm, raw);
        // SAFETY: closes the group opened above (also after a failed enqueue, as NCCL requires).
        let end = unsafe { (a.group_end)() };
        if r != IN_PROGRESS {
            check(a, what, r)?;
        }
        if end != IN_PROGRESS {
            check(a, "ncclGroupEnd", end)?;
        } else if self.non_blocking {
            // A non-blocking communicator may still be enqueueing the
            // group: the completion event must come after its kernels.
            match self.poll_until_ready(deadline) {
                Ok(SUCCESS) => {}
                Ok(_) => return Err(Error::Msg(format!("{what}: not even enqueued within {:.0} s (a rank stopped answering)", timeout.as_secs_f64()))),
                Err(e) => return Err(Error::Msg(format!("{what}: a peer or the network failed: {e}"))),
            }
        }
        // No compute-stream wait on `done`: this call returns only once the
        // collective has finished (polled below), so every later use of its
        // buffers is enqueued after it, and backward kernels the training
        // thread queues meanwhile keep running beside it.
        let done = self.dev.record_event(self.stream)?;
        loop {
            if done.query()? {
                return Ok(());
            }
            let mut e: Res = SUCCESS;
            // SAFETY: writes one result code; the communicator is live.
            check(a, "ncclCommGetAsyncError", unsafe { (a.get_async_error)(self.comm, &mut e) })?;
            if e != SUCCESS && e != IN_PROGRESS {
                return Err(Error::Msg(format!("{what}: a peer or the network failed: {}", message(a, e))));
            }
            if Instant::now() >= deadline {
                return Err(Error::Msg(format!("{what}: not complete within {:.0} s (a rank stopped answering)", timeout.as_secs_f64())));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// In-place all-reduce of each buffer (one group).
    pub fn all_reduce(&mut self, bufs: &[&CudaStorage], op: RedOp, timeout: Duration) -> Result<()> {
        let dts = bufs.iter().map(|b| nccl_dtype(b.dtype())).collect::<Result<Vec<_>>>()?;
        self.record(bufs)?;
        self.run("ncclAllReduce", timeout, |a, comm, st| {
            for (b, dt) in bufs.iter().zip(&dts) {
                let p = Self::ptr(b);
                // SAFETY: `p` is a live device buffer of `b.len()` elements
                // of `dt`, read and written in place; it outlives the wait.
                let r = unsafe { (a.all_reduce)(p, p, b.len(), *dt, nccl_op(op), comm, st) };
                if r != SUCCESS {
                    return r;
                }
            }
            SUCCESS
        })
    }

    /// In-place broadcast from `root`.
    pub fn broadcast(&mut self, buf: &CudaStorage, root: usize, timeout: Duration) -> Result<()> {
        let dt = nccl_dtype(buf.dtype())?;
        self.record(&[buf])?;
        self.run("ncclBroadcast", timeout, |a, comm, st| {
            let p = Self::ptr(buf);
            // SAFETY: a live device buffer of `buf.len()` elements, in place.
            unsafe { (a.broadcast)(p, p, buf.len(), dt, root as c_int, comm, st) }
        })
    }

    /// Every rank's `input` into `output` (`nranks · input.len()` elements).
    pub fn all_gather(&mut self, input: &CudaStorage, output: &CudaStorage, timeout: Duration) -> Result<()> {
        let dt = nccl_dtype(input.dtype())?;
        self.record(&[input, output])?;
        self.run("ncclAllGather", timeout, |a, comm, st| {
            // SAFETY: live buffers; the caller checked output.len() = nranks · input.len() and equal dtypes.
            unsafe { (a.all_gather)(Self::ptr(input), Self::ptr(output), input.len(), dt, comm, st) }
        })
    }

    /// The reduction of every rank's `input`, chunk `rank` into `output`.
    pub fn reduce_scatter(&mut self, input: &CudaStorage, output: &CudaStorage, op: RedOp, timeout: Duration) -> Result<()> {
        let dt = nccl_dtype(input.dtype())?;
        self.record(&[input, output])?;
        self.run("ncclReduceScatter", timeout, |a, comm, st| {
            // SAFETY: live buffers; the caller checked input.len() = nranks · output.len() and equal dtypes.
            unsafe { (a.reduce_scatter)(Self::ptr(input), Self::ptr(output), output.len(), dt, nccl_op(op), comm, st) }
        })
    }

    /// `ncclCommAbort`: frees the communicator without waiting for peers
    /// (after an error, or to make the peers' next call fail).
    pub fn abort(&mut self) {
        if self.aborted {
            return;
        }
        self.aborted = true;
        // SAFETY: the communicator is live and never used again.
        let _ = unsafe { (self.api.comm_abort)(self.comm) };
    }
}

impl Drop for NcclHandle {
    fn drop(&mut self) {
        if self.aborted {
            return;
        }
        if let (true, Some(finalize)) = (self.non_blocking, self.api.comm_finalize) {
            // A non-blocking communicator finalizes in the background: wait
            // (bounded) for it before freeing; abort if it does not end.
            // SAFETY: a live communicator that no collective is using (drop has `&mut self`).
            let r = unsafe { finalize(self.comm) };
            let ready = (r == SUCCESS || r == IN_PROGRESS) && matches!(self.poll_until_ready(Instant::now() + Duration::from_secs(10)), Ok(SUCCESS));
            if !ready {
                self.abort();
                return;
            }
        }
        // SAFETY: a live communicator that no collective is using (drop has `&mut self`).
        let _ = unsafe { (self.api.comm_destroy)(self.comm) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// nccl.h's `ncclConfig_v21400` on a 64-bit ABI: `size_t size` at 0,
    /// `magic` at 8, `version` at 12, `blocking` at 16, 24 bytes in all
    /// (8-byte alignment); `blocking` 0 and `version` NCCL_VERSION(2,14,0).
    #[test]
    fn config_is_nccl_2_14_layout() {
        assert_eq!(std::mem::size_of::<Config>(), 24);
        assert_eq!(std::mem::align_of::<Config>(), 8);
        assert_eq!((std::mem::offset_of!(Config, magic), std::mem::offset_of!(Config, version), std::mem::offset_of!(Config, blocking)), (8, 12, 16));
        let c = Config::non_blocking();
        assert_eq!((c.size, c.magic, c.version, c.blocking, c.tail), (24, 0xcafebeef, 2 * 10000 + 14 * 100, 0, i32::MIN));
    }
}
