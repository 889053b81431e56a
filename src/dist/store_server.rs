//! The rendezvous store's server: a key-value map behind a TCP listener,
//! one thread per client connection. Hosted by rank 0 (or a launcher) on
//! `MASTER_ADDR:MASTER_PORT`. A connection whose first message does not carry
//! the job token is refused, logged on stderr, and closed.

use super::store_proto::{self as proto, Reader, Writer};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a new connection may take to send its handshake.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a reply may take to write (a client that stops reading cannot
/// hold the server's shutdown forever).
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// The map and the condition clients wait on for keys to appear.
struct Shared {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
    stopping: AtomicBool,
    token: String,
    /// Each client connection and the thread serving it.
    conns: Mutex<Vec<(TcpStream, JoinHandle<()>)>>,
}

impl Shared {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Vec<u8>>> {
        // A poisoned lock means a client thread panicked mid-update; the map
        // itself is still consistent (every update is a single insert).
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running store server; [`StoreServer::stop`] (or drop) shuts it down.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Binds `bind_addr` (`host:port`; port 0 picks a free one) and serves
    /// clients that present `token` on a background thread.
    pub fn start(bind_addr: &str, token: &str) -> Result<StoreServer> {
        let listener = TcpListener::bind(bind_addr)
            .map_err(|e| Error::dist("store server", 0, format!("cannot listen on {bind_addr}: {e} (is another job using MASTER_PORT?)")))?;
        let addr = listener.local_addr().map_err(|e| Error::dist("store server", 0, format!("{bind_addr}: {e}")))?;
        let shared = Arc::new(Shared {
            map: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            stopping: AtomicBool::new(false),
            token: token.to_string(),
            conns: Mutex::new(Vec::new()),
        });
        let sh = shared.clone();
        let accept = std::thread::Builder::new()
            .name("rdzv-store".into())
            .spawn(move || accept_loop(listener, sh))
            .map_err(|e| Error::dist("store server", 0, format!("cannot start the server thread: {e}")))?;
        Ok(StoreServer { addr, shared, accept: Some(accept) })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, ends every client connection (after any reply in
    /// flight) and joins the accept thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.shared.changed.notify_all();
        // Wake the blocking accept with a connection of our own.
        let wake = if self.addr.ip().is_unspecified() { SocketAddr::from(([127, 0, 0, 1], self.addr.port())) } else { self.addr };
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        // Shut only the read side: a reply already being written still
        // reaches its client, and each serving thread ends at its next read.
        // Joining them means a host that exits right after `stop` does not
        // cut a reply short.
        let conns: Vec<_> = self.shared.conns.lock().unwrap_or_else(|e| e.into_inner()).drain(..).collect();
        for (c, _) in &conns {
            let _ = c.shutdown(std::net::Shutdown::Read);
        }
        for (_, h) in conns {
            let _ = h.join();
        }
    }
}

impl std::fmt::Debug for StoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StoreServer({})", self.addr())
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        if self.accept.is_some() {
            self.shutdown();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = conn else { continue };
        let Ok(handle) = stream.try_clone() else { continue };
        let sh = shared.clone();
        if let Ok(t) = std::thread::Builder::new().name("rdzv-client".into()).spawn(move || serve(stream, sh)) {
            let mut conns = shared.conns.lock().unwrap_or_else(|e| e.into_inner());
            conns.retain(|(_, t)| !t.is_finished());
            conns.push((handle, t));
        }
    }
}

/// Serves one client until it disconnects.
fn serve(stream: TcpStream, shared: Arc<Shared>) {
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "an unknown peer".into());
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(REPLY_TIMEOUT));
    let hello = match proto::recv(&stream) {
        Ok(b) => b,
        Err(_) => return,
    };
    let mut r = Reader(&hello);
    let ok = matches!(r.u8(), Ok(proto::HELLO)) && r.bytes().map(|t| t == shared.token.as_bytes()).unwrap_or(false);
    if !ok {
        if !shared.stopping.load(Ordering::SeqCst) {
            eprintln!("rendezvous store: refused a connection from {peer}: wrong job token");
        }
        let _ = proto::send(&stream, &[proto::REFUSED]);
        return;
    }
    if proto::send(&stream, &[proto::OK]).is_err() {
        return;
    }
    let _ = stream.set_read_timeout(None);
    while let Ok(req) = proto::recv(&stream) {
        let reply = handle(&req, &shared).unwrap_or_else(|e| Writer::new(proto::FAILED).bytes(e.to_string().as_bytes()));
        if proto::send(&stream, &reply.0).is_err() {
            return;
        }
    }
}

/// Waits until every key in `keys` exists or the deadline passes; returns
/// the keys still missing.
fn wait_for<'a>(shared: &Shared, keys: &'a [String], deadline: Instant) -> Vec<&'a str> {
    let mut map = shared.map();
    loop {
        let missing: Vec<&str> = keys.iter().filter(|k| !map.contains_key(k.as_str())).map(String::as_str).collect();
        let left = deadline.saturating_duration_since(Instant::now());
        if missing.is_empty() || left.is_zero() || shared.stopping.load(Ordering::SeqCst) {
            return missing;
        }
        map = shared.changed.wait_timeout(map, left).unwrap_or_else(|e| e.into_inner()).0;
    }
}

fn missing_reply(missing: &[&str]) -> Writer {
    let mut w = Writer::new(proto::TIMEOUT).u64(missing.len() as u64);
    for k in missing {
        w = w.bytes(k.as_bytes());
    }
    w
}

fn handle(req: &[u8], shared: &Shared) -> std::io::Result<Writer> {
    let mut r = Reader(req);
    Ok(match r.u8()? {
        proto::SET => {
            let key = r.string()?;
            let value = r.bytes()?.to_vec();
            shared.map().insert(key, value);
            shared.changed.notify_all();
            Writer::new(proto::OK)
        }
        proto::GET => {
            let key = r.string()?;
            let deadline = Instant::now() + Duration::from_millis(r.u64()?);
            let keys = [key];
            let missing = wait_for(shared, &keys, deadline);
            match shared.map().get(&keys[0]) {
                Some(v) if missing.is_empty() => Writer::new(proto::OK).bytes(v),
                _ => missing_reply(&[&keys[0]]),
            }
        }
        proto::ADD => {
            let key = r.string()?;
            let delta = r.i64()?;
            let mut map = shared.map();
            let old = match map.get(&key) {
                None => 0,
                Some(v) => std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok())
                    .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("add: key '{key}' holds a value that is not an integer")))?,
            };
            let new = old.wrapping_add(delta);
            map.insert(key, new.to_string().into_bytes());
            drop(map);
            shared.changed.notify_all();
            Writer::new(proto::OK).i64(new)
        }
        proto::WAIT | proto::CHECK => {
            let waits = req[0] == proto::WAIT;
            let n = r.u64()? as usize;
            let keys = (0..n).map(|_| r.string()).collect::<std::io::Result<Vec<_>>>()?;
            let deadline = if waits { Instant::now() + Duration::from_millis(r.u64()?) } else { Instant::now() };
            let missing = wait_for(shared, &keys, deadline);
            if missing.is_empty() {
                Writer::new(proto::OK)
            } else {
                missing_reply(&missing)
            }
        }
        op => Writer::new(proto::FAILED).bytes(format!("unknown store request #{op}").as_bytes()),
    })
}
