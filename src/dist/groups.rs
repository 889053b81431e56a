//! Setting up a job's distributed state in one call: the rendezvous store
//! (hosted by rank 0 unless a launcher hosts it), the engine's TCP
//! communicator and the join group.

use super::join::JoinGroup;
use super::store::Store;
use super::store_server::StoreServer;
use super::tcp::TcpCommunicator;
use crate::error::Result;
use std::time::Duration;

/// The engine's communicator's prefix in the rendezvous store.
pub const DEFAULT_PREFIX: &str = "default";

/// Everything a worker holds for distributed training.
#[derive(Debug)]
pub struct ProcessGroups {
    /// The store server, on the rank that hosts it (keep it alive as long
    /// as any rank may use the store).
    pub server: Option<StoreServer>,
    /// This worker's connection to the store.
    pub store: Store,
    /// The engine's CPU communicator (gradients, parameters).
    pub comm: TcpCommunicator,
    /// The join group, with its own timeout.
    pub join: JoinGroup,
}

/// How [`init_process_groups_with`] sets up.
#[derive(Clone, Debug)]
pub struct GroupOptions {
    /// Whether rank 0 starts the store server (false when the launcher
    /// already hosts it on `MASTER_ADDR:MASTER_PORT`).
    pub rank0_hosts_store: bool,
    /// Timeout of the store connection, set-up and the engine's collectives.
    pub timeout: Duration,
    /// Timeout of the join group (`--timeout`).
    pub join_timeout: Duration,
    /// The local rank shown in the uneven-workload message.
    pub local_rank: Option<usize>,
}

/// Connects `rank` of `world_size` to the store on `master_addr:master_port`
/// (rank 0 hosts it on all interfaces first) and opens the engine's
/// communicator and the join group, both with `timeout`.
pub fn init_process_groups(rank: usize, world_size: usize, master_addr: &str, master_port: u16, token: &str, timeout: Duration) -> Result<ProcessGroups> {
    let opts = GroupOptions { rank0_hosts_store: true, timeout, join_timeout: timeout, local_rank: None };
    init_process_groups_with(rank, world_size, master_addr, master_port, token, &opts)
}

/// [`init_process_groups`] with every choice spelled out.
pub fn init_process_groups_with(
    rank: usize,
    world_size: usize,
    master_addr: &str,
    master_port: u16,
    token: &str,
    opts: &GroupOptions,
) -> Result<ProcessGroups> {
    let server = if rank == 0 && opts.rank0_hosts_store { Some(StoreServer::start(&format!("0.0.0.0:{master_port}"), token)?) } else { None };
    let store = Store::connect(&format!("{master_addr}:{master_port}"), token, rank, opts.timeout)?;
    let comm = TcpCommunicator::new(&store, DEFAULT_PREFIX, rank, world_size, opts.timeout)?;
    let join = JoinGroup::new(&store, rank, world_size, opts.join_timeout)?.with_local_rank(opts.local_rank.unwrap_or(rank));
    Ok(ProcessGroups { server, store, comm, join })
}
