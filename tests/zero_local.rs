//! The ZeRO engine's arithmetic with ranks as threads of one process (an
//! in-process communicator, no network): stage 1 and 2 at 2 and 3 ranks,
//! with tiny buckets so parameters straddle buckets and shards, equal the
//! single-process engine on the whole batch; stage 2 holds no full gradient
//! between micro-batches; re-sharding moves the moments exactly.

mod zero_common;

use asrforge::engine::flat::FlatLayout;
use asrforge::engine::{Engine, SingleProcess, ZeroEngine, ZeroOptions};
use asrforge::optim::AdamConfig;
use asrforge::tensor::Rng;
use zero_common::*;

const ADAM: AdamConfig = AdamConfig { lr: 0.01, betas: (0.9, 0.999), eps: 1e-8, weight_decay: 0.0, decoupled: false };

fn reference(run: Run) -> (Vec<f32>, Vec<f64>) {
    let mut e = SingleProcess::new(make_params(7), ADAM).expect("engine");
    let outs = train(&mut e, run, None, &|_, _| {}).expect("train");
    (flat_values(e.parameters()), outs.iter().map(|o| o.grad_norm).collect())
}

fn zero_threads(world: usize, opts: ZeroOptions, run: Run) -> Vec<(Vec<f32>, Vec<f64>)> {
    let handles: Vec<_> = LocalComm::group(world)
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let mut e = ZeroEngine::new(make_params(7), Box::new(c), opts, ADAM).expect("zero engine");
                let outs = train(&mut e, run, None, &|_, _| {}).expect("train");
                (flat_values(e.parameters()), outs.iter().map(|o| o.grad_norm).collect())
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
}

#[test]
fn zero_in_threads_equals_single_process() {
    for (world, stage, accum, bucket) in [(2, 1, 1, 8), (2, 2, 2, 8), (3, 1, 2, 5), (3, 2, 1, 4), (2, 2, 1, 1 << 20)] {
        let run = Run { first_step: 0, steps: 10, accum, clip: 0.05, lr: 0.01 };
        let (want, want_norms) = reference(run);
        let moved = max_rel(&want, &flat_values(&make_params(7)));
        assert!(moved > 1e-2, "training must move the parameters (moved {moved:e})");
        let opts = ZeroOptions { stage, reduce_bucket_size: bucket, allgather_bucket_size: bucket + 1, overlap_comm: false };
        let ranks = zero_threads(world, opts, run);
        // overlap_comm (the buckets launched from backward's gradient-ready hook) changes nothing, bit for bit.
        let overlapped = zero_threads(world, ZeroOptions { overlap_comm: true, ..opts }, run);
        assert_eq!(overlapped, ranks, "world {world} stage {stage} accum {accum} bucket {bucket}: overlap_comm vs the plain reduction");
        for (r, (got, norms)) in ranks.iter().enumerate() {
            let rel = max_rel(got, &want);
            eprintln!("world {world} stage {stage} accum {accum} bucket {bucket} rank {r}: max relative difference to single process {rel:e}");
            assert!(rel < 1e-5, "world {world} stage {stage} accum {accum} rank {r}: max relative difference {rel:e}");
            assert_eq!(got, &ranks[0].0, "rank {r} differs from rank 0");
            for (g, w) in norms.iter().zip(&want_norms) {
                assert!(*g > 0.05, "the clip must act: norm {g}");
                assert!((g - w).abs() / w < 1e-5, "grad norm {g} vs single-process {w}");
            }
        }
    }
}

#[test]
fn stage_2_keeps_only_the_shard_gradient_between_micro_batches() {
    for stage in [1u8, 2] {
        let handles: Vec<_> = LocalComm::group(2)
            .into_iter()
            .map(|c| {
                std::thread::spawn(move || {
                    let opts = ZeroOptions { stage, reduce_bucket_size: 6, allgather_bucket_size: 6, overlap_comm: false };
                    let mut e = ZeroEngine::new(make_params(7), Box::new(c), opts, ADAM).expect("zero engine");
                    let (rank, params) = (e.rank(), e.parameters().to_vec());
                    let loss = local_loss(&params, 0, 0, rank, 2).expect("loss");
                    e.backward(&loss, false).expect("backward");
                    let full_grads = params.iter().filter(|(_, p)| p.grad().is_some()).count();
                    (full_grads, e.shard_grad().map(<[f32]>::len), e.layout().shard_len)
                })
            })
            .collect();
        for h in handles {
            let (full, shard, shard_len) = h.join().expect("rank");
            if stage == 2 {
                assert_eq!((full, shard), (0, Some(shard_len)), "stage 2: no full gradient, a {shard_len}-element shard gradient");
            } else {
                assert_eq!((full, shard), (5, None), "stage 1: full gradients accumulate until the last micro-batch");
            }
        }
    }
}

/// `FlatLayout::buckets_reading` (the buckets that wait for a parameter's
/// gradient under `overlap_comm`) against a brute force over every element
/// on random layouts: element at flat position x lies in shard x / s at
/// in-shard offset x % s, so in bucket (x % s) / chunk. Its last entry is
/// `last_bucket`'s (the bucket after which stage 2 frees the gradient).
#[test]
fn buckets_reading_matches_every_element_of_random_layouts() {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let mut rng = Rng::new(seed);
    let mut draw = |n: usize| (rng.normal(1)[0].abs() * n as f64) as usize;
    for case in 0..200 {
        let count = 1 + draw(4);
        let sizes: Vec<(String, usize)> = (0..count).map(|i| (format!("p{i}"), if draw(3) == 0 { 0 } else { 1 + draw(20) })).collect();
        let world = 1 + draw(3);
        let chunk = 1 + draw(6);
        let layout = FlatLayout::new(&sizes, world).unwrap();
        let s = layout.shard_len;
        let got = layout.buckets_reading(chunk);
        let last = layout.last_bucket(chunk);
        for (i, e) in layout.entries.iter().enumerate() {
            let mut want: Vec<usize> = (e.offset..e.offset + e.numel).map(|x| (x % s) / chunk).collect();
            want.sort_unstable();
            want.dedup();
            assert_eq!(got[i], want, "case {case} (seed {seed}): sizes {sizes:?} world {world} chunk {chunk}, parameter {i}");
            if let Some(&m) = want.last() {
                assert_eq!(last[i], m, "case {case} (seed {seed}): last bucket of parameter {i}");
            }
        }
    }
}
