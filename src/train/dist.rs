//! Where this process sits in a job: world size, rank and local rank from
//! torchrun's environment variables; a single process when they are unset.

use crate::error::{Error, Result};

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

/// WeNet's `init_distributed`: the job layout from the environment. The
/// communicators are created by the engine; several processes are not yet
/// supported and are refused here.
pub fn init_distributed(args: &super::TrainArgs) -> Result<DistInfo> {
    let info = dist_info_from(&|k| std::env::var(k).ok())?;
    if info.world_size > 1 {
        return Err(Error::config("WORLD_SIZE", format!("distributed training (world size {}, backend {}) is not yet supported; run one process", info.world_size, args.dist_backend)));
    }
    Ok(info)
}
