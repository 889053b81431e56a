//! `TcpCommunicator`: the `Communicator` for CPU tensors over TCP (the role
//! gloo plays for PyTorch).
//!
//! Device tensors are staged through host memory: each argument on a GPU is
//! copied to the host (one device-to-host copy and one host
//! synchronisation), the collective runs on the copy, and a result goes back
//! into the same device buffer (one host-to-device copy, one device copy).
//! This is how the GPU engines run on the emulated device (whose device
//! memory is host memory) and the fallback `--dist_backend gloo` gives on a
//! GPU; the engines stage their buckets themselves on the calling thread, so
//! the communication thread never touches the device.
//!
//! Set-up: every rank listens on an ephemeral port, publishes `host:port`
//! under `{prefix}/addr/{rank}` in the rendezvous store, and builds a full
//! mesh of persistent connections — rank i connects to every j < i and
//! accepts every j > i; the first message on a connection names the rank,
//! the group prefix and the job token. Algorithms live in `dist::ring`.
//!
//! Failure: a collective that fails (a peer closed its connection, did not
//! answer before the deadline, or called a different collective) sends an
//! abort frame with the reason to every peer, closes its connections, and
//! leaves the communicator unusable; the peers' current or next collective
//! fails with the same reason, naming the rank at fault. A timeout first
//! runs a census (`dist::census`) so that the ranks named are the ones that
//! are really silent, not the live ones stalled behind them in the ring.

use super::comm::{Communicator, ReduceOp};
use super::elem;
use super::store::Store;
use super::wire::{self, read_full, secs, write_full, Header, HEADER_LEN, KIND_ABORT};
use crate::backend::cpu::CpuStorage;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::tensor::{Device, Tensor};
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Largest payload of one frame: big tensors move in pieces of this size, so
/// receiving and reducing one piece overlaps sending the next.
pub const DEFAULT_CHUNK_BYTES: usize = 1 << 20;
/// Tensors smaller than this go directly to every peer (one round trip)
/// instead of around the ring (2·(world − 1) steps).
pub const DIRECT_MAX_BYTES: usize = 64 << 10;
/// The handshake's magic: "asrforge tcp communicator", version 1.
const HELLO_MAGIC: &[u8; 8] = b"AFTCP\x00\x00\x01";

/// Why a collective failed, before it is turned into an [`Error`].
pub(crate) enum Fail {
    /// An I/O error on the link to `peer`.
    Io { peer: usize, err: io::Error },
    /// `peer` sent an abort frame with this reason.
    Abort { msg: String },
    /// `from` timed out and started a census of who is alive.
    Census { from: usize },
    /// Ranks disagree on the call, or another error with its message.
    Msg(String),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Fail::Msg(e.to_string())
    }
}

/// A group of processes running collectives over TCP on CPU tensors.
pub struct TcpCommunicator {
    pub(super) rank: usize,
    pub(super) world: usize,
    pub(super) timeout: Duration,
    pub(super) chunk_bytes: usize,
    /// `peers[j]`: the connection to rank j (`None` for this rank).
    pub(super) peers: Vec<Option<TcpStream>>,
    /// Number of collectives started, sent in every header.
    pub(super) seq: u64,
    /// Why the communicator is unusable, after a failed collective.
    broken: Option<String>,
    pub(super) prefix: String,
}

impl std::fmt::Debug for TcpCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TcpCommunicator({}, rank {} of {})", self.prefix, self.rank, self.world)
    }
}

fn hello(token: &str, prefix: &str, rank: usize, world: usize) -> Vec<u8> {
    let mut b = HELLO_MAGIC.to_vec();
    b.extend_from_slice(&(rank as u64).to_le_bytes());
    b.extend_from_slice(&(world as u64).to_le_bytes());
    for s in [token, prefix] {
        b.extend_from_slice(&(s.len() as u32).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
    }
    b
}

/// Reads a peer's handshake; `Ok(None)` when it is not one of ours.
fn read_hello(s: &TcpStream, token: &str, prefix: &str, world: usize, deadline: Instant) -> io::Result<Option<usize>> {
    let mut head = [0u8; 24];
    read_full(s, &mut head, deadline)?;
    if &head[..8] != HELLO_MAGIC {
        return Ok(None);
    }
    let word = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().unwrap_or([0; 8])) as usize;
    let (rank, their_world) = (word(8), word(16));
    let mut strings = Vec::new();
    for limit in [4096usize, 4096] {
        let mut len = [0u8; 4];
        read_full(s, &mut len, deadline)?;
        let len = u32::from_le_bytes(len) as usize;
        if len > limit {
            return Ok(None);
        }
        let mut v = vec![0u8; len];
        read_full(s, &mut v, deadline)?;
        strings.push(v);
    }
    let ok = strings[0] == token.as_bytes() && strings[1] == prefix.as_bytes() && their_world == world && rank < world;
    Ok(ok.then_some(rank))
}

impl TcpCommunicator {
    /// Joins the group `prefix` (unique per group within a job) as `rank`
    /// of `world_size`, exchanging addresses through `store`; fails after
    /// `timeout` (also the per-call timeout of every collective) naming the
    /// ranks that never showed up.
    pub fn new(store: &Store, prefix: &str, rank: usize, world_size: usize, timeout: Duration) -> Result<TcpCommunicator> {
        const OP: &str = "tcp communicator set-up";
        if world_size == 0 || rank >= world_size {
            return Err(Error::invalid("TcpCommunicator::new", format!("rank {rank} is not in a group of {world_size}")));
        }
        let mut c = TcpCommunicator {
            rank,
            world: world_size,
            timeout,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            peers: (0..world_size).map(|_| None).collect(),
            seq: 0,
            broken: None,
            prefix: prefix.to_string(),
        };
        if world_size == 1 {
            return Ok(c);
        }
        let deadline = Instant::now() + timeout;
        let io = |what: &str, e: io::Error| Error::dist(OP, rank, format!("{what}: {e}"));
        let listener = TcpListener::bind(SocketAddr::new(store.local_ip(), 0)).map_err(|e| io("cannot listen", e))?;
        let me = listener.local_addr().map_err(|e| io("cannot listen", e))?;
        store.set(&format!("{prefix}/addr/{rank}"), me.to_string().as_bytes())?;
        let token = store.token();
        for j in 0..rank {
            let left = deadline.saturating_duration_since(Instant::now());
            let addr = store
                .get_timeout(&format!("{prefix}/addr/{j}"), left)
                .map_err(|_| Error::dist(OP, rank, format!("rank {j} did not publish its address under '{prefix}/addr/{j}' within {}", secs(timeout))))?;
            let addr: SocketAddr = String::from_utf8_lossy(&addr).parse().map_err(|_| {
                Error::dist(OP, rank, format!("rank {j} published '{}' under '{prefix}/addr/{j}', expected host:port", String::from_utf8_lossy(&addr)))
            })?;
            let s = connect_until(&addr, deadline).map_err(|e| Error::dist(OP, rank, format!("cannot connect to rank {j} at {addr}: {e}")))?;
            s.set_nodelay(true).map_err(|e| io("set_nodelay", e))?;
            write_full(&s, &hello(token, prefix, rank, world_size), deadline).map_err(|e| io(&format!("handshake with rank {j}"), e))?;
            let mut ack = [0u8; 1];
            match read_full(&s, &mut ack, deadline) {
                Ok(()) if ack[0] == 1 => {}
                Ok(()) | Err(_) => {
                    return Err(Error::dist(OP, rank, format!("rank {j} at {addr} refused the connection (a different job token, group or world size?)")));
                }
            }
            c.peers[j] = Some(s);
        }
        listener.set_nonblocking(true).map_err(|e| io("listener", e))?;
        while c.peers[rank + 1..].iter().any(Option::is_none) {
            match listener.accept() {
                Ok((s, from)) => {
                    s.set_nonblocking(false).map_err(|e| io("accept", e))?;
                    let hello_deadline = deadline.min(Instant::now() + Duration::from_secs(10));
                    match read_hello(&s, token, prefix, world_size, hello_deadline) {
                        Ok(Some(j)) if j > rank && c.peers[j].is_none() => {
                            s.set_nodelay(true).map_err(|e| io("set_nodelay", e))?;
                            write_full(&s, &[1], deadline).map_err(|e| io(&format!("handshake with rank {j}"), e))?;
                            c.peers[j] = Some(s);
                        }
                        _ => eprintln!("tcp communicator '{prefix}' rank {rank}: refused a connection from {from}: not a peer of this group (job token, rank or world size)"),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<String> = (rank + 1..world_size).filter(|&j| c.peers[j].is_none()).map(|j| j.to_string()).collect();
                        return Err(Error::dist(OP, rank, format!("rank(s) {} did not connect within {}", missing.join(", "), secs(timeout))));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(io("accept", e)),
            }
        }
        Ok(c)
    }

    /// Sets the payload size of one frame (default [`DEFAULT_CHUNK_BYTES`]),
    /// rounded down to a multiple of 8 bytes (at least 64) so a piece never
    /// splits an element; every rank of the group must use the same value.
    pub fn set_chunk_bytes(&mut self, bytes: usize) {
        self.chunk_bytes = bytes.max(64) / 8 * 8;
    }

    /// The group's prefix in the store.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The connection to `peer`.
    pub(super) fn link(&self, peer: usize) -> std::result::Result<&TcpStream, Fail> {
        self.peers.get(peer).and_then(Option::as_ref).ok_or_else(|| Fail::Msg(format!("no connection to rank {peer}")))
    }

    /// Runs one collective: checks the communicator is usable, stamps a
    /// sequence number, and turns a failure into an [`Error`] after telling
    /// every peer.
    pub(super) fn run(&mut self, op: &'static str, f: impl FnOnce(&mut Self, Instant) -> std::result::Result<(), Fail>) -> Result<()> {
        if let Some(why) = &self.broken {
            return Err(Error::dist(op, self.rank, format!("the communicator is unusable after an earlier failure: {why}")));
        }
        self.seq += 1;
        let deadline = Instant::now() + self.timeout;
        let fail = match f(self, deadline) {
            Ok(()) => return Ok(()),
            Err(fail) => fail,
        };
        let (msg, forward, skip) = match fail {
            Fail::Io { peer, err } if wire::is_timeout(&err) => {
                let reason = self.census(&[], peer);
                (reason.clone(), format!("{reason}, as seen by rank {}", self.rank), Some(peer))
            }
            Fail::Census { from } => {
                let reason = self.census(&[from], from);
                (reason.clone(), format!("{reason}, as seen by rank {}", self.rank), None)
            }
            Fail::Io { peer, err } => {
                let reason = self.drain_abort(peer).unwrap_or_else(|| {
                    if wire::is_closed(&err) {
                        format!("rank {peer} closed its connection (did it exit?)")
                    } else {
                        format!("connection to rank {peer}: {err}")
                    }
                });
                let fwd = if reason.contains("as seen by rank") { reason.clone() } else { format!("{reason}, as seen by rank {}", self.rank) };
                (reason, fwd, Some(peer))
            }
            Fail::Abort { msg } => (msg.clone(), msg, None),
            Fail::Msg(m) => (m.clone(), format!("{m}, as seen by rank {}", self.rank), None),
        };
        self.abort_all(op, &forward, skip);
        self.broken = Some(msg.clone());
        Err(Error::dist(op, self.rank, msg))
    }

    /// After an I/O failure on the link to `peer`, the abort frame `peer`
    /// may have sent before closing (it says why, and who is at fault).
    fn drain_abort(&self, peer: usize) -> Option<String> {
        let s = self.link(peer).ok()?;
        let deadline = Instant::now() + Duration::from_millis(200);
        let mut h = [0u8; HEADER_LEN];
        read_full(s, &mut h, deadline).ok()?;
        let h = Header::decode(&h);
        if h.kind != KIND_ABORT || h.len > 1 << 16 {
            return None;
        }
        let mut m = vec![0u8; h.len as usize];
        read_full(s, &mut m, deadline).ok()?;
        Some(String::from_utf8_lossy(&m).into_owned())
    }

    /// Tells every peer (but `skip`, whose link is in an unknown state) why
    /// this rank gives up, then closes every connection.
    fn abort_all(&mut self, op: &'static str, msg: &str, skip: Option<usize>) {
        let h = Header { kind: KIND_ABORT, op: op_code(op), dtype: 0, rop: 0, seq: self.seq, count: 0, len: msg.len() as u64 };
        let deadline = Instant::now() + Duration::from_millis(500);
        for (j, p) in self.peers.iter().enumerate() {
            if let Some(s) = p {
                if Some(j) != skip {
                    let _ = write_full(s, &h.encode(), deadline).and_then(|_| write_full(s, msg.as_bytes(), deadline));
                }
                let _ = s.shutdown(Shutdown::Write);
            }
        }
    }
}

impl Drop for TcpCommunicator {
    /// After a failure, reads and discards what peers still send until they
    /// close their side, or stay silent for 0.5 s (a stopped peer never
    /// closes; a job's two communicators must not each wait the full time
    /// for it), at most 2 s: closing a socket with unread data makes the
    /// kernel send a reset, which would destroy the abort frame a peer has
    /// not read yet and leave it blaming this rank.
    fn drop(&mut self) {
        if self.broken.is_none() {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut sink = vec![0u8; 64 << 10];
        for s in self.peers.iter().flatten() {
            loop {
                let left = deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(500));
                if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
                    return;
                }
                match std::io::Read::read(&mut &*s, &mut sink) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        }
    }
}

fn connect_until(addr: &SocketAddr, deadline: Instant) -> io::Result<TcpStream> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(addr, left.clamp(Duration::from_millis(1), Duration::from_secs(1))) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() + Duration::from_millis(20) >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The wire code of a collective's name.
pub(super) fn op_code(op: &str) -> u8 {
    match op {
        "all_reduce" => 1,
        "broadcast" => 2,
        "all_gather" => 3,
        "reduce_scatter" => 4,
        "barrier" => 5,
        _ => 0,
    }
}

/// The name of a collective's wire code.
pub(super) fn op_name(code: u8) -> &'static str {
    match code {
        1 => "all_reduce",
        2 => "broadcast",
        3 => "all_gather",
        4 => "reduce_scatter",
        5 => "barrier",
        _ => "an unknown collective",
    }
}

fn gpu(op: &'static str) -> Error {
    Error::invalid(op, "the TCP communicator stages GPU tensors through a host copy; found a GPU storage where a host copy was expected")
}

/// A host copy of `t` when it lives on a GPU (`None` on the CPU).
fn host_copy(t: &Tensor) -> Result<Option<Tensor>> {
    match t.device() {
        Device::Cpu => Ok(None),
        Device::Cuda(_) => Ok(Some(t.detach().to_device(&Device::Cpu)?)),
    }
}

/// A host buffer for an output `t` that lives on a GPU (its old contents are not read).
fn host_out(t: &Tensor) -> Result<Option<Tensor>> {
    match t.device() {
        Device::Cpu => Ok(None),
        Device::Cuda(_) => Ok(Some(Tensor::zeros(t.shape().clone(), t.dtype(), &Device::Cpu)?)),
    }
}

/// Writes the host result `h` back into the device tensor `t`.
fn write_back(t: &Tensor, h: Tensor) -> Result<()> {
    t.assign(&h.to_device(&t.device())?)
}

/// Runs `f` on `t`'s CPU storage with write access.
fn with_cpu_mut<R>(op: &'static str, t: &Tensor, f: impl FnOnce(&mut CpuStorage) -> Result<R>) -> Result<R> {
    t.with_storage_mut(|s| match s {
        Storage::Cpu(c) => f(c),
        #[allow(unreachable_patterns)]
        Storage::Cuda(_) => Err(gpu(op)),
    })
}

/// A copy of `t`'s CPU storage.
fn cpu_copy(op: &'static str, t: &Tensor) -> Result<CpuStorage> {
    match &*t.storage() {
        Storage::Cpu(c) => Ok(c.clone()),
        #[allow(unreachable_patterns)]
        Storage::Cuda(_) => Err(gpu(op)),
    }
}

impl Communicator for TcpCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn all_reduce(&mut self, t: &Tensor, op: ReduceOp) -> Result<()> {
        const OP: &str = "all_reduce";
        elem::check_reducible(OP, t.dtype(), op)?;
        if let Some(h) = host_copy(t)? {
            self.all_reduce(&h, op)?;
            return write_back(t, h);
        }
        let (dtype, count) = (t.dtype(), t.elem_count());
        with_cpu_mut(OP, t, |s| {
            let buf = s.as_bytes_mut();
            self.run(OP, |c, deadline| c.all_reduce_bytes(buf, dtype, count, op, deadline))
        })
    }

    fn broadcast(&mut self, t: &Tensor, root: usize) -> Result<()> {
        const OP: &str = "broadcast";
        if root >= self.world {
            return Err(Error::invalid(OP, format!("root {root} is not a rank of a group of {}", self.world)));
        }
        if let Some(h) = host_copy(t)? {
            self.broadcast(&h, root)?;
            return write_back(t, h);
        }
        let (dtype, count) = (t.dtype(), t.elem_count());
        with_cpu_mut(OP, t, |s| {
            let buf = s.as_bytes_mut();
            self.run(OP, |c, deadline| c.broadcast_bytes(buf, dtype, count, root, deadline))
        })
    }

    fn all_gather(&mut self, input: &Tensor, output: &Tensor) -> Result<()> {
        const OP: &str = "all_gather";
        let n = input.elem_count();
        if output.elem_count() != self.world * n || output.dtype() != input.dtype() {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: format!("an output of {} x {n} = {} {} elements", self.world, self.world * n, input.dtype().as_str()),
                got: format!("{} {} elements", output.elem_count(), output.dtype().as_str()),
            });
        }
        if input.device() != Device::Cpu || output.device() != Device::Cpu {
            let i = host_copy(input)?.unwrap_or_else(|| input.clone());
            let o = host_out(output)?;
            let oh = o.clone().unwrap_or_else(|| output.clone());
            self.all_gather(&i, &oh)?;
            return match o {
                Some(h) => write_back(output, h),
                None => Ok(()),
            };
        }
        let mine = cpu_copy(OP, input)?;
        let dtype = input.dtype();
        with_cpu_mut(OP, output, |s| {
            let buf = s.as_bytes_mut();
            self.run(OP, |c, deadline| c.all_gather_bytes(mine.as_bytes(), buf, dtype, n, deadline))
        })
    }

    fn reduce_scatter(&mut self, input: &Tensor, output: &Tensor, op: ReduceOp) -> Result<()> {
        const OP: &str = "reduce_scatter";
        elem::check_reducible(OP, input.dtype(), op)?;
        let n = output.elem_count();
        if input.elem_count() != self.world * n || output.dtype() != input.dtype() {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: format!("an input of {} x {n} = {} {} elements", self.world, self.world * n, output.dtype().as_str()),
                got: format!("{} {} elements", input.elem_count(), input.dtype().as_str()),
            });
        }
        if input.device() != Device::Cpu || output.device() != Device::Cpu {
            let i = host_copy(input)?.unwrap_or_else(|| input.clone());
            let o = host_out(output)?;
            let oh = o.clone().unwrap_or_else(|| output.clone());
            self.reduce_scatter(&i, &oh, op)?;
            return match o {
                Some(h) => write_back(output, h),
                None => Ok(()),
            };
        }
        let mut scratch = cpu_copy(OP, input)?;
        let dtype = input.dtype();
        with_cpu_mut(OP, output, |s| {
            let out = s.as_bytes_mut();
            self.run(OP, |c, deadline| c.reduce_scatter_bytes(scratch.as_bytes_mut(), out, dtype, n, op, deadline))
        })
    }

    fn barrier(&mut self) -> Result<()> {
        self.run("barrier", |c, deadline| c.barrier_frames(deadline))
    }

    fn abort(&mut self, reason: &str) {
        if self.broken.is_some() || self.world == 1 {
            return;
        }
        self.abort_all("abort", reason, None);
        self.broken = Some(reason.to_string());
    }
}
