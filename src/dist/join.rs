//! The join group: a second, separate CPU communicator with its own timeout
//! (`--timeout`, default 30 s), on which every rank says before each batch
//! whether it still has one. When any rank has run out, every rank ends the
//! epoch at that same step — uneven data never hangs or stalls a job — and a
//! rank that stops answering makes the others fail within the timeout,
//! naming it.

use super::comm::Communicator;
use super::store::Store;
use super::tcp::TcpCommunicator;
use crate::error::{Error, Result};
use crate::tensor::{Device, Tensor};
use std::time::Duration;

/// The join group's default timeout (WeNet's `--timeout`).
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(30);
/// The join group's prefix in the rendezvous store.
pub const JOIN_PREFIX: &str = "join";

/// The join group of one training job.
#[derive(Debug)]
pub struct JoinGroup {
    comm: TcpCommunicator,
    local_rank: usize,
}

impl JoinGroup {
    /// Joins the job's join group as `rank` of `world_size`; `timeout`
    /// bounds the set-up and every later call.
    pub fn new(store: &Store, rank: usize, world_size: usize, timeout: Duration) -> Result<JoinGroup> {
        Ok(JoinGroup { comm: TcpCommunicator::new(store, JOIN_PREFIX, rank, world_size, timeout)?, local_rank: rank })
    }

    /// Sets the local rank printed in the uneven-workload message (defaults
    /// to the rank).
    pub fn with_local_rank(mut self, local_rank: usize) -> JoinGroup {
        self.local_rank = local_rank;
        self
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// The number of processes in the group.
    pub fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        self.comm.timeout()
    }

    /// Tells the other ranks why this one gives up (see [`Communicator::abort`]).
    pub fn abort(&mut self, reason: &str) {
        self.comm.abort(reason);
    }

    /// Which ranks have a batch for this step (`has` is this rank's answer);
    /// the same on every rank.
    pub fn who_has_batch(&mut self, has: bool) -> Result<Vec<bool>> {
        let w = self.comm.world_size();
        let mine = Tensor::from_vec(vec![i64::from(has)], vec![1], &Device::Cpu)?;
        let all = Tensor::from_vec(vec![0i64; w], vec![w], &Device::Cpu)?;
        self.comm.all_gather(&mine, &all).map_err(|e| match e {
            Error::Dist { rank, msg, .. } => Error::dist("join", rank, msg),
            e => e,
        })?;
        Ok(all.to_vec::<i64>()?.iter().map(|&f| f != 0).collect())
    }

    /// Whether every rank has a batch for this step (the minimum of every
    /// rank's `has`). When it is false on a rank that still had one, prints
    /// WeNet's uneven-workload message on stderr, naming the ranks that ran
    /// out.
    pub fn all_have_batch(&mut self, has: bool) -> Result<bool> {
        let flags = self.who_has_batch(has)?;
        let all = flags.iter().all(|&f| f);
        if !all && has {
            let out: Vec<String> = flags.iter().enumerate().filter(|(_, &f)| !f).map(|(r, _)| r.to_string()).collect();
            let (rank, w) = (self.comm.rank(), self.comm.world_size());
            eprintln!(
                "Detected uneven workload distribution: rank {rank} still has batches, rank(s) {} ran out\nBreak current worker to manually join all workers, world_size {w}, current rank {rank}, current local_rank {}",
                out.join(", "),
                self.local_rank
            );
        }
        Ok(all)
    }
}
