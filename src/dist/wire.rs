//! Framing shared by the TCP communicator's links: a fixed 28-byte header in
//! front of every payload, and reads/writes that keep to one deadline.
//!
//! Header (little-endian): kind u8, op u8, dtype u8, reduce op u8, call
//! sequence number u64, element count of the collective u64, payload length
//! in bytes u64. A `Data` frame carries tensor bytes; an `Abort` frame
//! carries a UTF-8 message saying why the sender gave up, so a peer learns
//! the cause (and the rank at fault) instead of only seeing a closed socket.
//! A `Census` frame (no payload) says "I timed out and am alive".

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Bytes in a frame header.
pub(crate) const HEADER_LEN: usize = 28;
/// A frame carrying tensor bytes.
pub(crate) const KIND_DATA: u8 = 1;
/// A frame saying the sender's collective failed, with the reason.
pub(crate) const KIND_ABORT: u8 = 2;
/// A frame saying the sender timed out and is alive (see `dist::census`).
pub(crate) const KIND_CENSUS: u8 = 3;

/// One frame's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub kind: u8,
    pub op: u8,
    pub dtype: u8,
    pub rop: u8,
    pub seq: u64,
    pub count: u64,
    pub len: u64,
}

impl Header {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = self.kind;
        b[1] = self.op;
        b[2] = self.dtype;
        b[3] = self.rop;
        b[4..12].copy_from_slice(&self.seq.to_le_bytes());
        b[12..20].copy_from_slice(&self.count.to_le_bytes());
        b[20..28].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Parses a header.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Header {
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        Header { kind: b[0], op: b[1], dtype: b[2], rop: b[3], seq: u64_at(4), count: u64_at(12), len: u64_at(20) }
    }
}

/// Time left until `deadline`, or a `TimedOut` error when none is left.
fn remaining(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"))
    } else {
        Ok(left)
    }
}

/// Fills `buf` from `stream`, failing with `TimedOut` at `deadline` and with
/// `UnexpectedEof` when the peer closes the connection.
pub(crate) fn read_full(mut stream: &TcpStream, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    let mut off = 0;
    while off < buf.len() {
        stream.set_read_timeout(Some(remaining(deadline)?))?;
        match stream.read(&mut buf[off..]) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed")),
            Ok(n) => off += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `buf` to `stream`, failing with `TimedOut` at `deadline`.
pub(crate) fn write_full(mut stream: &TcpStream, buf: &[u8], deadline: Instant) -> io::Result<()> {
    let mut off = 0;
    while off < buf.len() {
        stream.set_write_timeout(Some(remaining(deadline)?))?;
        match stream.write(&buf[off..]) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "connection closed")),
            Ok(n) => off += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Whether an I/O error means the deadline passed.
pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

/// Whether an I/O error means the peer closed (or reset) the connection.
pub(crate) fn is_closed(e: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(e.kind(), UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe | WriteZero | NotConnected)
}

/// A duration as people write it in messages: `30 s`, `2.5 s`, `0.25 s`.
pub(crate) fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if (s - s.round()).abs() < 1e-9 {
        format!("{} s", s.round() as u64)
    } else {
        format!("{} s", (s * 1000.0).round() / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = Header { kind: KIND_DATA, op: 3, dtype: 2, rop: 1, seq: 0x0102_0304_0506_0708, count: 1_000_003, len: u64::MAX - 5 };
        assert_eq!(Header::decode(&h.encode()), h);
    }

    #[test]
    fn seconds_print_like_people_write_them() {
        assert_eq!(secs(Duration::from_secs(30)), "30 s");
        assert_eq!(secs(Duration::from_millis(2500)), "2.5 s");
        assert_eq!(secs(Duration::from_millis(250)), "0.25 s");
    }
}
