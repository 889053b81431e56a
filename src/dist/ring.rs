//! The TCP communicator's algorithms, on byte buffers.
//!
//! - Large tensors go around the ring (rank r sends to r + 1 and receives
//!   from r − 1): reduce-scatter in world − 1 steps, then all-gather in
//!   world − 1 steps, so every rank sends and receives 2·(w − 1)/w of the
//!   tensor — bandwidth-optimal. Each step moves its segment in pieces of at
//!   most `chunk_bytes`, a sender thread writing while the caller receives
//!   and reduces, so transfer and reduction overlap.
//! - Small tensors (under `DIRECT_MAX_BYTES`) go directly to every peer and
//!   every rank reduces all of them itself, in rank order.
//! - Broadcast is a pipelined chain from the root around the ring.
//!
//! Determinism: every element is combined in one fixed order that depends
//! only on the sizes (in the ring, segment s starts at rank s + 1 and gathers
//! ranks s + 2, …, s; directly, ranks 0, 1, …), and the ring distributes the
//! finished bits, so every rank ends with identical bits whatever the timing.
//! Sizes need not divide by the world size: segments differ by at most one
//! element, and may be empty.

use super::comm::ReduceOp;
use super::elem::{self, Aligned};
use super::tcp::{op_code, op_name, Fail, TcpCommunicator, DIRECT_MAX_BYTES};
use super::wire::{read_full, write_full, Header, HEADER_LEN, KIND_ABORT, KIND_CENSUS, KIND_DATA};
use crate::tensor::DType;
use std::net::TcpStream;
use std::ops::Range;
use std::time::Instant;

/// Payloads up to this size are written before reading without a sender
/// thread: they fit in the sockets' buffers, so the write cannot block on a
/// peer that is itself writing.
const INLINE_MAX_BYTES: usize = 4 << 10;

/// What every frame of one collective carries, so ranks that disagree find
/// out on the first frame.
#[derive(Clone, Copy)]
struct Call {
    op: u8,
    dtype: DType,
    rop: u8,
    seq: u64,
    count: u64,
    me: usize,
    deadline: Instant,
}

impl Call {
    fn header(&self, len: usize) -> Header {
        Header { kind: KIND_DATA, op: self.op, dtype: elem::dtype_code(self.dtype), rop: self.rop, seq: self.seq, count: self.count, len: len as u64 }
    }

    fn describe(&self, op: u8, dtype: u8, rop: u8, count: u64, seq: u64) -> String {
        let reduce = if rop == 0 { String::new() } else { format!(" ({})", elem::rop_name(rop)) };
        format!("{}{reduce} of {count} {} elements as call #{seq}", op_name(op), elem::dtype_name(dtype))
    }
}

fn io(peer: usize) -> impl Fn(std::io::Error) -> Fail {
    move |err| Fail::Io { peer, err }
}

fn send_frame(s: &TcpStream, peer: usize, call: &Call, payload: &[u8]) -> Result<(), Fail> {
    write_full(s, &call.header(payload.len()).encode(), call.deadline).map_err(io(peer))?;
    write_full(s, payload, call.deadline).map_err(io(peer))
}

/// Reads a frame header from `peer` and checks it belongs to this call;
/// returns the payload length.
fn recv_header(s: &TcpStream, peer: usize, call: &Call) -> Result<usize, Fail> {
    let mut b = [0u8; HEADER_LEN];
    read_full(s, &mut b, call.deadline).map_err(io(peer))?;
    let h = Header::decode(&b);
    if h.kind == KIND_ABORT {
        let mut m = vec![0u8; h.len.min(1 << 16) as usize];
        read_full(s, &mut m, call.deadline).map_err(io(peer))?;
        return Err(Fail::Abort { msg: String::from_utf8_lossy(&m).into_owned() });
    }
    if h.kind == KIND_CENSUS {
        return Err(Fail::Census { from: peer });
    }
    let mine = call.header(0);
    if h.kind != KIND_DATA || (h.op, h.dtype, h.rop, h.count, h.seq) != (mine.op, mine.dtype, mine.rop, mine.count, mine.seq) {
        return Err(Fail::Msg(format!(
            "ranks disagree: rank {peer} called {}, rank {} called {}",
            call.describe(h.op, h.dtype, h.rop, h.count, h.seq),
            call.me,
            call.describe(mine.op, mine.dtype, mine.rop, mine.count, mine.seq)
        )));
    }
    Ok(h.len as usize)
}

/// Receives one frame from `peer` into `buf`, which it must fill exactly.
fn recv_exact(s: &TcpStream, peer: usize, call: &Call, buf: &mut [u8]) -> Result<(), Fail> {
    let len = recv_header(s, peer, call)?;
    if len != buf.len() {
        return Err(Fail::Msg(format!("rank {peer} sent a piece of {len} bytes where rank {} expected {}", call.me, buf.len())));
    }
    read_full(s, buf, call.deadline).map_err(io(peer))
}

/// Byte ranges of the pieces of a `len`-byte segment (one empty piece for
/// an empty segment, so every step exchanges at least one frame).
fn pieces(len: usize, chunk: usize) -> impl Iterator<Item = Range<usize>> {
    let n = len.div_ceil(chunk).max(1);
    (0..n).map(move |i| i * chunk..((i + 1) * chunk).min(len))
}

/// Byte ranges of `parts` segments of `count` elements, as even as possible
/// (the first `count % parts` get one element more).
fn segments(count: usize, parts: usize, elem: usize) -> Vec<Range<usize>> {
    let (q, rem) = (count / parts, count % parts);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let n = q + usize::from(i < rem);
            let r = start * elem..(start + n) * elem;
            start += n;
            r
        })
        .collect()
}

/// Two disjoint ranges of one buffer: the first to read, the second to write.
fn split_pair(buf: &mut [u8], read: Range<usize>, write: Range<usize>) -> (&[u8], &mut [u8]) {
    if read.start >= write.end {
        let (lo, hi) = buf.split_at_mut(read.start);
        (&hi[..read.len()], &mut lo[write])
    } else {
        let (lo, hi) = buf.split_at_mut(write.start);
        (&lo[read], &mut hi[..write.len()])
    }
}

/// The failure to report when both directions of a step failed: an abort
/// from a peer says the most, then what the receiver saw.
fn merge(got: Result<(), Fail>, sent: Result<(), Fail>) -> Result<(), Fail> {
    match (got, sent) {
        (Err(Fail::Abort { msg }), _) | (_, Err(Fail::Abort { msg })) => Err(Fail::Abort { msg }),
        (Err(e), _) | (Ok(()), Err(e)) => Err(e),
        (Ok(()), Ok(())) => Ok(()),
    }
}

type Sender<'s> = std::thread::ScopedJoinHandle<'s, Result<(), Fail>>;

/// Starts a sender thread (an error, not a panic, when the OS refuses one).
fn spawn<'s, 'e>(sc: &'s std::thread::Scope<'s, 'e>, f: impl FnOnce() -> Result<(), Fail> + Send + 's) -> Result<Sender<'s>, Fail> {
    std::thread::Builder::new().name("tcp-send".into()).spawn_scoped(sc, f).map_err(|e| Fail::Msg(format!("cannot start a sender thread: {e}")))
}

/// A sender thread's result.
fn joined(h: Sender<'_>) -> Result<(), Fail> {
    h.join().unwrap_or_else(|_| Err(Fail::Msg("a sender thread panicked".into())))
}

impl TcpCommunicator {
    fn call(&self, op: &str, dtype: DType, rop: Option<ReduceOp>, count: usize, deadline: Instant) -> Call {
        Call { op: op_code(op), dtype, rop: elem::rop_code(rop), seq: self.seq, count: count as u64, me: self.rank, deadline }
    }

    fn next(&self) -> usize {
        (self.rank + 1) % self.world
    }

    fn prev(&self) -> usize {
        (self.rank + self.world - 1) % self.world
    }

    /// One ring step: send `buf[send]` to the next rank while receiving the
    /// previous rank's `recv` segment into `buf[recv]`, reducing it into
    /// what is there when `reduce` is given.
    fn ring_step(
        &self,
        call: &Call,
        buf: &mut [u8],
        send: Range<usize>,
        recv: Range<usize>,
        reduce: Option<ReduceOp>,
        scratch: &mut Aligned,
    ) -> Result<(), Fail> {
        let (next, prev) = (self.next(), self.prev());
        let (to, from) = (self.link(next)?, self.link(prev)?);
        let chunk = self.chunk_bytes;
        let (out, dst) = split_pair(buf, send, recv);
        std::thread::scope(|sc| {
            let sender = spawn(sc, move || -> Result<(), Fail> {
                for p in pieces(out.len(), chunk) {
                    send_frame(to, next, call, &out[p])?;
                }
                Ok(())
            })?;
            let got = (|| -> Result<(), Fail> {
                for p in pieces(dst.len(), chunk) {
                    match reduce {
                        None => recv_exact(from, prev, call, &mut dst[p])?,
                        Some(op) => {
                            let tmp = &mut scratch.bytes_mut()[..p.len()];
                            recv_exact(from, prev, call, tmp)?;
                            elem::reduce_into(call.dtype, op, &mut dst[p], tmp)?;
                        }
                    }
                }
                Ok(())
            })();
            merge(got, joined(sender))
        })
    }

    /// Ring reduce-scatter over `segs`: afterwards rank r holds the full
    /// reduction of segment r.
    fn ring_reduce_scatter(&self, call: &Call, buf: &mut [u8], segs: &[Range<usize>], op: ReduceOp) -> Result<(), Fail> {
        let (w, r) = (self.world, self.rank);
        let mut scratch = Aligned::new(self.chunk_bytes.min(segs.iter().map(|s| s.len()).max().unwrap_or(0)));
        for k in 0..w - 1 {
            let send = segs[(r + 2 * w - 1 - k) % w].clone();
            let recv = segs[(r + 2 * w - 2 - k) % w].clone();
            self.ring_step(call, buf, send, recv, Some(op), &mut scratch)?;
        }
        Ok(())
    }

    /// Ring all-gather over `segs`, starting from rank r holding segment r.
    fn ring_all_gather(&self, call: &Call, buf: &mut [u8], segs: &[Range<usize>]) -> Result<(), Fail> {
        let (w, r) = (self.world, self.rank);
        let mut none = Aligned::new(0);
        for k in 0..w - 1 {
            let send = segs[(r + w - k) % w].clone();
            let recv = segs[(r + 2 * w - k - 1) % w].clone();
            self.ring_step(call, buf, send, recv, None, &mut none)?;
        }
        Ok(())
    }

    /// Sends `sends[j]` to every peer j (`None` for none) while receiving
    /// one frame from every peer j into `recvs[j]`; receives go in rank order.
    fn exchange(&self, call: &Call, sends: &[Option<&[u8]>], recvs: &mut [Option<&mut [u8]>]) -> Result<(), Fail> {
        let links: Vec<Option<&TcpStream>> = (0..self.world).map(|j| if j == self.rank { None } else { self.link(j).ok() }).collect();
        let receive_all = |recvs: &mut [Option<&mut [u8]>]| -> Result<(), Fail> {
            for (j, r) in recvs.iter_mut().enumerate() {
                if let (Some(buf), Some(s)) = (r, links[j]) {
                    recv_exact(s, j, call, buf)?;
                }
            }
            Ok(())
        };
        let targets = || sends.iter().enumerate().filter_map(|(j, d)| Some((j, links[j]?, (*d)?)));
        if sends.iter().flatten().all(|d| d.len() <= INLINE_MAX_BYTES) {
            for (j, s, d) in targets() {
                send_frame(s, j, call, d)?;
            }
            return receive_all(recvs);
        }
        std::thread::scope(|sc| {
            let mut senders = Vec::new();
            let mut result = Ok(());
            for (j, s, d) in targets() {
                match spawn(sc, move || send_frame(s, j, call, d)) {
                    Ok(h) => senders.push(h),
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            if result.is_ok() {
                result = receive_all(recvs);
            }
            for h in senders {
                result = merge(result, joined(h));
            }
            result
        })
    }

    /// Combines every rank's buffer (`theirs[j]`, this rank's is `mine`) in
    /// rank order into `out`.
    fn combine_in_rank_order(&self, dtype: DType, op: ReduceOp, mine: &[u8], theirs: &[Aligned], out: &mut [u8]) -> Result<(), Fail> {
        let get = |j: usize| if j == self.rank { mine } else { theirs[j].bytes() };
        let mut acc = Aligned::new(out.len());
        acc.bytes_mut().copy_from_slice(get(0));
        for j in 1..self.world {
            elem::reduce_into(dtype, op, acc.bytes_mut(), get(j))?;
        }
        if op == ReduceOp::Avg {
            elem::divide(dtype, acc.bytes_mut(), self.world)?;
        }
        out.copy_from_slice(acc.bytes());
        Ok(())
    }

    /// All-reduce of `buf` (`count` elements of `dtype`) in place.
    pub(super) fn all_reduce_bytes(&self, buf: &mut [u8], dtype: DType, count: usize, op: ReduceOp, deadline: Instant) -> Result<(), Fail> {
        let call = self.call("all_reduce", dtype, Some(op), count, deadline);
        let w = self.world;
        if w == 1 {
            return Ok(());
        }
        if buf.len() < DIRECT_MAX_BYTES {
            let mut theirs: Vec<Aligned> = (0..w).map(|j| Aligned::new(if j == self.rank { 0 } else { buf.len() })).collect();
            {
                let sends: Vec<Option<&[u8]>> = (0..w).map(|_| Some(&buf[..])).collect();
                let mut recvs: Vec<Option<&mut [u8]>> = theirs.iter_mut().enumerate().map(|(j, a)| (j != self.rank).then(|| a.bytes_mut())).collect();
                self.exchange(&call, &sends, &mut recvs)?;
            }
            let mine = Aligned::copy_of(buf);
            return self.combine_in_rank_order(dtype, op, mine.bytes(), &theirs, buf);
        }
        let segs = segments(count, w, dtype.size_in_bytes());
        self.ring_reduce_scatter(&call, buf, &segs, op)?;
        if op == ReduceOp::Avg {
            elem::divide(dtype, &mut buf[segs[self.rank].clone()], w)?;
        }
        self.ring_all_gather(&call, buf, &segs)
    }

    /// Writes every rank's `mine` (`n` elements) into `out` at rank order.
    pub(super) fn all_gather_bytes(&self, mine: &[u8], out: &mut [u8], dtype: DType, n: usize, deadline: Instant) -> Result<(), Fail> {
        let call = self.call("all_gather", dtype, None, n, deadline);
        let w = self.world;
        let segs = segments(w * n, w, dtype.size_in_bytes());
        out[segs[self.rank].clone()].copy_from_slice(mine);
        if w == 1 {
            return Ok(());
        }
        if out.len() < DIRECT_MAX_BYTES {
            let sends: Vec<Option<&[u8]>> = (0..w).map(|_| Some(mine)).collect();
            let mut recvs: Vec<Option<&mut [u8]>> = Vec::with_capacity(w);
            let mut rest = out;
            for (j, s) in segs.iter().enumerate() {
                let (head, tail) = rest.split_at_mut(s.len());
                recvs.push((j != self.rank).then_some(head));
                rest = tail;
            }
            return self.exchange(&call, &sends, &mut recvs);
        }
        self.ring_all_gather(&call, out, &segs)
    }

    /// Reduces every rank's `input` (`w * n` elements; used as scratch) and
    /// writes segment r of the result into `out`.
    pub(super) fn reduce_scatter_bytes(&self, input: &mut [u8], out: &mut [u8], dtype: DType, n: usize, op: ReduceOp, deadline: Instant) -> Result<(), Fail> {
        let call = self.call("reduce_scatter", dtype, Some(op), n, deadline);
        let (w, r) = (self.world, self.rank);
        let segs = segments(w * n, w, dtype.size_in_bytes());
        if w == 1 {
            out.copy_from_slice(input);
            if op == ReduceOp::Avg {
                elem::divide(dtype, out, 1)?;
            }
            return Ok(());
        }
        if input.len() < DIRECT_MAX_BYTES {
            let mut theirs: Vec<Aligned> = (0..w).map(|j| Aligned::new(if j == r { 0 } else { out.len() })).collect();
            {
                let sends: Vec<Option<&[u8]>> = segs.iter().map(|s| Some(&input[s.clone()])).collect();
                let mut recvs: Vec<Option<&mut [u8]>> = theirs.iter_mut().enumerate().map(|(j, a)| (j != r).then(|| a.bytes_mut())).collect();
                self.exchange(&call, &sends, &mut recvs)?;
            }
            let mine = Aligned::copy_of(&input[segs[r].clone()]);
            return self.combine_in_rank_order(dtype, op, mine.bytes(), &theirs, out);
        }
        self.ring_reduce_scatter(&call, input, &segs, op)?;
        out.copy_from_slice(&input[segs[r].clone()]);
        if op == ReduceOp::Avg {
            elem::divide(dtype, out, w)?;
        }
        Ok(())
    }

    /// Broadcast of `buf` from `root`: a chain root → root + 1 → … in pieces,
    /// each rank forwarding a piece as soon as it has it.
    pub(super) fn broadcast_bytes(&self, buf: &mut [u8], dtype: DType, count: usize, root: usize, deadline: Instant) -> Result<(), Fail> {
        let call = self.call("broadcast", dtype, None, count, deadline);
        let w = self.world;
        if w == 1 {
            return Ok(());
        }
        let pos = (self.rank + w - root) % w;
        let (next, prev) = (self.next(), self.prev());
        for p in pieces(buf.len(), self.chunk_bytes) {
            if pos > 0 {
                recv_exact(self.link(prev)?, prev, &call, &mut buf[p.clone()])?;
            }
            if pos < w - 1 {
                send_frame(self.link(next)?, next, &call, &buf[p])?;
            }
        }
        Ok(())
    }

    /// A barrier: an empty frame to and from every peer.
    pub(super) fn barrier_frames(&self, deadline: Instant) -> Result<(), Fail> {
        let call = self.call("barrier", DType::U8, None, 0, deadline);
        let empty: &[u8] = &[];
        let sends: Vec<Option<&[u8]>> = (0..self.world).map(|_| Some(empty)).collect();
        let mut bufs: Vec<[u8; 0]> = vec![[]; self.world];
        let mut recvs: Vec<Option<&mut [u8]>> = bufs.iter_mut().map(|b| Some(&mut b[..])).collect();
        self.exchange(&call, &sends, &mut recvs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_the_buffer_evenly() {
        let s = segments(10, 4, 4);
        assert_eq!(s, vec![0..12, 12..24, 24..32, 32..40]);
        let s = segments(2, 4, 8);
        assert_eq!(s, vec![0..8, 8..16, 16..16, 16..16]);
    }

    #[test]
    fn pieces_split_at_the_chunk() {
        assert_eq!(pieces(10, 4).collect::<Vec<_>>(), vec![0..4, 4..8, 8..10]);
        assert_eq!(pieces(0, 4).collect::<Vec<_>>(), vec![0..0]);
    }

    #[test]
    fn split_pair_gives_the_two_ranges() {
        let mut b: Vec<u8> = (0..10).collect();
        let (r, w) = split_pair(&mut b, 6..9, 1..3);
        assert_eq!(r, &[6, 7, 8]);
        assert_eq!(w, &[1, 2]);
        let (r, w) = split_pair(&mut b, 0..2, 2..5);
        assert_eq!(r, &[0, 1]);
        assert_eq!(w, &[2, 3, 4]);
    }
}
