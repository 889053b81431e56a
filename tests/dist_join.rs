//! The join group with real processes: uneven epochs end on every rank in
//! the same step, quickly, with WeNet's message from the ranks that still
//! had data; the next epoch runs; a rank that stops answering fails the
//! others within the join timeout, naming it.

mod dist_common;

use asrforge::dist::{init_process_groups_with, Communicator, GroupOptions};
use dist_common::{run_ok, worker, Worker};
use std::time::{Duration, Instant};

fn groups(w: &Worker, join_timeout: Duration) -> asrforge::dist::ProcessGroups {
    let opts = GroupOptions { rank0_hosts_store: true, timeout: Duration::from_secs(20), join_timeout, local_rank: Some(w.rank + 10) };
    init_process_groups_with(w.rank, w.world_size, &w.master_addr, w.master_port, &w.token, &opts).unwrap()
}

fn uneven_body(w: Worker) {
    let mut g = groups(&w, Duration::from_secs(30));
    let t0 = Instant::now();
    for (epoch, batches) in [[5, 7, 9], [4, 4, 4]].iter().enumerate() {
        let mine = batches[w.rank];
        let mut steps = 0;
        while g.join.all_have_batch(steps < mine).unwrap() {
            steps += 1;
        }
        println!("EPOCH {epoch} STEPS {steps}");
    }
    println!("MS {}", t0.elapsed().as_millis());
    // Both groups still work together after the epochs.
    g.comm.barrier().unwrap();
}

#[test]
fn uneven_batches_end_the_epoch_on_every_rank_in_the_same_step() {
    if let Some(w) = worker() {
        return uneven_body(w);
    }
    let rs = run_ok("uneven_batches_end_the_epoch_on_every_rank_in_the_same_step", 3, &[]);
    for r in &rs {
        assert_eq!(r.lines_with("EPOCH "), vec!["0 STEPS 5".to_string(), "1 STEPS 4".to_string()], "rank {}", r.rank);
        let ms: u64 = r.lines_with("MS ")[0].parse().unwrap();
        assert!(ms < 10_000, "rank {}: two tiny epochs took {ms} ms (join timeout 30 s)", r.rank);
        let err = r.stderr();
        let n = err.matches("Detected uneven workload distribution").count();
        if r.rank == 0 {
            assert_eq!(n, 0, "rank 0 ran out first and must not report:\n{err}");
        } else {
            assert_eq!(n, 1, "rank {} reports once (epoch 0 only):\n{err}", r.rank);
            let want = format!(
                "Detected uneven workload distribution: rank {0} still has batches, rank(s) 0 ran out\nBreak current worker to manually join all workers, world_size 3, current rank {0}, current local_rank {1}",
                r.rank,
                r.rank + 10
            );
            assert!(err.contains(&want), "rank {}:\n{err}", r.rank);
        }
    }
}

fn hung_body(w: Worker) {
    let mut g = groups(&w, Duration::from_secs(2));
    for _ in 0..3 {
        assert!(g.join.all_have_batch(true).unwrap());
    }
    if w.rank == 2 {
        // Stops answering (a hung data loader) but keeps its sockets open.
        std::thread::sleep(Duration::from_secs(6));
        return;
    }
    let t0 = Instant::now();
    let err = g.join.all_have_batch(true).unwrap_err();
    println!("MS {}", t0.elapsed().as_millis());
    println!("ERR {err}");
}

#[test]
fn a_rank_that_stops_answering_fails_the_join_within_its_timeout() {
    if let Some(w) = worker() {
        return hung_body(w);
    }
    let rs = run_ok("a_rank_that_stops_answering_fails_the_join_within_its_timeout", 3, &[]);
    for r in &rs[..2] {
        let ms: u64 = r.lines_with("MS ")[0].parse().unwrap();
        assert!((2000..5000).contains(&ms), "rank {} failed after {ms} ms with a 2 s join timeout", r.rank);
        let err = &r.lines_with("ERR ")[0];
        assert_eq!(err, &format!("distributed join on rank {}: rank 2 did not answer within 2 s", r.rank));
    }
}
