//! The rendezvous store's client: every worker (rank 0 too) connects to the
//! store on `MASTER_ADDR:MASTER_PORT`, presents the job token, and uses it to
//! exchange small values — the TCP peers' addresses, the NCCL unique id —
//! and to count arrivals for barriers.
//!
//! Connecting retries with exponential backoff (10 ms doubling to 1 s) while
//! the master comes up; after the timeout it is an error that says where it
//! looked. `get` and `wait` block until the keys exist or the timeout passes.

use super::store_proto::{self as proto, Reader, Writer};
use super::wire::secs;
use crate::error::{Error, Result};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

/// Extra time the client waits for a reply beyond the timeout it asked the
/// server to wait (the server answers `TIMEOUT` itself at the deadline).
const REPLY_MARGIN: Duration = Duration::from_secs(5);
/// First and largest pause between connection attempts.
const BACKOFF_START: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// A connection to the rendezvous store.
pub struct Store {
    addr: String,
    stream: Mutex<TcpStream>,
    token: String,
    rank: usize,
    timeout: Duration,
    local_ip: IpAddr,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({}, rank {})", self.addr, self.rank)
    }
}

/// The job token every worker presents to the store and to its peers:
/// `ASRFORGE_RDZV_TOKEN`, else torchrun's `TORCHELASTIC_RUN_ID`, else
/// `SLURM_JOB_ID`, else one derived from `MASTER_ADDR:MASTER_PORT` (with a
/// one-time warning: such a store keeps out only other jobs' strays, not
/// anyone who can reach the port).
pub fn rdzv_token_from_env() -> String {
    for key in ["ASRFORGE_RDZV_TOKEN", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"] {
        if let Ok(v) = std::env::var(key) {
            if !v.is_empty() {
                return v;
            }
        }
    }
    let addr = std::env::var("MASTER_ADDR").unwrap_or_else(|_| "127.0.0.1".into());
    let port = std::env::var("MASTER_PORT").unwrap_or_else(|_| "29500".into());
    static WARN: Once = Once::new();
    WARN.call_once(|| {
        eprintln!("warning: no ASRFORGE_RDZV_TOKEN, TORCHELASTIC_RUN_ID or SLURM_JOB_ID; the rendezvous store's token is derived from MASTER_ADDR:MASTER_PORT, so the store is effectively unauthenticated");
    });
    format!("addr-{addr}:{port}")
}

fn resolve(addr: &str) -> std::io::Result<Vec<SocketAddr>> {
    Ok(addr.to_socket_addrs()?.collect())
}

impl Store {
    /// Connects to the store at `addr` (`host:port`) as `rank`, retrying
    /// until `timeout`, which is also the default timeout of `get`, `wait`
    /// and `barrier`.
    pub fn connect(addr: &str, token: &str, rank: usize, timeout: Duration) -> Result<Store> {
        let start = Instant::now();
        let deadline = start + timeout;
        let mut pause = BACKOFF_START;
        let stream = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt = resolve(addr).and_then(|addrs| {
                let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, format!("{addr} resolves to no address"));
                for a in addrs {
                    match TcpStream::connect_timeout(&a, left.clamp(Duration::from_millis(1), BACKOFF_MAX)) {
                        Ok(s) => return Ok(s),
                        Err(e) => last = e,
                    }
                }
                Err(last)
            });
            match attempt {
                Ok(s) => break s,
                Err(_) if Instant::now() + pause < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(BACKOFF_MAX);
                }
                Err(_) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if !left.is_zero() {
                        std::thread::sleep(left);
                    }
                    return Err(Error::dist(
                        "rendezvous",
                        rank,
                        format!("no rendezvous store at {addr} after {} (MASTER_ADDR/MASTER_PORT; is rank 0 running?)", secs(timeout)),
                    ));
                }
            }
        };
        let io = |e: std::io::Error| Error::dist("rendezvous", rank, format!("store at {addr}: {e}"));
        stream.set_nodelay(true).map_err(io)?;
        let local_ip = stream.local_addr().map_err(io)?.ip();
        stream.set_read_timeout(Some(timeout.max(Duration::from_secs(1)) + REPLY_MARGIN)).map_err(io)?;
        proto::send(&stream, &Writer::new(proto::HELLO).bytes(token.as_bytes()).u64(rank as u64).0).map_err(io)?;
        let refused = || {
            Error::dist(
                "rendezvous",
                rank,
                format!("the store at {addr} refused this process's job token; every worker of a job must share ASRFORGE_RDZV_TOKEN"),
            )
        };
        match proto::recv(&stream) {
            Ok(b) if b.first() == Some(&proto::OK) => {}
            Ok(b) if b.first() == Some(&proto::REFUSED) => return Err(refused()),
            Ok(_) => return Err(Error::dist("rendezvous", rank, format!("{addr} answered the handshake with something that is not a rendezvous store"))),
            Err(e) if super::wire::is_closed(&e) => return Err(refused()),
            Err(e) => return Err(io(e)),
        }
        Ok(Store { addr: addr.to_string(), stream: Mutex::new(stream), token: token.to_string(), rank, timeout, local_ip })
    }

    /// The store's address as given to [`Store::connect`].
    pub fn addr(&self) -> &str {
        &self.addr
    }
    /// The job token this client presented.
    pub fn token(&self) -> &str {
        &self.token
    }
    /// This client's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// The default timeout of `get`, `wait` and `barrier`.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
    /// The local address this process reaches the store from (the interface
    /// peers on other hosts can reach it on).
    pub fn local_ip(&self) -> IpAddr {
        self.local_ip
    }

    /// Sends one request and reads its reply.
    fn call(&self, op: &'static str, body: &[u8], wait: Duration) -> Result<Vec<u8>> {
        let stream = self.stream.lock().unwrap_or_else(|e| e.into_inner());
        let io = |e: std::io::Error| {
            if super::wire::is_closed(&e) {
                Error::dist(op, self.rank, format!("the store at {} closed the connection (did rank 0 exit?)", self.addr))
            } else if super::wire::is_timeout(&e) {
                Error::dist(op, self.rank, format!("the store at {} did not answer within {}", self.addr, secs(wait + REPLY_MARGIN)))
            } else {
                Error::dist(op, self.rank, format!("store at {}: {e}", self.addr))
            }
        };
        stream.set_read_timeout(Some(wait + REPLY_MARGIN)).map_err(io)?;
        proto::send(&stream, body).map_err(io)?;
        let reply = proto::recv(&stream).map_err(io)?;
        if reply.first() == Some(&proto::FAILED) {
            let msg = Reader(&reply[1..]).string().unwrap_or_else(|_| "no reason given".into());
            return Err(Error::dist(op, self.rank, format!("the store at {} failed the request: {msg}", self.addr)));
        }
        Ok(reply)
    }

    fn bad_reply(&self, op: &'static str) -> Error {
        Error::dist(op, self.rank, format!("the store at {} sent a malformed reply", self.addr))
    }

    /// Sets `key` to `value` (replacing any earlier value).
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.call("store set", &Writer::new(proto::SET).bytes(key.as_bytes()).bytes(value).0, Duration::ZERO)?;
        Ok(())
    }

    /// The value of `key`, waiting up to the store's timeout for it to be set.
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.get_timeout(key, self.timeout)
    }

    /// The value of `key`, waiting up to `timeout` for it to be set.
    pub fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let reply = self.call("store get", &Writer::new(proto::GET).bytes(key.as_bytes()).u64(timeout.as_millis() as u64).0, timeout)?;
        let mut r = Reader(&reply);
        match r.u8() {
            Ok(proto::OK) => r.bytes().map(<[u8]>::to_vec).map_err(|_| self.bad_reply("store get")),
            Ok(proto::TIMEOUT) => {
                Err(Error::dist("store get", self.rank, format!("key '{key}' did not appear in the store at {} within {}", self.addr, secs(timeout))))
            }
            _ => Err(self.bad_reply("store get")),
        }
    }

    /// Adds `delta` to the integer at `key` (0 when unset) and returns the
    /// new value; the value is stored as decimal text, as torch's store does.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let reply = self.call("store add", &Writer::new(proto::ADD).bytes(key.as_bytes()).i64(delta).0, Duration::ZERO)?;
        let mut r = Reader(&reply);
        match r.u8() {
            Ok(proto::OK) => r.i64().map_err(|_| self.bad_reply("store add")),
            _ => Err(self.bad_reply("store add")),
        }
    }

    fn keys_request(op: u8, keys: &[&str]) -> Writer {
        let mut w = Writer::new(op).u64(keys.len() as u64);
        for k in keys {
            w = w.bytes(k.as_bytes());
        }
        w
    }

    fn missing(&self, op: &'static str, reply: &[u8]) -> Result<Option<Vec<String>>> {
        let mut r = Reader(reply);
        match r.u8() {
            Ok(proto::OK) => Ok(None),
            Ok(proto::TIMEOUT) => {
                let n = r.u64().map_err(|_| self.bad_reply(op))?;
                (0..n).map(|_| r.string().map_err(|_| self.bad_reply(op))).collect::<Result<Vec<_>>>().map(Some)
            }
            _ => Err(self.bad_reply(op)),
        }
    }

    /// Waits up to the store's timeout until every key exists.
    pub fn wait(&self, keys: &[&str]) -> Result<()> {
        self.wait_timeout(keys, self.timeout)
    }

    /// Waits up to `timeout` until every key exists; the error names the
    /// keys still missing.
    pub fn wait_timeout(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let reply = self.call("store wait", &Self::keys_request(proto::WAIT, keys).u64(timeout.as_millis() as u64).0, timeout)?;
        match self.missing("store wait", &reply)? {
            None => Ok(()),
            Some(m) => {
                Err(Error::dist("store wait", self.rank, format!("keys {} did not appear in the store at {} within {}", quoted(&m), self.addr, secs(timeout))))
            }
        }
    }

    /// Whether every key exists now (no waiting).
    pub fn check(&self, keys: &[&str]) -> Result<bool> {
        let reply = self.call("store check", &Self::keys_request(proto::CHECK, keys).0, Duration::ZERO)?;
        Ok(self.missing("store check", &reply)?.is_none())
    }

    /// Returns once `world_size` processes have entered the barrier `name`
    /// (the same name may be used again: each use is a new generation), or
    /// fails after the store's timeout saying how many arrived.
    pub fn barrier(&self, name: &str, world_size: usize) -> Result<()> {
        if world_size == 0 {
            return Err(Error::invalid("store barrier", "world_size must be at least 1"));
        }
        let w = world_size as i64;
        let n = self.add(&format!("barrier/{name}/arrived"), 1)?;
        let generation = (n - 1) / w;
        let done = format!("barrier/{name}/done/{generation}");
        if n % w == 0 {
            self.set(&done, b"1")?;
        }
        match self.wait_timeout(&[&done], self.timeout) {
            Ok(()) => Ok(()),
            Err(_) => {
                let arrived = self.add(&format!("barrier/{name}/arrived"), 0)? - generation * w;
                Err(Error::dist(
                    "store barrier",
                    self.rank,
                    format!("barrier '{name}': {} of {world_size} processes arrived within {}", arrived.min(w), secs(self.timeout)),
                ))
            }
        }
    }
}

fn quoted(keys: &[String]) -> String {
    keys.iter().map(|k| format!("'{k}'")).collect::<Vec<_>>().join(", ")
}
