//! The rendezvous store: set/get/add/wait/check/barrier across processes, a
//! get that waits for a key set later, a client with the wrong job token
//! refused (and logged) while the server keeps serving, a master that never
//! appears, and timeouts that name what they waited for.

mod dist_common;

use asrforge::dist::{Store, StoreServer};
use dist_common::{free_port, run_ok, worker, Worker};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(20);

fn addr(w: &Worker) -> String {
    format!("{}:{}", w.master_addr, w.master_port)
}

fn ops_body(w: Worker) {
    let server = (w.rank == 0).then(|| StoreServer::start(&addr(&w), &w.token).unwrap());
    let store = Store::connect(&addr(&w), &w.token, w.rank, TIMEOUT).unwrap();
    let r = w.rank;

    store.set(&format!("hello/{r}"), format!("from {r}").as_bytes()).unwrap();
    let keys: Vec<String> = (0..w.world_size).map(|q| format!("hello/{q}")).collect();
    store.wait(&keys.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    for (q, k) in keys.iter().enumerate() {
        assert_eq!(store.get(k).unwrap(), format!("from {q}").into_bytes(), "value of {k}");
    }
    assert!(store.check(&["hello/0", "hello/1"]).unwrap());
    assert!(!store.check(&["hello/0", "never/set"]).unwrap());

    let got = store.add("counter", r as i64 + 1).unwrap();
    println!("ADD {got}");
    store.barrier("after-add", w.world_size).unwrap();
    let total = store.add("counter", 0).unwrap();
    assert_eq!(total, (1..=w.world_size as i64).sum::<i64>(), "counter after every rank added rank + 1");
    assert_eq!(store.get("counter").unwrap(), total.to_string().into_bytes(), "add stores decimal text");

    // A get that waits for a key another rank sets 500 ms later.
    store.barrier("before-late", w.world_size).unwrap();
    if r == 1 {
        std::thread::sleep(Duration::from_millis(500));
        store.set("late", b"finally").unwrap();
    } else {
        let t0 = Instant::now();
        assert_eq!(store.get("late").unwrap(), b"finally");
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(350), "get returned after {waited:?}, before the key was set (~500 ms)");
        println!("WAITED {}", waited.as_millis());
    }

    // The same barrier name twice; the second holds everyone for the last rank.
    store.barrier("twice", w.world_size).unwrap();
    if r == w.world_size - 1 {
        std::thread::sleep(Duration::from_millis(400));
    }
    let t0 = Instant::now();
    store.barrier("twice", w.world_size).unwrap();
    if r != w.world_size - 1 {
        assert!(t0.elapsed() >= Duration::from_millis(300), "rank {r} left the second barrier after {:?}", t0.elapsed());
    }

    store.set(&format!("bye/{r}"), b"").unwrap();
    if server.is_some() {
        let byes: Vec<String> = (0..w.world_size).map(|q| format!("bye/{q}")).collect();
        store.wait(&byes.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
    }
}

#[test]
fn store_ops_across_processes() {
    if let Some(w) = worker() {
        return ops_body(w);
    }
    let rs = run_ok("store_ops_across_processes", 3, &[]);
    let adds: BTreeSet<i64> = rs.iter().map(|r| r.lines_with("ADD ")[0].parse().unwrap()).collect();
    // Each add saw a different running total: 1..=6 reached through three distinct values ending at 6.
    assert_eq!(adds.len(), 3, "two ranks saw the same counter value: {adds:?}");
    assert_eq!(adds.iter().max(), Some(&6));
    assert_eq!(rs.iter().map(|r| r.lines_with("WAITED ").len()).sum::<usize>(), 2);
}

fn token_body(w: Worker) {
    let server = (w.rank == 0).then(|| StoreServer::start(&addr(&w), &w.token).unwrap());
    if w.rank == 1 {
        let err = Store::connect(&addr(&w), "not-this-job", 1, TIMEOUT).unwrap_err().to_string();
        println!("REFUSED {err}");
        let store = Store::connect(&addr(&w), &w.token, 1, TIMEOUT).unwrap();
        store.set("good-client", b"served").unwrap();
        return;
    }
    let store = Store::connect(&addr(&w), &w.token, 0, TIMEOUT).unwrap();
    assert_eq!(store.get("good-client").unwrap(), b"served");
    drop(server);
}

#[test]
fn a_peer_without_the_token_is_refused_and_the_store_keeps_serving() {
    if let Some(w) = worker() {
        return token_body(w);
    }
    let rs = run_ok("a_peer_without_the_token_is_refused_and_the_store_keeps_serving", 2, &[]);
    let refused = &rs[1].lines_with("REFUSED ")[0];
    assert!(
        refused.contains("the store at 127.0.0.1:")
            && refused.contains("refused this process's job token; every worker of a job must share ASRFORGE_RDZV_TOKEN"),
        "client error: {refused}"
    );
    let log = rs[0].stderr();
    let line =
        log.lines().find(|l| l.starts_with("rendezvous store: refused a connection from 127.0.0.1:")).unwrap_or_else(|| panic!("no refusal logged:\n{log}"));
    assert!(line.ends_with(": wrong job token"), "{line}");
    assert_eq!(log.matches("refused a connection").count(), 1, "one refusal expected:\n{log}");
}

#[test]
fn a_master_that_never_appears_is_a_clear_error_after_the_timeout() {
    let port = free_port();
    let t0 = Instant::now();
    let err = Store::connect(&format!("127.0.0.1:{port}"), "t", 1, Duration::from_secs(2)).unwrap_err().to_string();
    let took = t0.elapsed();
    assert_eq!(
        err,
        format!("distributed rendezvous on rank 1: no rendezvous store at 127.0.0.1:{port} after 2 s (MASTER_ADDR/MASTER_PORT; is rank 0 running?)")
    );
    assert!(took >= Duration::from_secs(2) && took < Duration::from_millis(3500), "gave up after {took:?} for a 2 s timeout");
}

#[test]
fn timeouts_name_the_keys_and_the_barrier() {
    let server = StoreServer::start("127.0.0.1:0", "tok").unwrap();
    let a = server.addr().to_string();
    let store = Store::connect(&a, "tok", 3, Duration::from_millis(500)).unwrap();

    let t0 = Instant::now();
    let err = store.get("ckpt/missing").unwrap_err().to_string();
    let took = t0.elapsed();
    assert_eq!(err, format!("distributed store get on rank 3: key 'ckpt/missing' did not appear in the store at {a} within 0.5 s"));
    assert!(took >= Duration::from_millis(500) && took < Duration::from_secs(2), "{took:?}");

    store.set("present", b"x").unwrap();
    let err = store.wait(&["present", "absent"]).unwrap_err().to_string();
    assert!(err.contains("keys 'absent' did not appear") && !err.contains("'present'"), "{err}");

    let err = store.barrier("alone", 2).unwrap_err().to_string();
    assert_eq!(err, "distributed store barrier on rank 3: barrier 'alone': 1 of 2 processes arrived within 0.5 s");
}

#[test]
fn a_stopped_store_is_an_error_not_a_hang() {
    let server = StoreServer::start("127.0.0.1:0", "tok").unwrap();
    let a = server.addr().to_string();
    let store = Store::connect(&a, "tok", 0, Duration::from_secs(5)).unwrap();
    store.set("k", b"v").unwrap();
    server.stop();
    let t0 = Instant::now();
    let err = store.get("k").unwrap_err().to_string();
    assert!(err.contains("closed the connection (did rank 0 exit?)"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(2));
    // Nothing listens any more: a new client gives up after its timeout.
    let err = Store::connect(&a, "tok", 1, Duration::from_millis(300)).unwrap_err().to_string();
    assert!(err.contains("no rendezvous store at"), "{err}");
}

fn token_env_body(w: Worker) {
    use asrforge::dist::rdzv_token_from_env;
    // This worker process runs one test on one thread: changing its
    // environment races with nothing.
    for k in ["ASRFORGE_RDZV_TOKEN", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"] {
        std::env::remove_var(k);
    }
    std::env::set_var("SLURM_JOB_ID", "4242");
    assert_eq!(rdzv_token_from_env(), "4242");
    std::env::set_var("TORCHELASTIC_RUN_ID", "torchrun-id");
    assert_eq!(rdzv_token_from_env(), "torchrun-id", "torchrun's run id comes before SLURM's job id");
    std::env::set_var("ASRFORGE_RDZV_TOKEN", "ours");
    assert_eq!(rdzv_token_from_env(), "ours", "ASRFORGE_RDZV_TOKEN comes first");
    for k in ["ASRFORGE_RDZV_TOKEN", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"] {
        std::env::remove_var(k);
    }
    let derived = rdzv_token_from_env();
    assert_eq!(derived, format!("addr-127.0.0.1:{}", w.master_port));
    assert_eq!(rdzv_token_from_env(), derived, "the derived token is stable");
}

#[test]
fn the_job_token_comes_from_the_launcher_torchrun_slurm_or_the_master_address() {
    if let Some(w) = worker() {
        return token_env_body(w);
    }
    let rs = run_ok("the_job_token_comes_from_the_launcher_torchrun_slurm_or_the_master_address", 1, &[]);
    let err = rs[0].stderr();
    assert_eq!(err.matches("the store is effectively unauthenticated").count(), 1, "one warning for two derived tokens:\n{err}");
}
