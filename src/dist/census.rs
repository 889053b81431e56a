//! Who is alive, after a timeout. In the ring, a rank that hangs stalls
//! every rank behind it: all of them time out waiting for their previous
//! rank, and most of those are alive. So a rank that times out (or hears
//! that another one did) sends a census frame to every peer, then listens to
//! every peer for a short window; the ranks it did not hear from are the
//! ones that did not answer. Every live rank runs the same census at about
//! the same time, so they all name the same ranks.

use super::tcp::TcpCommunicator;
use super::wire::{read_full, secs, write_full, Header, HEADER_LEN, KIND_ABORT, KIND_CENSUS, KIND_DATA};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The listening window: long enough for the other live ranks to time out
/// too (they entered the call at about the same time), short next to the
/// timeout.
fn window(timeout: Duration) -> Duration {
    (timeout / 2).clamp(Duration::from_millis(200), Duration::from_secs(2))
}

/// Whether `peer` says it is alive (a census or abort frame) before
/// `deadline`; data frames still queued from the failed call are skipped.
fn hears_from(s: &TcpStream, deadline: Instant) -> bool {
    let mut sink = vec![0u8; 64 << 10];
    loop {
        let mut b = [0u8; HEADER_LEN];
        if read_full(s, &mut b, deadline).is_err() {
            return false;
        }
        let h = Header::decode(&b);
        match h.kind {
            KIND_CENSUS | KIND_ABORT => return true,
            KIND_DATA => {
                let mut left = h.len as usize;
                while left > 0 {
                    let n = left.min(sink.len());
                    if read_full(s, &mut sink[..n], deadline).is_err() {
                        return false;
                    }
                    left -= n;
                }
            }
            _ => return false,
        }
    }
}

impl TcpCommunicator {
    /// Runs the census after this rank timed out waiting for `waited_for`
    /// (`alive`: peers already known to be alive); returns the reason to
    /// report.
    pub(super) fn census(&self, alive: &[usize], waited_for: usize) -> String {
        let h = Header { kind: KIND_CENSUS, op: 0, dtype: 0, rop: 0, seq: self.seq, count: 0, len: 0 }.encode();
        let send_by = Instant::now() + Duration::from_millis(200);
        for (j, p) in self.peers.iter().enumerate() {
            if let Some(s) = p {
                if j != self.rank {
                    let _ = write_full(s, &h, send_by);
                }
            }
        }
        let deadline = Instant::now() + window(self.timeout);
        let heard: Vec<bool> = std::thread::scope(|sc| {
            let handles: Vec<_> = self
                .peers
                .iter()
                .enumerate()
                .map(|(j, p)| {
                    let known = j == self.rank || alive.contains(&j);
                    let s = p.as_ref();
                    std::thread::Builder::new().spawn_scoped(sc, move || known || s.is_some_and(|s| hears_from(s, deadline)))
                })
                .collect();
            // A peer whose listener thread could not start counts as silent.
            handles.into_iter().map(|h| h.ok().and_then(|h| h.join().ok()).unwrap_or(false)).collect()
        });
        let silent: Vec<String> = heard.iter().enumerate().filter(|(_, &h)| !h).map(|(j, _)| j.to_string()).collect();
        let t = secs(self.timeout);
        match silent.len() {
            0 => format!(
                "rank {waited_for} did not answer within {t}, yet every rank is alive: the ranks are probably waiting in different collectives (group '{}')",
                self.prefix
            ),
            1 => format!("rank {} did not answer within {t}", silent[0]),
            _ => format!("ranks {} did not answer within {t}", silent.join(", ")),
        }
    }
}
