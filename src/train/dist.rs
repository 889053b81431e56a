//! Where this process sits in a job: world size, rank and local rank from
//! torchrun's environment variables (a single process when they are unset),
//! and the rendezvous and communicators a job of several processes opens.

use crate::dist::{init_process_groups_with, rdzv_token_from_env, Communicator, GroupOptions, JoinGroup, Store, StoreServer};
use crate::error::{Error, Result};
use std::time::Duration;

/// This process's place in the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DistInfo {
    /// Number of processes.
    pub world_size: usize,
    /// This process's global rank.
    pub rank: usize,
    /// This process's rank on its node.
    pub local_rank: usize,
    /// Rendezvous host (`MASTER_ADDR`).
    pub master_addr: String,
    /// Rendezvous port (`MASTER_PORT`).
    pub master_port: u16,
}

impl DistInfo {
    /// A single process.
    pub fn single() -> Self {
        DistInfo { world_size: 1, rank: 0, local_rank: 0, master_addr: "127.0.0.1".into(), master_port: 29500 }
    }

    /// Whether this process logs and writes shared files.
    pub fn is_main(&self) -> bool {
        self.rank == 0
    }
}

fn var<T: std::str::FromStr>(get: &dyn Fn(&str) -> Option<String>, key: &str, default: T) -> Result<T> {
    match get(key) {
        None => Ok(default),
        Some(s) => s.trim().parse().map_err(|_| Error::config(key, format!("environment variable: expected a non-negative integer, found {s:?}"))),
    }
}

/// Reads the job layout from `get` (an environment lookup).
pub fn dist_info_from(get: &dyn Fn(&str) -> Option<String>) -> Result<DistInfo> {
    let d = DistInfo::single();
    let info = DistInfo {
        world_size: var(get, "WORLD_SIZE", 1usize)?,
        rank: var(get, "RANK", 0usize)?,
        local_rank: var(get, "LOCAL_RANK", 0usize)?,
        master_addr: get("MASTER_ADDR").unwrap_or(d.master_addr),
        master_port: var(get, "MASTER_PORT", d.master_port)?,
    };
    if info.world_size == 0 || info.rank >= info.world_size {
        return Err(Error::config("RANK", format!("expected 0 <= RANK < WORLD_SIZE, found RANK {} of WORLD_SIZE {}", info.rank, info.world_size)));
    }
    Ok(info)
}

/// Timeout of the engine's collectives (gradients, cv sums, barriers):
/// PyTorch's default process-group timeout. A dead peer is noticed at once
/// (its connections close); `--timeout` bounds the store, the set-up and the
/// join group, which every rank enters before each batch.
pub const ENGINE_TIMEOUT: Duration = Duration::from_secs(1800);

/// What `init_distributed` opens for a job: its layout and, over several
/// processes, the rendezvous store (hosted by rank 0), the engine's
/// communicator (taken by `wrap_model`) and the join group (taken by the
/// executor).
pub struct Distributed {
    /// This process's place in the job.
    pub info: DistInfo,
    /// The engine's communicator (`--dist_backend`); `None` on one process
    /// and once `wrap_model` has taken it.
    pub comm: Option<Box<dyn Communicator>>,
    /// The join group (`--timeout`); `None` on one process.
    pub join: Option<JoinGroup>,
    /// The connection to the rendezvous store (several processes only).
    pub store: Option<Store>,
    /// The store itself, on rank 0; it lives as long as the job.
    pub server: Option<StoreServer>,
}

impl Distributed {
    /// One process, no networking.
    pub fn single() -> Self {
        Distributed { info: DistInfo::single(), comm: None, join: None, store: None, server: None }
    }
}

/// WeNet's `init_distributed`: the job layout from the environment and,
/// over several processes, the rendezvous (rank 0 hosts the store at
/// `MASTER_ADDR:MASTER_PORT`; every rank connects with the job token), the
/// engine's communicator over `--dist_backend` (gloo: the TCP ring) and the
/// join group. `--timeout` seconds bound the rendezvous, the set-up and
/// every join call; the engine's collectives get [`ENGINE_TIMEOUT`]. One
/// process opens nothing.
pub fn init_distributed(args: &super::TrainArgs) -> Result<Distributed> {
    let info = dist_info_from(&|k| std::env::var(k).ok())?;
    if args.device != "cpu" {
        return Err(Error::config("--device", format!("expected cpu, found {:?} (the trainer runs on the CPU for now)", args.device)));
    }
    if info.world_size == 1 {
        return Ok(Distributed { info, ..Distributed::single() });
    }
    match args.dist_backend.as_str() {
        "gloo" => {}
        "nccl" => return Err(Error::config("--dist_backend", "nccl needs the CUDA backend; use --dist_backend gloo on the CPU")),
        other => return Err(Error::config("--dist_backend", format!("expected gloo or nccl, found {other:?}"))),
    }
    if args.timeout == 0 {
        return Err(Error::config("--timeout", "expected a number of seconds >= 1, found 0"));
    }
    let timeout = Duration::from_secs(args.timeout);
    let opts = GroupOptions { rank0_hosts_store: true, timeout, join_timeout: timeout, local_rank: Some(info.local_rank) };
    let g = init_process_groups_with(info.rank, info.world_size, &info.master_addr, info.master_port, &rdzv_token_from_env(), &opts)?;
    let mut comm = g.comm;
    comm.set_timeout(ENGINE_TIMEOUT);
    Ok(Distributed { info, comm: Some(Box::new(comm)), join: Some(g.join), store: Some(g.store), server: g.server })
}
