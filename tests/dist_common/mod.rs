//! Multi-process tests on loopback: a test re-executes its own test binary
//! once per rank, filtered to itself, with the rank in the environment. The
//! test function starts with `if let Some(w) = worker() { ...; return; }`
//! (the worker's body) and otherwise is the parent that spawns and checks.
//!
//! The parent picks a free port for the rendezvous store and passes the
//! torchrun variables (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`,
//! `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`) and a job token.
#![allow(dead_code)]

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The environment a worker of a multi-process test sees.
#[derive(Clone, Debug)]
pub struct Worker {
    pub rank: usize,
    pub world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    pub token: String,
}

const MARK: &str = "ASRFORGE_TEST_WORKER";

/// `Some` inside a worker process spawned by [`spawn`].
pub fn worker() -> Option<Worker> {
    std::env::var(MARK).ok()?;
    let get = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("worker without {k}"));
    Some(Worker {
        rank: get("RANK").parse().expect("RANK"),
        world_size: get("WORLD_SIZE").parse().expect("WORLD_SIZE"),
        master_addr: get("MASTER_ADDR"),
        master_port: get("MASTER_PORT").parse().expect("MASTER_PORT"),
        token: get("ASRFORGE_RDZV_TOKEN"),
    })
}

/// A port that was free a moment ago, never the same one twice in this
/// process (tests of one binary run in parallel), and below the kernel's
/// ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`): between the
/// parent's check and rank 0's listen, a port the kernel may hand to any
/// bind(0) could be taken by a communicator of a concurrent test's workers
/// (seen: "Address already in use" on a MASTER_PORT from bind(0)). Where the
/// range leaves too little room below it, a bind(0) port as before.
pub fn free_port() -> u16 {
    static ISSUED: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut issued = ISSUED.lock().unwrap_or_else(|e| e.into_inner());
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse::<u16>().ok()))
        .unwrap_or(32768);
    const FIRST: u16 = 10000;
    if low > FIRST + 1000 {
        let span = (low - FIRST) as u32;
        // Start at a place that differs between processes, then walk.
        let start = (std::process::id().wrapping_mul(2654435761)
            ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos()))
            % span;
        for i in 0..span {
            let port = FIRST + ((start + i) % span) as u16;
            if !issued.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                issued.push(port);
                return port;
            }
        }
    }
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = l.local_addr().expect("local_addr").port();
        if !issued.contains(&port) {
            issued.push(port);
            return port;
        }
    }
}

/// What one worker did.
#[derive(Debug)]
pub struct WorkerResult {
    pub rank: usize,
    pub output: Output,
    pub elapsed: Duration,
}

impl WorkerResult {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }
    /// Panics with both streams unless the worker exited 0.
    pub fn assert_ok(&self) {
        assert!(self.output.status.success(), "rank {} failed ({:?})\nstdout:\n{}\nstderr:\n{}", self.rank, self.output.status, self.stdout(), self.stderr());
    }
    /// The lines of stdout that start with `prefix`, with the prefix removed
    /// (the worker's first line follows libtest's `test NAME ... ` on the
    /// same line; that banner is skipped).
    pub fn lines_with(&self, prefix: &str) -> Vec<String> {
        self.stdout()
            .lines()
            .map(|l| match l.split_once(" ... ") {
                Some((head, rest)) if head.starts_with("test ") => rest,
                _ => l,
            })
            .filter_map(|l| l.strip_prefix(prefix).map(str::to_string))
            .collect()
    }
}

/// Runs the test `test_name` (its full path, e.g. `"all_reduce_matches"`)
/// in `world_size` worker processes and waits for all of them. `extra`
/// adds environment variables for every rank; `per_rank` for one rank.
pub fn spawn(test_name: &str, world_size: usize, extra: &[(&str, String)], per_rank: &dyn Fn(usize) -> Vec<(String, String)>) -> Vec<WorkerResult> {
    let start = Instant::now();
    let children = start_workers(test_name, world_size, extra, per_rank);
    children
        .into_iter()
        .map(|(rank, child)| {
            let output = child.wait_with_output().expect("wait worker");
            WorkerResult { rank, output, elapsed: start.elapsed() }
        })
        .collect()
}

/// Starts the workers of [`spawn`] without waiting for them (a test that
/// kills one of them mid-run); stdout and stderr are piped.
pub fn start_workers(
    test_name: &str,
    world_size: usize,
    extra: &[(&str, String)],
    per_rank: &dyn Fn(usize) -> Vec<(String, String)>,
) -> Vec<(usize, std::process::Child)> {
    let exe = std::env::current_exe().expect("current_exe");
    let port = free_port();
    let token = format!("test-token-{}-{port}", std::process::id());
    (0..world_size)
        .map(|rank| {
            let mut c = Command::new(&exe);
            c.args([test_name, "--exact", "--nocapture", "--test-threads=1"])
                .env(MARK, "1")
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", world_size.to_string())
                .env("LOCAL_WORLD_SIZE", world_size.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("ASRFORGE_RDZV_TOKEN", &token)
                .env("RUST_BACKTRACE", "1")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in extra {
                c.env(k, v);
            }
            for (k, v) in per_rank(rank) {
                c.env(k, v);
            }
            (rank, c.spawn().expect("spawn worker"))
        })
        .collect()
}

/// [`spawn`] without per-rank variables, asserting every worker succeeded.
/// A failure shows every failed rank's streams, exit status and time (a
/// rank that waited for a peer names it, and the peer's own output says
/// why it did not come).
pub fn run_ok(test_name: &str, world_size: usize, extra: &[(&str, String)]) -> Vec<WorkerResult> {
    let rs = spawn(test_name, world_size, extra, &|_| Vec::new());
    let failed: Vec<String> = rs
        .iter()
        .filter(|r| !r.output.status.success())
        .map(|r| {
            format!("rank {} failed ({:?}) after {:.1} s\nstdout:\n{}\nstderr:\n{}", r.rank, r.output.status, r.elapsed.as_secs_f64(), r.stdout(), r.stderr())
        })
        .collect();
    assert!(failed.is_empty(), "{} of {world_size} ranks failed\n{}", failed.len(), failed.join("\n"));
    rs
}

/// The pids of `launcher`'s children, by their `RANK` (an `asrforge launch`'s workers).
pub fn workers_of(launcher: u32) -> Vec<(usize, u32)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)).and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(launcher) {
            continue;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let rank = env.split(|b| *b == 0).find_map(|kv| std::str::from_utf8(kv).ok()?.strip_prefix("RANK=")?.parse().ok());
        if let Some(r) = rank {
            out.push((r, pid));
        }
    }
    out.sort();
    out
}

/// Whether process `pid` still runs (a zombie counts as gone).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
}
