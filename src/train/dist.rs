//! Where this process sits in a job: world size, rank, local rank and the
//! rendezvous address, read from the variables of whichever launcher started
//! it — torchrun (and `asrforge launch`), SLURM's `srun`, or Open MPI's
//! `mpirun` — or a single process when none of them is set; and the
//! rendezvous and communicators a job of several processes opens.

use crate::dist::{init_process_groups_with, rdzv_token_from_env, Communicator, GroupOptions, JoinGroup, Store, StoreServer};
use crate::error::{Error, Result};
use std::time::Duration;

/// Which launcher's variables described the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobSource {
    /// No launcher variables: one process.
    Single,
    /// torchrun's `RANK`/`WORLD_SIZE` (also set by `asrforge launch`).
    Torchrun,
    /// SLURM's `SLURM_PROCID`/`SLURM_NTASKS` (`srun`).
    Slurm,
    /// Open MPI's `OMPI_COMM_WORLD_*` (`mpirun`).
    OpenMpi,
}

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
    /// Number of processes on this node.
    pub local_world_size: usize,
    /// This node's index in the job (torchrun's `GROUP_RANK`).
    pub node_rank: usize,
    /// Which launcher's variables gave the layout.
    pub source: JobSource,
}

impl DistInfo {
    /// A single process.
    pub fn single() -> Self {
        DistInfo {
            world_size: 1,
            rank: 0,
            local_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: DEFAULT_PORT,
            local_world_size: 1,
            node_rank: 0,
            source: JobSource::Single,
        }
    }

    /// Whether this process logs and writes shared files.
    pub fn is_main(&self) -> bool {
        self.rank == 0
    }
}

/// torchrun's default rendezvous port.
pub const DEFAULT_PORT: u16 = 29500;

type Get<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The integer in variable `key`, `None` when it is unset.
fn int<T: std::str::FromStr>(get: Get, key: &str) -> Result<Option<T>> {
    match get(key) {
        None => Ok(None),
        Some(s) => s.trim().parse().map(Some).map_err(|_| Error::config(key, format!("environment variable: expected a non-negative integer, found {s:?}"))),
    }
}

fn var<T: std::str::FromStr>(get: Get, key: &str, default: T) -> Result<T> {
    Ok(int(get, key)?.unwrap_or(default))
}

/// The integer in variable `key`, which this layout needs.
fn required<T: std::str::FromStr>(get: Get, key: &str, why: &str) -> Result<T> {
    int(get, key)?.ok_or_else(|| Error::config(key, format!("environment variable: expected a non-negative integer ({why}), found it unset")))
}

fn torchrun(get: Get) -> Result<DistInfo> {
    let world_size = var(get, "WORLD_SIZE", 1usize)?;
    let rank = var(get, "RANK", 0usize)?;
    let local_world_size = var(get, "LOCAL_WORLD_SIZE", world_size)?;
    let node_rank = match int(get, "GROUP_RANK")? {
        Some(n) => n,
        None => rank / local_world_size.max(1),
    };
    Ok(DistInfo {
        world_size,
        rank,
        local_rank: var(get, "LOCAL_RANK", 0usize)?,
        master_addr: get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into()),
        master_port: var(get, "MASTER_PORT", DEFAULT_PORT)?,
        local_world_size,
        node_rank,
        source: JobSource::Torchrun,
    })
}

fn slurm(get: Get) -> Result<DistInfo> {
    let rank: usize = required(get, "SLURM_PROCID", "the task's rank")?;
    let world_size: usize = required(get, "SLURM_NTASKS", "the number of tasks")?;
    let node_rank: usize = var(get, "SLURM_NODEID", 0usize)?;
    let local_world_size = match int::<usize>(get, "SLURM_NTASKS_PER_NODE")? {
        Some(n) => n,
        None => match get("SLURM_TASKS_PER_NODE") {
            Some(s) => tasks_on_node(&s, node_rank).map_err(|m| Error::config("SLURM_TASKS_PER_NODE", format!("{m}, found {s:?}")))?,
            None => world_size,
        },
    };
    let master_addr = match get("MASTER_ADDR") {
        Some(a) => a,
        None => {
            let (key, list) = match get("SLURM_JOB_NODELIST") {
                Some(l) => ("SLURM_JOB_NODELIST", l),
                None => ("SLURM_NODELIST", get("SLURM_NODELIST").ok_or_else(|| {
                    Error::config("SLURM_JOB_NODELIST", "expected the job's node list (or MASTER_ADDR) to find the rendezvous host, found neither SLURM_JOB_NODELIST, SLURM_NODELIST nor MASTER_ADDR set")
                })?),
            };
            first_host(&list).map_err(|m| Error::config(key, format!("{m}, found {list:?}")))?
        }
    };
    Ok(DistInfo {
        world_size,
        rank,
        local_rank: var(get, "SLURM_LOCALID", 0usize)?,
        master_addr,
        master_port: var(get, "MASTER_PORT", DEFAULT_PORT)?,
        local_world_size,
        node_rank,
        source: JobSource::Slurm,
    })
}

fn open_mpi(get: Get) -> Result<DistInfo> {
    let rank: usize = required(get, "OMPI_COMM_WORLD_RANK", "the process's rank")?;
    let world_size: usize = required(get, "OMPI_COMM_WORLD_SIZE", "the number of processes")?;
    let local_world_size = var(get, "OMPI_COMM_WORLD_LOCAL_SIZE", world_size)?;
    let master_addr = get("MASTER_ADDR").ok_or_else(|| {
        Error::config(
            "MASTER_ADDR",
            "expected the rendezvous host (the host of rank 0) when started by Open MPI's mpirun, found it unset; pass it with `mpirun -x MASTER_ADDR=<host>`",
        )
    })?;
    Ok(DistInfo {
        world_size,
        rank,
        local_rank: var(get, "OMPI_COMM_WORLD_LOCAL_RANK", 0usize)?,
        master_addr,
        master_port: var(get, "MASTER_PORT", DEFAULT_PORT)?,
        local_world_size,
        // Open MPI names no node index; with the same number of ranks on
        // every node, mapped by slot, this is it.
        node_rank: rank / local_world_size.max(1),
        source: JobSource::OpenMpi,
    })
}

/// The variables that name this source's rank, world, local rank and local world.
fn names(source: JobSource) -> [&'static str; 4] {
    match source {
        JobSource::Single | JobSource::Torchrun => ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"],
        JobSource::Slurm => ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"],
        JobSource::OpenMpi => ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"],
    }
}

fn check(d: &DistInfo) -> Result<()> {
    let [rank, world, local, local_world] = names(d.source);
    if d.world_size == 0 || d.rank >= d.world_size {
        return Err(Error::config(rank, format!("expected 0 <= {rank} < {world}, found {rank} {} of {world} {}", d.rank, d.world_size)));
    }
    if d.local_world_size == 0 || d.local_world_size > d.world_size {
        return Err(Error::config(local_world, format!("expected 1 <= {local_world} <= {world} ({}), found {}", d.world_size, d.local_world_size)));
    }
    if d.local_rank >= d.local_world_size {
        return Err(Error::config(local, format!("expected 0 <= {local} < {local_world} ({}), found {}", d.local_world_size, d.local_rank)));
    }
    Ok(())
}

/// The first host of a SLURM node list in its compressed form
/// (`gpu[01-03,07],login1` → `gpu01`; `rack[1-2]-n[08-09]` → `rack1-n08`).
pub fn first_host(list: &str) -> std::result::Result<String, String> {
    let list = list.trim();
    let mut host = String::new();
    let mut chars = list.chars();
    while let Some(c) = chars.next() {
        match c {
            ',' => break,
            '[' => {
                let mut inner = String::new();
                loop {
                    match chars.next() {
                        Some(']') => break,
                        Some('[') | None => return Err("expected a node list such as gpu[01-03,07],login1 with every `[` closed by `]`".into()),
                        Some(c) => inner.push(c),
                    }
                }
                let first = inner.split(',').next().unwrap_or("");
                let start = first.split('-').next().unwrap_or("").trim();
                if start.is_empty() || !start.chars().all(|c| c.is_ascii_digit()) {
                    return Err(format!("expected digits and ranges such as [01-03,07] inside brackets, found [{inner}]"));
                }
                host.push_str(start);
            }
            ']' => return Err("expected a node list such as gpu[01-03,07],login1, found a `]` without its `[`".into()),
            c => host.push(c),
        }
    }
    if host.is_empty() {
        return Err("expected a node list such as gpu[01-03,07],login1 with at least one host".into());
    }
    Ok(host)
}

/// Tasks on node `node` from SLURM's `SLURM_TASKS_PER_NODE` (`2(x3),1`: two
/// tasks on each of the first three nodes, one on the fourth).
pub fn tasks_on_node(spec: &str, node: usize) -> std::result::Result<usize, String> {
    let mut seen = 0usize;
    for item in spec.trim().split(',') {
        let bad = || format!("expected counts such as 2(x3),1, found the item {item:?}");
        let (n, reps) = match item.split_once('(') {
            None => (item, "1"),
            Some((n, rest)) => (n, rest.strip_prefix('x').and_then(|r| r.strip_suffix(')')).ok_or_else(bad)?),
        };
        let n: usize = n.trim().parse().map_err(|_| bad())?;
        let reps: usize = reps.trim().parse().map_err(|_| bad())?;
        seen = seen.saturating_add(reps);
        if seen > node {
            return Ok(n);
        }
    }
    Err(format!("expected counts for node {node} (SLURM_NODEID), found counts for {seen} nodes"))
}

/// Reads the job layout from `get` (an environment lookup).
///
/// Precedence: torchrun's `RANK`/`WORLD_SIZE` when either is set; else
/// SLURM when `SLURM_PROCID` and `SLURM_NTASKS` are both set; else Open MPI
/// when `OMPI_COMM_WORLD_RANK` or `OMPI_COMM_WORLD_SIZE` is set; else one process.
pub fn dist_info_from(get: Get) -> Result<DistInfo> {
    let info = if get("RANK").is_some() || get("WORLD_SIZE").is_some() {
        torchrun(get)?
    } else if get("SLURM_PROCID").is_some() && get("SLURM_NTASKS").is_some() {
        slurm(get)?
    } else if get("OMPI_COMM_WORLD_RANK").is_some() || get("OMPI_COMM_WORLD_SIZE").is_some() {
        open_mpi(get)?
    } else {
        let d = DistInfo::single();
        DistInfo { master_addr: get("MASTER_ADDR").unwrap_or(d.master_addr), master_port: var(get, "MASTER_PORT", d.master_port)?, ..d }
    };
    check(&info)?;
    Ok(info)
}

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
/// join group. `--timeout` seconds bound every wait on another rank: the
/// rendezvous, the set-up, every join call and every collective of the
/// engine (DDP buckets, ZeRO reduce-scatter and all-gather, the barrier
/// after a save, the cv sums), so a rank that stops answering fails the job
/// within the timeout (plus the census window), named. One process opens
/// nothing.
pub fn init_distributed(args: &super::TrainArgs) -> Result<Distributed> {
    let info = dist_info_from(&|k| std::env::var(k).ok())?;
    if info.world_size == 1 {
        return Ok(Distributed { info, ..Distributed::single() });
    }
    let nccl = match args.dist_backend.as_str() {
        "gloo" => false,
        "nccl" => {
            nccl_usable(args, &info)?;
            true
        }
        other => return Err(Error::config("--dist_backend", format!("expected gloo or nccl, found {other:?}"))),
    };
    if args.timeout == 0 {
        return Err(Error::config("--timeout", "expected a number of seconds >= 1, found 0"));
    }
    let timeout = Duration::from_secs(args.timeout);
    let opts = GroupOptions { rank0_hosts_store: true, timeout, join_timeout: timeout, local_rank: Some(info.local_rank) };
    let g = init_process_groups_with(info.rank, info.world_size, &info.master_addr, info.master_port, &rdzv_token_from_env(), &opts)?;
    let comm: Box<dyn Communicator> = if nccl { nccl_comm(&g.store, &info, timeout)? } else { Box::new(g.comm) };
    Ok(Distributed { info, comm: Some(comm), join: Some(g.join), store: Some(g.store), server: g.server })
}

/// Why `--dist_backend nccl` cannot run here, as one line: a CPU run, the
/// emulated device, no usable GPU, or no NCCL library.
fn nccl_usable(args: &super::TrainArgs, info: &DistInfo) -> Result<()> {
    const KEY: &str = "--dist_backend";
    if args.device != "cuda" {
        return Err(Error::config(
            KEY,
            format!("nccl moves GPU tensors, but this run trains on the CPU (--device {:?}); use --dist_backend gloo, or --device cuda", args.device),
        ));
    }
    nccl_device_check(info.local_rank).map_err(|m| Error::config(KEY, m))
}

#[cfg(feature = "cuda")]
fn nccl_device_check(local_rank: usize) -> std::result::Result<(), String> {
    let dev = crate::backend::cuda::device(local_rank).map_err(|e| format!("nccl needs a GPU (cuda:{local_rank}, LOCAL_RANK) but none is usable: {e}"))?;
    if dev.is_emulated() {
        return Err("nccl needs a real GPU; the emulated CUDA device (ASRFORGE_CUDA_EMU=1) runs the GPU engines over --dist_backend gloo".into());
    }
    crate::backend::cuda::nccl::version().map(|_| ()).map_err(|e| format!("nccl: {e}"))
}

#[cfg(not(feature = "cuda"))]
fn nccl_device_check(_local_rank: usize) -> std::result::Result<(), String> {
    Err("nccl needs the CUDA backend, and this asrforge was built without the `cuda` feature; use --dist_backend gloo".into())
}

#[cfg(feature = "cuda")]
fn nccl_comm(store: &Store, info: &DistInfo, timeout: Duration) -> Result<Box<dyn Communicator>> {
    let dev = crate::tensor::Device::Cuda(info.local_rank);
    Ok(Box::new(crate::dist::NcclComm::new(store, "nccl", info.rank, info.world_size, &dev, timeout)?))
}

#[cfg(not(feature = "cuda"))]
fn nccl_comm(_store: &Store, info: &DistInfo, _timeout: Duration) -> Result<Box<dyn Communicator>> {
    Err(Error::dist("nccl init", info.rank, "this asrforge was built without the `cuda` feature"))
}
