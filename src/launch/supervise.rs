//! Runs the job's children and stops them together: each child (a local
//! worker, or the ssh session of another node) runs in its own process group
//! with its output forwarded under a prefix. When one exits non-zero or is
//! killed, or the launcher itself is told to stop, every group gets SIGTERM,
//! then SIGKILL after the grace period, and every process is reaped.
//!
//! The launcher makes itself the "child subreaper" (Linux), so the children
//! a worker leaves behind become the launcher's when the worker dies: they
//! are reaped here, and a process group counts as empty only when none of
//! its members is left, zombies included.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::prefix::{forward, Sink};
use crate::error::{Error, Result};

/// What a child is to the job.
#[derive(Clone, Debug)]
pub enum Role {
    /// A worker on this node.
    Worker {
        /// Global rank.
        rank: usize,
        /// Rank on this node.
        local_rank: usize,
    },
    /// The ssh session that runs another node's launcher.
    Node {
        /// Node index in the job.
        index: usize,
        /// Its host name.
        host: String,
    },
}

impl Role {
    fn prefix(&self) -> String {
        match self {
            Role::Worker { rank, .. } => format!("[rank{rank}]: "),
            Role::Node { index, .. } => format!("[node{index}]: "),
        }
    }

    fn label(&self, pid: Option<Pid>) -> String {
        let pid = pid.map(|p| format!(", pid {p}")).unwrap_or_default();
        match self {
            Role::Worker { rank, local_rank } => format!("rank {rank} (local rank {local_rank}{pid})"),
            Role::Node { index, host } => format!("node {index} (host {host}{pid})"),
        }
    }
}

/// One child to start.
#[derive(Clone, Debug)]
pub struct ChildSpec {
    /// Who it is.
    pub role: Role,
    /// The program.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Variables added to the launcher's environment.
    pub env: Vec<(String, String)>,
    /// Give it a pipe as standard input that stays open, unwritten, while
    /// this launcher lives (another node's launcher watches it); else /dev/null.
    pub stdin_pipe: bool,
}

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Exit {
    Code(i32),
    Signal(Signal),
}

impl Exit {
    /// The status a shell would report: the code, or 128 + the signal.
    fn status(self) -> i32 {
        match self {
            Exit::Code(c) => c,
            Exit::Signal(s) => 128 + s as i32,
        }
    }

    fn describe(self) -> String {
        match self {
            Exit::Code(c) => format!("exited with status {c}"),
            Exit::Signal(s) => format!("was killed by signal {}", s.as_str()),
        }
    }
}

struct Child {
    role: Role,
    pid: Pid,
    exit: Option<Exit>,
    /// When it was reaped, in reaping order (which child ended first).
    reaped: u64,
}

/// Why the job is being stopped.
enum Stop {
    /// Every worker exited 0; only what they left behind is stopped.
    Done,
    /// A child failed or the launcher was signalled: exit with this status.
    Fail(i32),
}

/// How often the launcher looks at its children.
const TICK: Duration = Duration::from_millis(20);
/// How long to wait for SIGKILLed processes to be reaped, and for output to drain.
const AFTER_KILL: Duration = Duration::from_secs(2);

/// Whether any process is left in group `pgid`.
fn group_alive(pgid: Pid) -> bool {
    killpg(pgid, None).is_ok()
}

fn signal_groups(children: &[Child], sig: Signal) {
    for c in children {
        // ESRCH: the group is already empty.
        let _ = killpg(c.pid, sig);
        if sig == Signal::SIGTERM {
            // A stopped process (SIGSTOP, a debugger's stop) holds SIGTERM
            // pending until it runs again: wake it so it ends now rather
            // than at SIGKILL after the grace period.
            let _ = killpg(c.pid, Signal::SIGCONT);
        }
    }
}

/// Reaps every child that has ended (workers and the orphans this launcher
/// adopted), recording the workers' exits.
fn reap(children: &mut [Child]) {
    static SEQ: AtomicU64 = AtomicU64::new(1);
    loop {
        let (pid, exit) = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => (pid, Exit::Code(code)),
            Ok(WaitStatus::Signaled(pid, sig, _)) => (pid, Exit::Signal(sig)),
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(_) => return,
        };
        if let Some(c) = children.iter_mut().find(|c| c.pid == pid) {
            c.exit = Some(exit);
            c.reaped = SEQ.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Installs the launcher's handlers for SIGINT, SIGTERM and SIGHUP: each
/// stores its number in the returned cell.
fn watch_signals() -> Result<Arc<AtomicUsize>> {
    let got = Arc::new(AtomicUsize::new(0));
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        signal_hook::flag::register_usize(sig as i32, Arc::clone(&got), sig as usize)
            .map_err(|e| Error::Msg(format!("asrforge launch: cannot install a handler for {}: {e}", sig.as_str())))?;
    }
    Ok(got)
}

/// What `watch_signals`' cell holds when standard input closed.
const STDIN_CLOSED: usize = usize::MAX;

/// Starts a thread that reads standard input to its end, then stores
/// `STDIN_CLOSED` in `cell`: a node's launcher started over ssh learns so that
/// the connection (or the launcher that opened it) is gone.
fn watch_stdin(cell: &Arc<AtomicUsize>) -> Result<()> {
    let cell = Arc::clone(cell);
    std::thread::Builder::new()
        .name("stdin watch".into())
        .spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            cell.store(STDIN_CLOSED, Ordering::SeqCst);
        })
        .map(|_| ())
        .map_err(|e| Error::Msg(format!("asrforge launch: cannot start the stdin watch thread: {e}")))
}

/// Spawns one child in its own process group with its output forwarded;
/// its stdin pipe, if asked for, is pushed onto `stdins` to be kept open.
fn spawn(spec: &ChildSpec, done: &mpsc::Sender<()>, readers: &mut usize, stdins: &mut Vec<std::process::ChildStdin>) -> std::io::Result<Pid> {
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .process_group(0)
        .stdin(if spec.stdin_pipe { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    let pid = Pid::from_raw(child.id() as i32);
    stdins.extend(child.stdin.take());
    // The child is reaped by `reap`, never through `std::process::Child`.
    if let Some(out) = child.stdout.take() {
        forward(out, spec.role.prefix(), Sink::Stdout, done.clone())?;
        *readers += 1;
    }
    if let Some(err) = child.stderr.take() {
        forward(err, spec.role.prefix(), Sink::Stderr, done.clone())?;
        *readers += 1;
    }
    Ok(pid)
}

/// Why the running job must stop, said on stderr, as the launcher's exit
/// status: standard input closed, a signal to the launcher, or the first
/// child that failed; `None` while nothing went wrong.
fn cause(children: &[Child], sig: usize) -> Option<i32> {
    if sig == STDIN_CLOSED {
        eprintln!("asrforge launch: standard input closed (the ssh connection or the launcher that started this node is gone); stopping the workers");
        return Some(128 + Signal::SIGHUP as i32);
    }
    if sig != 0 {
        let name = Signal::try_from(sig as i32).map(|s| s.as_str()).unwrap_or("a signal");
        eprintln!("asrforge launch: received {name}; stopping the workers");
        return Some(128 + sig as i32);
    }
    // The cause: a worker killed by a signal before one that exited with an
    // error (survivors of a killed peer fail within milliseconds and are
    // often reaped in the same tick), then the first to end.
    let failed =
        children.iter().filter(|c| matches!(c.exit, Some(e) if e != Exit::Code(0))).min_by_key(|c| (!matches!(c.exit, Some(Exit::Signal(_))), c.reaped))?;
    let exit = failed.exit.unwrap_or(Exit::Code(1));
    eprintln!("asrforge launch: {} {}", failed.role.label(Some(failed.pid)), exit.describe());
    Some(exit.status())
}

/// Starts every child and waits for the job to end; returns the launcher's
/// exit status: 0 when every child exited 0, else the status of the first
/// child that failed (128 + signal for a killed one), or 128 + the signal
/// the launcher was stopped by. With `stop_on_stdin_eof` the end of
/// standard input stops the job as SIGHUP would.
pub fn supervise(specs: &[ChildSpec], grace: Duration, stop_on_stdin_eof: bool) -> Result<i32> {
    let signalled = watch_signals()?;
    if stop_on_stdin_eof {
        watch_stdin(&signalled)?;
    }
    let mut stdins = Vec::new();
    #[cfg(target_os = "linux")]
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let (done_tx, done_rx) = mpsc::channel();
    let mut readers = 0usize;
    let mut children: Vec<Child> = Vec::with_capacity(specs.len());
    let mut stop: Option<(Stop, Instant)> = None;
    for spec in specs {
        match spawn(spec, &done_tx, &mut readers, &mut stdins) {
            Ok(pid) => children.push(Child { role: spec.role.clone(), pid, exit: None, reaped: 0 }),
            Err(e) => {
                eprintln!("asrforge launch: cannot start {}: {}: {e}", spec.role.label(None), spec.program.to_string_lossy());
                let status = match e.kind() {
                    std::io::ErrorKind::NotFound => 127,
                    std::io::ErrorKind::PermissionDenied => 126,
                    _ => 1,
                };
                stop = Some((Stop::Fail(status), Instant::now() + grace));
                signal_groups(&children, Signal::SIGTERM);
                break;
            }
        }
    }
    drop(done_tx);
    let mut killed = false;
    loop {
        reap(&mut children);
        let sig = signalled.swap(0, Ordering::SeqCst);
        match stop.as_ref().map(|s| s.1) {
            None => {
                let status = cause(&children, sig);
                if let Some(status) = status {
                    let left = children.iter().filter(|c| c.exit.is_none()).count();
                    eprintln!("asrforge launch: stopping the {left} running processes of the job: SIGTERM now, SIGKILL after {} s", grace.as_secs_f64());
                    signal_groups(&children, Signal::SIGTERM);
                    stop = Some((Stop::Fail(status), Instant::now() + grace));
                } else if children.iter().all(|c| c.exit.is_some()) {
                    if children.iter().any(|c| group_alive(c.pid)) {
                        eprintln!("asrforge launch: all workers exited 0; stopping the processes they left behind");
                        signal_groups(&children, Signal::SIGTERM);
                    }
                    stop = Some((Stop::Done, Instant::now() + grace));
                }
            }
            Some(deadline) => {
                let all_gone = children.iter().all(|c| c.exit.is_some() && !group_alive(c.pid));
                if all_gone {
                    break;
                }
                let now = Instant::now();
                // A second signal while stopping: no more waiting.
                if !killed && (now >= deadline || (sig != 0 && sig != STDIN_CLOSED)) {
                    for c in children.iter().filter(|c| c.exit.is_none()) {
                        eprintln!("asrforge launch: {} still running; sending SIGKILL", c.role.label(Some(c.pid)));
                    }
                    signal_groups(&children, Signal::SIGKILL);
                    killed = true;
                    let status = match stop.take() {
                        Some((s, _)) => s,
                        None => Stop::Done,
                    };
                    stop = Some((status, now + AFTER_KILL));
                } else if killed && now >= deadline {
                    for c in children.iter().filter(|c| c.exit.is_none()) {
                        eprintln!("asrforge launch: {} did not end after SIGKILL", c.role.label(Some(c.pid)));
                    }
                    break;
                }
            }
        }
        std::thread::sleep(TICK);
    }
    // Output still in the pipes is forwarded before the launcher exits.
    let drain_until = Instant::now() + AFTER_KILL;
    for _ in 0..readers {
        let left = drain_until.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            break;
        }
    }
    drop(stdins);
    Ok(match stop {
        Some((Stop::Fail(status), _)) => status,
        _ => 0,
    })
}
