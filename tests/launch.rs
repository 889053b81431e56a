//! `asrforge launch` with the real binary and small shell-script workers:
//! torchrun's variables, output prefixes, fail-fast (SIGTERM, then SIGKILL
//! after the grace period), the launcher's own SIGTERM, a hostfile over a
//! fake ssh, and the multi-node token error. After every failure no process
//! of the job may be left alive.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_asrforge");

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("asrforge-launch-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create scratch dir");
    d
}

/// Writes an executable shell script.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).expect("write script");
    let ok = Command::new("chmod").arg("+x").arg(&p).status().expect("chmod").success();
    assert!(ok, "chmod +x {}", p.display());
    p
}

fn launch(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(EXE);
    c.arg("launch").args(args).current_dir(dir).env_remove("ASRFORGE_RDZV_TOKEN").env_remove("ASRFORGE_SSH").env_remove("ASRFORGE_GRACE_PERIOD");
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// Waits for `child` at most `limit`; kills it and fails past that.
fn wait_within(child: Child, limit: Duration) -> (Output, Duration) {
    let start = Instant::now();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => (out.expect("wait for the launcher"), start.elapsed()),
        Err(_) => {
            let _ = Command::new("kill").arg("-KILL").arg(pid.to_string()).status();
            panic!("the launcher did not exit within {limit:?}");
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Whether `pid` is a live process (a zombie counts as dead).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        // The state follows the parenthesised command name.
        Ok(stat) => stat.rsplit_once(')').map(|(_, rest)| !rest.trim_start().starts_with('Z')).unwrap_or(false),
    }
}

/// Every pid written into `*.pid` files under `dir`.
fn recorded_pids(dir: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir(dir).expect("read dir").flatten() {
        if e.path().extension().is_some_and(|x| x == "pid") {
            let s = std::fs::read_to_string(e.path()).expect("read pid file");
            pids.extend(s.split_whitespace().map(|p| p.parse::<u32>().expect("pid")));
        }
    }
    pids
}

/// Waits until `n` pid files (each with 2 pids: worker and its child) exist.
fn wait_for_pids(dir: &Path, n: usize) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pids = recorded_pids(dir);
        if pids.len() >= 2 * n {
            return pids;
        }
        assert!(Instant::now() < deadline, "workers did not record their pids: {pids:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Asserts that none of `pids` is alive (allowing a moment for init to reap).
fn assert_none_alive(pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            for p in &left {
                let _ = Command::new("kill").arg("-KILL").arg(p.to_string()).status();
            }
            panic!("processes left behind by the job: {left:?} of {pids:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A worker that records its pid and its child's in `$DIR/rank$RANK.pid`,
/// then runs `tail` (shell code; the child `sleep 1000` runs meanwhile).
fn sleeper(dir: &Path, tail: &str) -> PathBuf {
    let body =
        format!("sleep 1000 &\necho \"$$ $!\" > {}/rank$RANK.tmp\nmv {}/rank$RANK.tmp {}/rank$RANK.pid\n{tail}", dir.display(), dir.display(), dir.display());
    script(dir, "worker.sh", &body)
}

#[test]
fn workers_get_torchruns_variables_and_prefixed_output() {
    let dir = scratch("env");
    let cmd = "echo $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $ASRFORGE_RDZV_TOKEN; echo err$RANK >&2; printf partial$RANK";
    let child = launch(&dir, &["--nproc_per_node", "3", "sh", "-c", cmd]).spawn().expect("spawn launcher");
    let (out, _) = wait_within(child, Duration::from_secs(30));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "status {:?}\n{stderr}", out.status);
    let mut tokens = Vec::new();
    for r in 0..3 {
        let line = stdout.lines().find(|l| l.starts_with(&format!("[rank{r}]: {r} "))).unwrap_or_else(|| panic!("no line of rank {r} in {stdout:?}"));
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(&f[1..7], [r.to_string().as_str(), r.to_string().as_str(), "3", "3", "127.0.0.1", "29500"], "{line}");
        assert_eq!(f.len(), 8, "a token in {line}");
        tokens.push(f[7].to_string());
        assert!(stdout.lines().any(|l| l == format!("[rank{r}]: partial{r}")), "partial last line of rank {r} in {stdout:?}");
        assert!(stderr.lines().any(|l| l == format!("[rank{r}]: err{r}")), "stderr of rank {r} in {stderr:?}");
    }
    assert!(!tokens[0].is_empty() && tokens.iter().all(|t| t == &tokens[0]), "{tokens:?}");
    assert_eq!(stdout.lines().count(), 6, "{stdout}");
    assert!(stderr.contains("asrforge launch: starting 3 workers (ranks 0..2 of 3) on node 0, master 127.0.0.1:29500"), "{stderr}");

    // Node 1 of 2, two workers each: ranks 2 and 3 of 4; the given token and flags with hyphens.
    let child = launch(
        &dir,
        &[
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--nproc_per_node=2",
            "--master_addr",
            "10.0.0.9",
            "--master-port",
            "1234",
            "sh",
            "-c",
            "echo $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT $ASRFORGE_RDZV_TOKEN $TORCHELASTIC_RUN_ID",
        ],
    )
    .env("ASRFORGE_RDZV_TOKEN", "tok42")
    .spawn()
    .expect("spawn launcher");
    let (out, _) = wait_within(child, Duration::from_secs(30));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort();
    assert_eq!(lines, ["[rank2]: 2 0 4 2 1 10.0.0.9 1234 tok42 none", "[rank3]: 3 1 4 2 1 10.0.0.9 1234 tok42 none"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_asrforge_subcommand_runs_this_binary() {
    let dir = scratch("subcommand");
    let child = launch(&dir, &["--nproc_per_node", "2", "compute-cer", "--help"]).spawn().expect("spawn launcher");
    let (out, _) = wait_within(child, Duration::from_secs(30));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for r in 0..2 {
        assert!(stdout.lines().any(|l| l.starts_with(&format!("[rank{r}]: Usage: asrforge compute-cer"))), "{stdout}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_worker_stops_the_job_and_leaves_nothing_behind() {
    let dir = scratch("killed");
    let w = sleeper(&dir, "if [ \"$RANK\" = 1 ]; then sleep 0.5; kill -KILL $$; fi\nsleep 1000");
    let child = launch(&dir, &["--nproc_per_node", "3", "--grace_period", "3"]).arg(&w).spawn().expect("spawn launcher");
    let pids = wait_for_pids(&dir, 3);
    let (out, took) = wait_within(child, Duration::from_secs(20));
    let stderr = text(&out.stderr);
    // sh dies of SIGKILL: 128 + 9, as a shell reports it.
    assert_eq!(out.status.code(), Some(137), "{stderr}");
    assert!(stderr.contains("asrforge launch: rank 1 (local rank 1, pid ") && stderr.contains(") was killed by signal SIGKILL"), "{stderr}");
    // The others stop at SIGTERM, well before the 3 s grace period runs out.
    assert!(took < Duration::from_secs(3), "took {took:?}\n{stderr}");
    assert!(!stderr.contains("sending SIGKILL"), "{stderr}");
    assert_none_alive(&pids);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_failing_worker_gives_its_status() {
    let dir = scratch("status3");
    let w = sleeper(&dir, "if [ \"$RANK\" = 2 ]; then sleep 0.3; exit 3; fi\nsleep 1000");
    let child = launch(&dir, &["--nproc_per_node", "3"]).arg(&w).spawn().expect("spawn launcher");
    let pids = wait_for_pids(&dir, 3);
    let (out, _) = wait_within(child, Duration::from_secs(20));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("asrforge launch: rank 2 (local rank 2, pid ") && stderr.contains(") exited with status 3"), "{stderr}");
    assert_none_alive(&pids);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_worker_ignoring_sigterm_is_killed_after_the_grace_period() {
    let dir = scratch("stubborn");
    let w = sleeper(&dir, "if [ \"$RANK\" = 0 ]; then sleep 0.3; exit 1; fi\ntrap '' TERM\nsleep 1000");
    let child = launch(&dir, &["--nproc_per_node", "2", "--grace_period", "1.5"]).arg(&w).spawn().expect("spawn launcher");
    let pids = wait_for_pids(&dir, 2);
    let (out, took) = wait_within(child, Duration::from_secs(20));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("rank 0 (local rank 0, pid ") && stderr.contains(") exited with status 1"), "{stderr}");
    assert!(stderr.contains("asrforge launch: rank 1 (local rank 1, pid ") && stderr.contains(") still running; sending SIGKILL"), "{stderr}");
    // Timed from when both pids are recorded: rank 0 fails after that, and
    // rank 1 survives SIGTERM for the whole 1.5 s grace period.
    assert!(took >= Duration::from_millis(1500) && took < Duration::from_secs(8), "took {took:?}");
    assert_none_alive(&pids);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_or_sigint_to_the_launcher_stops_every_worker() {
    for (sig, num) in [("TERM", 15), ("INT", 2)] {
        let dir = scratch(&format!("sig{sig}"));
        let w = sleeper(&dir, "sleep 1000");
        let child = launch(&dir, &["--nproc_per_node", "2"]).arg(&w).spawn().expect("spawn launcher");
        let pids = wait_for_pids(&dir, 2);
        let ok = Command::new("kill").arg(format!("-{sig}")).arg(child.id().to_string()).status().expect("kill").success();
        assert!(ok);
        let (out, _) = wait_within(child, Duration::from_secs(20));
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(128 + num), "{stderr}");
        assert!(stderr.contains(&format!("asrforge launch: received SIG{sig}; stopping the workers")), "{stderr}");
        assert_none_alive(&pids);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_hostfile_starts_the_other_node_over_ssh() {
    let dir = scratch("hostfile");
    // Drops the host name and runs the command here, as ssh would there.
    let ssh = script(&dir, "fake ssh", "echo \"$1\" >> \"$(dirname \"$0\")/hosts.log\"\nshift\nexec sh -c \"$1\"");
    std::fs::write(dir.join("hosts"), "# two hosts\nhost-a slots=2\nhost-b slots=2 # the second\n").expect("hostfile");
    let cmd = "echo $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT $ASRFORGE_RDZV_TOKEN";
    let child = launch(&dir, &["--hostfile", "hosts", "--master_addr", "127.0.0.1", "--master_port", "29611", "sh", "-c", cmd])
        .env("ASRFORGE_SSH", &ssh)
        .spawn()
        .expect("spawn launcher");
    let (out, _) = wait_within(child, Duration::from_secs(30));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort();
    assert_eq!(lines.len(), 4, "{stdout}");
    let token = lines[0].rsplit(' ').next().unwrap_or("").to_string();
    assert_eq!(token.len(), 32, "{stdout}");
    let want = [
        format!("[node1]: [rank2]: 2 0 4 2 1 127.0.0.1 29611 {token}"),
        format!("[node1]: [rank3]: 3 1 4 2 1 127.0.0.1 29611 {token}"),
        format!("[rank0]: 0 0 4 2 0 127.0.0.1 29611 {token}"),
        format!("[rank1]: 1 1 4 2 0 127.0.0.1 29611 {token}"),
    ];
    assert_eq!(lines, want);
    assert_eq!(std::fs::read_to_string(dir.join("hosts.log")).expect("ssh log"), "host-b\n");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_failure_on_a_remote_node_stops_the_job() {
    let dir = scratch("remote-fail");
    let ssh = script(&dir, "ssh", "shift\nexec sh -c \"$1\"");
    std::fs::write(dir.join("hosts"), "h0 slots=1\nh1 slots=2\n").expect("hostfile");
    let w = sleeper(&dir, "if [ \"$RANK\" = 2 ]; then sleep 0.3; exit 5; fi\nsleep 1000");
    let child = launch(&dir, &["--hostfile", "hosts", "--master_addr", "127.0.0.1", "--grace_period", "3"])
        .arg(&w)
        .env("ASRFORGE_SSH", &ssh)
        .spawn()
        .expect("spawn launcher");
    let pids = wait_for_pids(&dir, 3);
    let (out, _) = wait_within(child, Duration::from_secs(20));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(stderr.contains("[node1]: asrforge launch: rank 2 (local rank 1, pid ") && stderr.contains(") exited with status 5"), "{stderr}");
    assert!(stderr.contains("asrforge launch: node 1 (host h1, pid ") && stderr.contains(") exited with status 5"), "{stderr}");
    assert_none_alive(&pids);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn several_nodes_without_a_token_is_a_clear_error() {
    let dir = scratch("token");
    let child = launch(&dir, &["--nnodes", "2", "--node_rank", "0", "--nproc_per_node", "1", "true"]).spawn().expect("spawn launcher");
    let (out, _) = wait_within(child, Duration::from_secs(20));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("error: config key `ASRFORGE_RDZV_TOKEN`: a job on 2 nodes needs one rendezvous token on every node"), "{stderr}");
    assert!(stderr.contains("--rdzv_id"), "{stderr}");
    assert!(!stderr.contains("starting"), "no worker starts: {stderr}");
    // With --rdzv_id both nodes derive the same token.
    let tok = |node: &str| {
        let child = launch(&dir, &["--nnodes", "2", "--node_rank", node, "--rdzv_id", "job7", "sh", "-c", "echo $ASRFORGE_RDZV_TOKEN $TORCHELASTIC_RUN_ID"])
            .spawn()
            .expect("spawn");
        let (out, _) = wait_within(child, Duration::from_secs(20));
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout).split(": ").nth(1).unwrap_or("").trim().to_string()
    };
    let (a, b) = (tok("0"), tok("1"));
    assert_eq!(a, b);
    assert!(a.ends_with(" job7") && a.len() == 32 + 5, "{a}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_flags_are_clear_errors() {
    let dir = scratch("flags");
    let run = |args: &[&str]| {
        let child = launch(&dir, args).spawn().expect("spawn");
        let (out, _) = wait_within(child, Duration::from_secs(20));
        (out.status.code(), text(&out.stderr))
    };
    let (code, e) = run(&["--nnodes", "2", "--node_rank", "2", "--rdzv_id", "x", "true"]);
    assert_eq!((code, e.trim()), (Some(1), "error: config key `--node_rank`: expected 0 <= node_rank < nnodes (2), found 2"));
    let (code, e) = run(&["--nproc_per_node", "two", "true"]);
    assert_eq!(code, Some(1));
    assert!(e.contains("invalid value 'two'") && e.contains("--nproc_per_node"), "{e}");
    let (code, e) = run(&["--nproc_per_node", "1", "/nonexistent/worker"]);
    assert_eq!(code, Some(127), "{e}");
    assert!(e.contains("cannot start rank 0 (local rank 0): /nonexistent/worker:"), "{e}");
    std::fs::write(dir.join("bad-hosts"), "h0 slots=2\nh1\n").expect("hostfile");
    let (code, e) = run(&["--hostfile", "bad-hosts", "true"]);
    assert_eq!((code, e.trim()), (Some(1), "error: bad-hosts:2: expected `hostname slots=N`, found \"h1\""));
    let (code, e) = run(&["--hostfile", "bad-hosts", "--nproc_per_node", "2", "true"]);
    assert_eq!(code, Some(1));
    assert!(e.contains("expected no --nproc_per_node with --hostfile"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn processes_left_behind_by_successful_workers_are_stopped() {
    let dir = scratch("leftover");
    let w = sleeper(&dir, "exit 0");
    let child = launch(&dir, &["--nproc_per_node", "2"]).arg(&w).spawn().expect("spawn launcher");
    let (out, _) = wait_within(child, Duration::from_secs(20));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("asrforge launch: all workers exited 0; stopping the processes they left behind"), "{stderr}");
    let pids = recorded_pids(&dir);
    assert_eq!(pids.len(), 4, "{pids:?}");
    assert_none_alive(&pids);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_node_launcher_stops_when_its_stdin_closes() {
    // What a launcher started over ssh by --hostfile does when the
    // connection (or the launcher at the other end) goes away.
    let dir = scratch("stdin");
    let w = sleeper(&dir, "sleep 1000");
    let mut child = launch(&dir, &["--nproc_per_node", "2", "--stop_on_stdin_eof"]).arg(&w).stdin(Stdio::piped()).spawn().expect("spawn launcher");
    let pids = wait_for_pids(&dir, 2);
    drop(child.stdin.take());
    let (out, _) = wait_within(child, Duration::from_secs(20));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + 1), "{stderr}");
    assert!(stderr.contains("asrforge launch: standard input closed"), "{stderr}");
    assert_none_alive(&pids);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn omp_threads_default_to_one_per_worker_as_torchrun_does() {
    let dir = scratch("omp");
    let run = |nproc: &str, omp: Option<&str>| {
        let mut c = launch(&dir, &["--nproc_per_node", nproc, "sh", "-c", "echo omp=${OMP_NUM_THREADS:-unset}"]);
        match omp {
            Some(v) => c.env("OMP_NUM_THREADS", v),
            None => c.env_remove("OMP_NUM_THREADS"),
        };
        let (out, _) = wait_within(c.spawn().expect("spawn"), Duration::from_secs(20));
        assert!(out.status.success(), "{}", text(&out.stderr));
        let mut lines: Vec<String> = text(&out.stdout).lines().map(|l| l.split(": ").nth(1).unwrap_or("").to_string()).collect();
        lines.dedup();
        (lines, text(&out.stderr).contains("setting OMP_NUM_THREADS=1"))
    };
    assert_eq!(run("2", None), (vec!["omp=1".to_string()], true));
    assert_eq!(run("2", Some("4")), (vec!["omp=4".to_string()], false));
    assert_eq!(run("1", None), (vec!["omp=unset".to_string()], false));
    let _ = std::fs::remove_dir_all(&dir);
}
