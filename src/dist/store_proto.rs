//! The rendezvous store's wire protocol: every message is a u32
//! little-endian length followed by that many bytes. A request starts with
//! an opcode byte, a reply with a status byte; strings and values are
//! u32-length-prefixed bytes, numbers are little-endian u64 / i64.
//!
//! The first request on every connection is `HELLO` with the job token and
//! the caller's rank; the server answers `OK` or `REFUSED` (then closes).

use std::io::{self, Read, Write};
use std::net::TcpStream;

/// Opcode: handshake with the job token and rank.
pub(crate) const HELLO: u8 = 0;
/// Opcode: set a key.
pub(crate) const SET: u8 = 1;
/// Opcode: get a key, waiting up to a timeout for it to appear.
pub(crate) const GET: u8 = 2;
/// Opcode: add to an integer key (created at 0) and return the new value.
pub(crate) const ADD: u8 = 3;
/// Opcode: wait up to a timeout until every key exists.
pub(crate) const WAIT: u8 = 4;
/// Opcode: whether every key exists, without waiting.
pub(crate) const CHECK: u8 = 5;

/// Reply status: done (with the op's payload).
pub(crate) const OK: u8 = 0;
/// Reply status: the timeout passed (with the keys still missing).
pub(crate) const TIMEOUT: u8 = 1;
/// Reply status: wrong job token.
pub(crate) const REFUSED: u8 = 2;
/// Reply status: the request could not be served (with a message).
pub(crate) const FAILED: u8 = 3;

/// The largest message either side accepts (a corrupt length is an error,
/// not an allocation of gigabytes).
pub(crate) const MAX_MESSAGE: usize = 256 << 20;

/// Writes one length-prefixed message.
pub(crate) fn send(mut s: &TcpStream, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "store message over 4 GiB"))?;
    let mut msg = Vec::with_capacity(4 + body.len());
    msg.extend_from_slice(&len.to_le_bytes());
    msg.extend_from_slice(body);
    s.write_all(&msg)
}

/// Reads one length-prefixed message.
pub(crate) fn recv(mut s: &TcpStream) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("store message of {len} bytes (at most {MAX_MESSAGE})")));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    Ok(body)
}

/// Builds a message body field by field.
#[derive(Default)]
pub(crate) struct Writer(pub Vec<u8>);

impl Writer {
    /// A body starting with `op`.
    pub fn new(op: u8) -> Self {
        Writer(vec![op])
    }
    /// Appends length-prefixed bytes.
    pub fn bytes(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(&(b.len() as u32).to_le_bytes());
        self.0.extend_from_slice(b);
        self
    }
    /// Appends a u64.
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends an i64.
    pub fn i64(mut self, v: i64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
}

/// Reads a message body field by field; every read checks the length.
pub(crate) struct Reader<'a>(pub &'a [u8]);

fn short() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "store message ends early")
}

impl<'a> Reader<'a> {
    /// The next byte.
    pub fn u8(&mut self) -> io::Result<u8> {
        let (&b, rest) = self.0.split_first().ok_or_else(short)?;
        self.0 = rest;
        Ok(b)
    }
    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(short());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    /// The next 8 bytes as a u64.
    pub fn u64(&mut self) -> io::Result<u64> {
        let mut w = [0u8; 8];
        w.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(w))
    }
    /// The next 8 bytes as an i64.
    pub fn i64(&mut self) -> io::Result<i64> {
        Ok(self.u64()? as i64)
    }
    /// The next length-prefixed bytes.
    pub fn bytes(&mut self) -> io::Result<&'a [u8]> {
        let mut w = [0u8; 4];
        w.copy_from_slice(self.take(4)?);
        let n = u32::from_le_bytes(w) as usize;
        self.take(n)
    }
    /// The next length-prefixed bytes as UTF-8 text.
    pub fn string(&mut self) -> io::Result<String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "store key is not UTF-8"))
    }
}
