//! Several nodes from a DeepSpeed hostfile: which host is node 0, and the
//! `ssh` command line that starts a node's own launcher on its host.

use std::path::Path;

use crate::error::{Error, Result};

/// One host line: `hostname slots=N`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// The host name as written (what `ssh` is given).
    pub name: String,
    /// Processes to start on it.
    pub slots: usize,
}

/// Parses a DeepSpeed hostfile: one `hostname slots=N` per line, `#` starts
/// a comment, blank lines are skipped, every host at most once.
pub fn parse_hostfile(path: &Path, text: &str) -> Result<Vec<Host>> {
    let p = path.display().to_string();
    let err = |line: usize, msg: String| Error::Parse { path: p.clone(), line, msg };
    let mut hosts: Vec<Host> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, slots] = fields[..] else {
            return Err(err(i + 1, format!("expected `hostname slots=N`, found {line:?}")));
        };
        let n = slots.strip_prefix("slots=").ok_or_else(|| err(i + 1, format!("expected `slots=N` after the host name, found {slots:?}")))?;
        let slots: usize = n.parse().map_err(|_| err(i + 1, format!("expected a positive integer after `slots=`, found {n:?}")))?;
        if slots == 0 {
            return Err(err(i + 1, format!("expected at least one slot on host {name}, found slots=0")));
        }
        if hosts.iter().any(|h| h.name == name) {
            return Err(err(i + 1, format!("expected each host once, found {name} again")));
        }
        hosts.push(Host { name: name.to_string(), slots });
    }
    if hosts.is_empty() {
        return Err(err(0, "expected at least one `hostname slots=N` line, found none".into()));
    }
    Ok(hosts)
}

/// The hosts in node order: the host this launcher runs on (the first line
/// whose name is one of `local_names`) is node 0, or the first line when
/// none matches; the others follow in file order.
pub fn node_order(hosts: &[Host], local_names: &[String]) -> Vec<Host> {
    let local = hosts.iter().position(|h| local_names.iter().any(|n| n == &h.name)).unwrap_or(0);
    let mut order = vec![hosts[local].clone()];
    order.extend(hosts.iter().enumerate().filter(|(i, _)| *i != local).map(|(_, h)| h.clone()));
    order
}

/// The names by which this machine may appear in a hostfile.
pub fn local_names() -> Vec<String> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let h = h.trim().to_string();
        if let Some((short, _)) = h.split_once('.') {
            names.push(short.to_string());
        }
        names.push(h);
    }
    names
}

/// `s` as one word for a POSIX shell: unchanged when it holds only
/// characters no shell treats specially, else in single quotes with each
/// `'` written as `'\''`.
pub fn shell_quote(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The variables a remote node's launcher gets from this one: NCCL's own
/// (`NCCL_SOCKET_IFNAME`, `NCCL_IB_DISABLE`, `NCCL_DEBUG`, ...), which ssh
/// does not carry and every rank of a job must agree on (as DeepSpeed's
/// runner forwards them), sorted by name.
pub fn forwarded_env(vars: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = vars.into_iter().filter(|(k, _)| k.starts_with("NCCL_")).collect();
    v.sort();
    v
}

/// The command line (one shell string) that a remote host runs: change to
/// `cwd`, pass the job token and the forwarded variables `env`, and run
/// `exe launch <launch_args> -- <program>`.
pub fn remote_command(cwd: &str, token: &str, env: &[(String, String)], exe: &str, launch_args: &[String], program: &[String]) -> String {
    let mut words = vec!["cd".to_string(), shell_quote(cwd), "&&".into(), "env".into()];
    words.push(shell_quote(&format!("ASRFORGE_RDZV_TOKEN={token}")));
    words.extend(env.iter().map(|(k, v)| shell_quote(&format!("{k}={v}"))));
    words.push(shell_quote(exe));
    words.push("launch".into());
    words.extend(launch_args.iter().map(|a| shell_quote(a)));
    words.push("--".into());
    words.extend(program.iter().map(|a| shell_quote(a)));
    words.join(" ")
}

/// The ssh program: `ASRFORGE_SSH` when set and not empty (one path,
/// taken whole; options belong in ~/.ssh/config), else `ssh`.
pub fn ssh_program(env: Option<String>) -> String {
    env.filter(|s| !s.is_empty()).unwrap_or_else(|| "ssh".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `sh` makes of the quoted words: each printed on its own line.
    fn through_sh(words: &[&str]) -> Vec<String> {
        let line = format!("printf '%s\\n' {}", words.iter().map(|w| shell_quote(w)).collect::<Vec<_>>().join(" "));
        let out = std::process::Command::new("sh").arg("-c").arg(&line).output().expect("run sh");
        assert!(out.status.success(), "sh failed on {line}");
        String::from_utf8(out.stdout).expect("utf8").lines().map(str::to_string).collect()
    }

    #[test]
    fn quoting_survives_the_shell() {
        let words = ["plain", "with space", "it's", "$HOME", "a\"b", "`id`", "*", "x;y&&z", "back\\slash", "tab\there", "'", "''", "--flag=v"];
        assert_eq!(through_sh(&words), words.iter().map(|w| w.to_string()).collect::<Vec<_>>());
        assert_eq!(shell_quote("abc"), "abc");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn remote_command_runs_in_cwd_with_token_and_args() {
        let dir = std::env::temp_dir().join(format!("asrforge launch 'quote' $test {}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        // Stands in for the remote asrforge: prints where it runs, the token and its arguments.
        let exe = dir.join("print args");
        std::fs::write(&exe, "#!/bin/sh\npwd\necho \"$ASRFORGE_RDZV_TOKEN\"\necho \"$NCCL_SOCKET_IFNAME|$NCCL_DEBUG\"\nprintf '%s|' \"$@\"\n").expect("write");
        std::process::Command::new("chmod").arg("+x").arg(&exe).status().expect("chmod");
        let (d, e) = (dir.to_str().expect("utf8"), exe.to_str().expect("utf8"));
        let env = forwarded_env([("PATH".into(), "/x".into()), ("NCCL_SOCKET_IFNAME".into(), "=eth0 ib'0".into()), ("NCCL_DEBUG".into(), "INFO".into())]);
        assert_eq!(env.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["NCCL_DEBUG", "NCCL_SOCKET_IFNAME"], "only NCCL's variables, sorted");
        let cmd = remote_command(d, "t$k'n", &env, e, &["--nnodes".into(), "2".into()], &["sh".into(), "-c".into(), "echo \"$X\" 'y'".into()]);
        let out = std::process::Command::new("sh").arg("-c").arg(&cmd).output().expect("run sh");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(text, format!("{d}\nt$k'n\n=eth0 ib'0|INFO\nlaunch|--nnodes|2|--|sh|-c|echo \"$X\" 'y'|"), "{cmd}");
    }

    #[test]
    fn hostfile_lines_comments_and_errors() {
        let p = Path::new("hosts");
        let h = parse_hostfile(p, "# cluster\nworker-1 slots=4\n\n  worker-2   slots=2 # half\n").expect("parse");
        assert_eq!(h, vec![Host { name: "worker-1".into(), slots: 4 }, Host { name: "worker-2".into(), slots: 2 }]);
        let e = |t: &str| parse_hostfile(p, t).unwrap_err().to_string();
        assert_eq!(e("a slots=2\nb\n"), "hosts:2: expected `hostname slots=N`, found \"b\"");
        assert_eq!(e("a slots=x\n"), "hosts:1: expected a positive integer after `slots=`, found \"x\"");
        assert_eq!(e("a gpus=2\n"), "hosts:1: expected `slots=N` after the host name, found \"gpus=2\"");
        assert_eq!(e("a slots=0\n"), "hosts:1: expected at least one slot on host a, found slots=0");
        assert_eq!(e("a slots=1\na slots=1\n"), "hosts:2: expected each host once, found a again");
        assert_eq!(e("# only\n"), "hosts:0: expected at least one `hostname slots=N` line, found none");
    }

    #[test]
    fn the_local_host_is_node_zero() {
        let hosts: Vec<Host> = ["a", "b", "c"].iter().map(|n| Host { name: n.to_string(), slots: 1 }).collect();
        let names = |o: Vec<Host>| o.into_iter().map(|h| h.name).collect::<Vec<_>>();
        assert_eq!(names(node_order(&hosts, &["b".into()])), ["b", "a", "c"]);
        assert_eq!(names(node_order(&hosts, &["z".into()])), ["a", "b", "c"]);
        assert_eq!(ssh_program(None), "ssh");
        assert_eq!(ssh_program(Some(String::new())), "ssh");
        assert_eq!(ssh_program(Some("/opt/my ssh".into())), "/opt/my ssh");
    }
}
