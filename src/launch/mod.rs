//! `asrforge launch`: torchrun for asrforge. Starts `--nproc_per_node`
//! workers on this node with torchrun's environment variables (so a worker
//! runs the same under torchrun, SLURM or mpirun), prefixes their output with
//! the rank, stops the whole job when one worker fails, and with
//! `--hostfile` starts the other nodes' launchers over ssh.

pub mod hostfile;
pub mod layout;
pub mod prefix;
pub mod supervise;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};
use hostfile::{forwarded_env, local_names, node_order, parse_hostfile, remote_command, ssh_program};
use layout::{job_token, NodePlan};
use supervise::{supervise, ChildSpec, Role};

/// Arguments of `asrforge launch` (torchrun's names; `_` and `-` both work).
#[derive(clap::Args, Debug, Clone)]
pub struct LaunchArgs {
    /// Workers to start on this node (torchrun's --nproc_per_node; default 1).
    #[arg(long = "nproc_per_node", visible_alias = "nproc-per-node", value_name = "N")]
    pub nproc_per_node: Option<usize>,
    /// Nodes in the job (default 1).
    #[arg(long = "nnodes", value_name = "M")]
    pub nnodes: Option<usize>,
    /// This node's index, 0 <= r < nnodes (default 0).
    #[arg(long = "node_rank", visible_alias = "node-rank", value_name = "R")]
    pub node_rank: Option<usize>,
    /// Host of the rendezvous store (node 0; default 127.0.0.1, or the first host of --hostfile).
    #[arg(long = "master_addr", visible_alias = "master-addr", value_name = "ADDR")]
    pub master_addr: Option<String>,
    /// Port of the rendezvous store.
    #[arg(long = "master_port", visible_alias = "master-port", value_name = "PORT", default_value_t = crate::train::dist::DEFAULT_PORT)]
    pub master_port: u16,
    /// Job id (torchrun's --rdzv_id): TORCHELASTIC_RUN_ID, and the source of the token on several nodes.
    #[arg(long = "rdzv_id", visible_alias = "rdzv-id", value_name = "ID")]
    pub rdzv_id: Option<String>,
    /// DeepSpeed hostfile (`hostname slots=N` per line): start every host's workers, the others over ssh ($ASRFORGE_SSH or ssh).
    #[arg(long = "hostfile", value_name = "FILE")]
    pub hostfile: Option<PathBuf>,
    /// Seconds between SIGTERM and SIGKILL when the job is stopped (default $ASRFORGE_GRACE_PERIOD or 5).
    #[arg(long = "grace_period", visible_alias = "grace-period", value_name = "SECS")]
    pub grace_period: Option<f64>,
    /// Global rank of this node's first worker (set by --hostfile for its nodes; default node_rank * nproc_per_node).
    #[arg(long = "rank_offset", alias = "rank-offset", hide = true)]
    pub rank_offset: Option<usize>,
    /// Workers in the job (set by --hostfile for its nodes; default nnodes * nproc_per_node).
    #[arg(long = "world_size", alias = "world-size", hide = true)]
    pub world_size: Option<usize>,
    /// Stop the job when standard input closes (set by --hostfile for the launchers it starts over ssh).
    #[arg(long = "stop_on_stdin_eof", alias = "stop-on-stdin-eof", hide = true)]
    pub stop_on_stdin_eof: bool,
    /// The worker: an asrforge subcommand (`train --config ...`, run with this binary) or a program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "PROGRAM")]
    pub program: Vec<String>,
}

/// Default seconds between SIGTERM and SIGKILL.
pub const DEFAULT_GRACE_SECS: f64 = 5.0;

fn grace(args: &LaunchArgs) -> Result<Duration> {
    let (secs, key) = match args.grace_period {
        Some(s) => (s, "--grace_period"),
        None => match std::env::var("ASRFORGE_GRACE_PERIOD") {
            Ok(v) => (
                v.trim().parse::<f64>().map_err(|_| Error::config("ASRFORGE_GRACE_PERIOD", format!("expected seconds (a number >= 0), found {v:?}")))?,
                "ASRFORGE_GRACE_PERIOD",
            ),
            Err(_) => (DEFAULT_GRACE_SECS, "--grace_period"),
        },
    };
    Duration::try_from_secs_f64(secs).map_err(|_| Error::config(key, format!("expected seconds (a number >= 0), found {secs}")))
}

/// The program to run and its arguments: this binary when `program[0]` is
/// one of asrforge's `subcommands`, else `program[0]` itself.
fn worker_program(program: &[String], subcommands: &[String]) -> Result<(OsString, Vec<OsString>)> {
    let Some(first) = program.first() else {
        return Err(Error::config("PROGRAM", "expected the worker to run (an asrforge subcommand such as `train`, or a program), found nothing"));
    };
    if subcommands.iter().any(|s| s == first) {
        let exe = std::env::current_exe().map_err(|source| Error::Io { path: "the asrforge executable (current_exe)".into(), source })?;
        Ok((exe.into_os_string(), program.iter().map(OsString::from).collect()))
    } else {
        Ok((OsString::from(first), program[1..].iter().map(OsString::from).collect()))
    }
}

/// The local workers of `plan`.
fn local_workers(plan: &NodePlan, program: &(OsString, Vec<OsString>), omp: bool) -> Vec<ChildSpec> {
    (0..plan.nproc)
        .map(|local_rank| {
            let mut env = plan.worker_env(local_rank);
            if omp {
                env.push(("OMP_NUM_THREADS".into(), "1".into()));
            }
            ChildSpec {
                role: Role::Worker { rank: plan.rank_offset + local_rank, local_rank },
                program: program.0.clone(),
                args: program.1.clone(),
                env,
                stdin_pipe: false,
            }
        })
        .collect()
}

fn summary(plan: &NodePlan) {
    eprintln!(
        "asrforge launch: starting {} workers (ranks {}..{} of {}) on node {}, master {}:{}",
        plan.nproc,
        plan.rank_offset,
        plan.rank_offset + plan.nproc - 1,
        plan.world_size,
        plan.node_rank,
        plan.master_addr,
        plan.master_port
    );
}

/// The plan for this node, and the ssh sessions that start the other nodes
/// of a hostfile.
fn plan_job(args: &LaunchArgs) -> Result<(NodePlan, Vec<ChildSpec>)> {
    let run_id = args.rdzv_id.clone().unwrap_or_else(|| "none".into());
    let env_token = std::env::var("ASRFORGE_RDZV_TOKEN").ok();
    let Some(path) = &args.hostfile else {
        let nnodes = args.nnodes.unwrap_or(1);
        let node_rank = args.node_rank.unwrap_or(0);
        let nproc = args.nproc_per_node.unwrap_or(1);
        let times = |a: usize, b: usize, key: &str| {
            a.checked_mul(b).ok_or_else(|| Error::config(key, format!("expected a job that fits in this machine's integers, found {a} * {nproc} ranks")))
        };
        let plan = NodePlan {
            nnodes,
            node_rank,
            nproc,
            rank_offset: match args.rank_offset {
                Some(r) => r,
                None => times(node_rank, nproc, "--node_rank")?,
            },
            world_size: match args.world_size {
                Some(w) => w,
                None => times(nnodes, nproc, "--nnodes")?,
            },
            master_addr: args.master_addr.clone().unwrap_or_else(|| "127.0.0.1".into()),
            master_port: args.master_port,
            run_id,
            token: String::new(),
        };
        plan.validate()?;
        let token = job_token(env_token, nnodes, false, args.rdzv_id.as_deref())?;
        return Ok((NodePlan { token, ..plan }, Vec::new()));
    };
    for (given, flag) in [(args.nnodes.is_some(), "--nnodes"), (args.node_rank.is_some(), "--node_rank"), (args.nproc_per_node.is_some(), "--nproc_per_node")] {
        if given {
            return Err(Error::config(flag, format!("expected no {flag} with --hostfile (the hostfile gives the hosts and their slots), found both")));
        }
    }
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
    let hosts = node_order(&parse_hostfile(path, &text)?, &local_names());
    let world_size: usize = hosts.iter().map(|h| h.slots).sum();
    let master_addr = args.master_addr.clone().unwrap_or_else(|| hosts[0].name.clone());
    let token = job_token(env_token, hosts.len(), true, args.rdzv_id.as_deref())?;
    let grace = grace(args)?;
    let exe = std::env::current_exe().map_err(|source| Error::Io { path: "the asrforge executable (current_exe)".into(), source })?;
    let exe = exe
        .to_str()
        .ok_or_else(|| Error::config("--hostfile", format!("expected the asrforge executable's path in UTF-8 to pass over ssh, found {exe:?}")))?
        .to_string();
    let cwd = std::env::current_dir().map_err(|source| Error::Io { path: "the current directory".into(), source })?;
    let cwd = cwd
        .to_str()
        .ok_or_else(|| Error::config("--hostfile", format!("expected the current directory in UTF-8 to pass over ssh, found {cwd:?}")))?
        .to_string();
    let ssh = ssh_program(std::env::var("ASRFORGE_SSH").ok());
    let mut remotes = Vec::new();
    let mut offset = hosts[0].slots;
    for (index, host) in hosts.iter().enumerate().skip(1) {
        let mut launch = vec![
            "--nnodes".to_string(),
            hosts.len().to_string(),
            "--node_rank".into(),
            index.to_string(),
            "--nproc_per_node".into(),
            host.slots.to_string(),
            "--master_addr".into(),
            master_addr.clone(),
            "--master_port".into(),
            args.master_port.to_string(),
            "--rank_offset".into(),
            offset.to_string(),
            "--world_size".into(),
            world_size.to_string(),
            "--grace_period".into(),
            grace.as_secs_f64().to_string(),
            "--stop_on_stdin_eof".into(),
        ];
        if let Some(id) = &args.rdzv_id {
            launch.extend(["--rdzv_id".to_string(), id.clone()]);
        }
        let line = remote_command(&cwd, &token, &forwarded_env(std::env::vars()), &exe, &launch, &args.program);
        eprintln!("asrforge launch: starting node {index} on {} over {ssh} (ranks {}..{})", host.name, offset, offset + host.slots - 1);
        let args = vec![OsString::from(&host.name), OsString::from(line)];
        remotes.push(ChildSpec { role: Role::Node { index, host: host.name.clone() }, program: OsString::from(&ssh), args, env: Vec::new(), stdin_pipe: true });
        offset += host.slots;
    }
    let plan = NodePlan {
        nnodes: hosts.len(),
        node_rank: 0,
        nproc: hosts[0].slots,
        rank_offset: 0,
        world_size,
        master_addr,
        master_port: args.master_port,
        run_id,
        token,
    };
    plan.validate()?;
    Ok((plan, remotes))
}

/// Runs `asrforge launch`; `subcommands` are the names of asrforge's
/// subcommands (a worker program so named runs this binary). Returns the
/// launcher's exit status.
pub fn run_launch(args: &LaunchArgs, subcommands: &[String]) -> Result<i32> {
    let grace = grace(args)?;
    let program = worker_program(&args.program, subcommands)?;
    let (plan, remotes) = plan_job(args)?;
    // As torchrun: one OpenMP thread per worker when several share the node.
    let omp = std::env::var_os("OMP_NUM_THREADS").is_none() && plan.nproc > 1;
    if omp {
        eprintln!(
            "asrforge launch: setting OMP_NUM_THREADS=1 for each worker (as torchrun does) to keep the node from being overloaded; set it yourself to tune it"
        );
    }
    summary(&plan);
    let mut children = local_workers(&plan, &program, omp);
    children.extend(remotes);
    supervise(&children, grace, args.stop_on_stdin_eof)
}
