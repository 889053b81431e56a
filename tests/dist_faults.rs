//! Faults in the TCP communicator, with real processes: a worker killed
//! (SIGKILL) in the middle of large all-reduces, a worker that exits between
//! collectives, ranks that call different collectives, and a rank that gives
//! up because of another communicator (it tells its peers why). The survivors'
//! next collective fails within the timeout (+ a few seconds), naming the
//! rank at fault, and every later call fails at once.

mod dist_common;

use asrforge::dist::{Communicator, ReduceOp, Store, StoreServer, TcpCommunicator};
use asrforge::{Device, Tensor};
use dist_common::{spawn, worker, Worker};
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(10);
/// How long past the timeout a failure may take to surface.
const SLACK: Duration = Duration::from_secs(3);

fn group(w: &Worker, prefix: &str) -> (Option<StoreServer>, Store, TcpCommunicator) {
    let addr = format!("{}:{}", w.master_addr, w.master_port);
    let server = (w.rank == 0).then(|| StoreServer::start(&addr, &w.token).unwrap());
    let store = Store::connect(&addr, &w.token, w.rank, TIMEOUT).unwrap();
    let comm = TcpCommunicator::new(&store, prefix, w.rank, w.world_size, TIMEOUT).unwrap();
    (server, store, comm)
}

/// Runs `op` until it fails; prints how long the failing call took after
/// the last success, its message, and the message of one more call.
fn until_failure(comm: &mut TcpCommunicator, mut op: impl FnMut(&mut TcpCommunicator) -> asrforge::Result<()>) {
    for _ in 0..100_000 {
        let t0 = Instant::now();
        if let Err(e) = op(comm) {
            println!("FAILED_AFTER_MS {}", t0.elapsed().as_millis());
            println!("ERR {e}");
            let t1 = Instant::now();
            let again = comm.barrier().unwrap_err();
            println!("AGAIN_MS {}", t1.elapsed().as_millis());
            println!("AGAIN {again}");
            return;
        }
    }
    panic!("the collective never failed");
}

fn killed_body(w: Worker) {
    let (_server, _store, mut comm) = group(&w, "kill");
    let t = Tensor::from_vec(vec![1.0f32; 1 << 20], vec![1 << 20], &Device::Cpu).unwrap();
    comm.all_reduce(&t, ReduceOp::Sum).unwrap();
    if w.rank == 2 {
        // SIGKILL this process while it is inside the next all-reduces.
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            let _ = std::process::Command::new("kill").args(["-9", &std::process::id().to_string()]).status();
        });
        loop {
            let _ = comm.all_reduce(&t, ReduceOp::Sum);
        }
    }
    until_failure(&mut comm, |c| c.all_reduce(&t, ReduceOp::Sum));
}

fn ms(r: &dist_common::WorkerResult, key: &str) -> Duration {
    Duration::from_millis(r.lines_with(key)[0].parse().unwrap())
}

#[test]
fn a_killed_worker_fails_the_others_naming_it() {
    if let Some(w) = worker() {
        return killed_body(w);
    }
    let rs = spawn("a_killed_worker_fails_the_others_naming_it", 3, &[], &|_| Vec::new());
    assert_eq!(rs[2].output.status.signal(), Some(9), "rank 2 should have died of SIGKILL: {:?}\n{}", rs[2].output.status, rs[2].stderr());
    for r in &rs[..2] {
        r.assert_ok();
        let err = &r.lines_with("ERR ")[0];
        assert!(err.starts_with(&format!("distributed all_reduce on rank {}: rank 2 closed its connection (did it exit?)", r.rank)), "rank {}: {err}", r.rank);
        assert!(ms(r, "FAILED_AFTER_MS ") < TIMEOUT + SLACK, "rank {} took {:?} to fail", r.rank, ms(r, "FAILED_AFTER_MS "));
        let again = &r.lines_with("AGAIN ")[0];
        assert!(again.contains("unusable after an earlier failure: rank 2 closed its connection"), "rank {}: {again}", r.rank);
        assert!(ms(r, "AGAIN_MS ") < Duration::from_millis(100));
    }
}

fn exits_body(w: Worker) {
    let (_server, _store, mut comm) = group(&w, "exit");
    let t = Tensor::from_vec(vec![w.rank as f64; 7], vec![7], &Device::Cpu).unwrap();
    for _ in 0..3 {
        comm.all_reduce(&t, ReduceOp::Max).unwrap();
    }
    comm.barrier().unwrap();
    if w.rank == 3 {
        std::process::exit(0);
    }
    std::thread::sleep(Duration::from_millis(300));
    until_failure(&mut comm, |c| c.all_reduce(&t, ReduceOp::Sum));
}

#[test]
fn a_worker_that_exits_fails_the_next_small_collective() {
    if let Some(w) = worker() {
        return exits_body(w);
    }
    let rs = spawn("a_worker_that_exits_fails_the_next_small_collective", 4, &[], &|_| Vec::new());
    for r in &rs {
        r.assert_ok();
    }
    for r in &rs[..3] {
        let err = &r.lines_with("ERR ")[0];
        assert!(err.contains("rank 3 closed its connection (did it exit?)"), "rank {}: {err}", r.rank);
        assert!(ms(r, "FAILED_AFTER_MS ") < TIMEOUT + SLACK);
    }
}

fn mismatch_body(w: Worker) {
    let (_server, _store, mut comm) = group(&w, "mismatch");
    let n = 5 + w.rank;
    let t = Tensor::from_vec(vec![1.0f32; n], vec![n], &Device::Cpu).unwrap();
    let err = comm.all_reduce(&t, ReduceOp::Sum).unwrap_err();
    println!("ERR {err}");
}

#[test]
fn ranks_that_call_different_collectives_get_an_error_naming_both() {
    if let Some(w) = worker() {
        return mismatch_body(w);
    }
    let rs = spawn("ranks_that_call_different_collectives_get_an_error_naming_both", 2, &[], &|_| Vec::new());
    for r in &rs {
        r.assert_ok();
        let err = &r.lines_with("ERR ")[0];
        let (me, other) = (r.rank, 1 - r.rank);
        let (mine, theirs) = (5 + me, 5 + other);
        assert!(
            err.contains(&format!("ranks disagree: rank {other} called all_reduce (sum) of {theirs} f32 elements as call #1, rank {me} called all_reduce (sum) of {mine} f32 elements as call #1")),
            "rank {me}: {err}"
        );
    }
}

fn hung_ring_body(w: Worker) {
    let (_server, _store, mut comm) = group(&w, "hung");
    comm.set_timeout(Duration::from_secs(2));
    let n = 1 << 20; // 4 MB: the ring path
    let t = Tensor::from_vec(vec![1.0f32; n], vec![n], &Device::Cpu).unwrap();
    comm.all_reduce(&t, ReduceOp::Sum).unwrap();
    if w.rank == 3 {
        // Alive, sockets open, but never calls the next collective.
        std::thread::sleep(Duration::from_secs(7));
        return;
    }
    let t0 = Instant::now();
    let err = comm.all_reduce(&t, ReduceOp::Sum).unwrap_err();
    println!("MS {}", t0.elapsed().as_millis());
    println!("ERR {err}");
}

#[test]
fn a_hung_worker_in_a_ring_all_reduce_is_named_by_every_other_rank() {
    if let Some(w) = worker() {
        return hung_ring_body(w);
    }
    let rs = spawn("a_hung_worker_in_a_ring_all_reduce_is_named_by_every_other_rank", 4, &[], &|_| Vec::new());
    for r in &rs[..3] {
        r.assert_ok();
        let err = &r.lines_with("ERR ")[0];
        assert!(err.contains("rank 3 did not answer within 2 s"), "rank {}: {err}", r.rank);
        let ms: u64 = r.lines_with("MS ")[0].parse().unwrap();
        assert!((2000..5000).contains(&ms), "rank {} failed after {ms} ms with a 2 s timeout", r.rank);
    }
}

fn absent_body(w: Worker) {
    let addr = format!("{}:{}", w.master_addr, w.master_port);
    let _server = (w.rank == 0).then(|| StoreServer::start(&addr, &w.token).unwrap());
    let store = Store::connect(&addr, &w.token, w.rank, TIMEOUT).unwrap();
    if w.rank == 2 {
        // Reaches the store but never joins the group.
        std::thread::sleep(Duration::from_secs(4));
        return;
    }
    let t0 = Instant::now();
    let err = TcpCommunicator::new(&store, "absent", w.rank, 3, Duration::from_secs(2)).unwrap_err();
    println!("MS {}", t0.elapsed().as_millis());
    println!("ERR {err}");
}

#[test]
fn a_rank_that_never_joins_the_group_is_named_after_the_timeout() {
    if let Some(w) = worker() {
        return absent_body(w);
    }
    let rs = spawn("a_rank_that_never_joins_the_group_is_named_after_the_timeout", 3, &[], &|_| Vec::new());
    for r in &rs[..2] {
        r.assert_ok();
        let err = &r.lines_with("ERR ")[0];
        assert_eq!(err, &format!("distributed tcp communicator set-up on rank {}: rank(s) 2 did not connect within 2 s", r.rank));
        let ms: u64 = r.lines_with("MS ")[0].parse().unwrap();
        assert!((2000..4000).contains(&ms), "rank {} gave up after {ms} ms", r.rank);
    }
}

fn abort_body(w: Worker) {
    let (_server, store, mut join) = group(&w, "join-like");
    let mut engine = TcpCommunicator::new(&store, "engine-like", w.rank, w.world_size, TIMEOUT).unwrap();
    join.barrier().unwrap();
    let t = Tensor::from_vec(vec![1.0f32; 4096], vec![4096], &Device::Cpu).unwrap();
    if w.rank == 0 {
        // This rank failed outside `engine` (as a join that rank 1 completed
        // and rank 0 did not) while rank 1's part of the all-reduce already
        // sits unread in this rank's socket: it tells rank 1 why, and closes.
        std::thread::sleep(Duration::from_millis(300));
        engine.abort("rank 0 stopped: distributed join on rank 0: rank 2 closed its connection (did it exit?)");
        return;
    }
    let t0 = Instant::now();
    let err = engine.all_reduce(&t, ReduceOp::Sum).unwrap_err();
    println!("MS {}", t0.elapsed().as_millis());
    println!("ERR {err}");
}

#[test]
fn a_rank_that_gives_up_elsewhere_tells_its_peers_why_on_another_communicator() {
    if let Some(w) = worker() {
        return abort_body(w);
    }
    let rs = spawn("a_rank_that_gives_up_elsewhere_tells_its_peers_why_on_another_communicator", 2, &[], &|_| Vec::new());
    rs.iter().for_each(|r| r.assert_ok());
    let err = &rs[1].lines_with("ERR ")[0];
    assert!(
        err.contains("rank 0 stopped: distributed join on rank 0: rank 2 closed its connection"),
        "rank 1 names the cause, not rank 0's closed connection: {err}"
    );
    let ms: u64 = rs[1].lines_with("MS ")[0].parse().unwrap();
    assert!(ms < 3000, "rank 1 failed {ms} ms after entering the all-reduce, not at once when told");
}
