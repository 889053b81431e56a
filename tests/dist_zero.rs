//! The ZeRO engine with real processes on 127.0.0.1 (TCP communicator).
//! Each worker trains the 53-parameter model of `zero_common` (not divisible
//! by 2 or 3, with a 1-element parameter) for 10 steps with the gradient
//! clip acting, and checks against engines it runs itself in the same
//! process: DDP over the same ranks, and the single-process engine on the
//! whole global batch. Workers print their results' bits so the parent
//! checks that every rank ends identical and compares runs across spawns
//! (checkpoint/resume at the same and at other world sizes).

mod dist_common;
mod zero_common;

use asrforge::dist::{Store, StoreServer, TcpCommunicator};
use asrforge::engine::deepspeed::parse_deepspeed_config;
use asrforge::engine::{Ddp, Engine, OptimizerState, SingleProcess, ZeroEngine, ZeroOptions};
use asrforge::optim::{AdamConfig, GradScaler};
use asrforge::tensor::{DType, Rng};
use asrforge::train::checkpoint::{load_state, save_optimizer_shard, save_state, state_path, TrainState};
use asrforge::train::Position;
use asrforge::{Device, Tensor};
use dist_common::{run_ok, worker, Worker, WorkerResult};
use std::path::{Path, PathBuf};
use std::time::Duration;
use zero_common::*;

const TIMEOUT: Duration = Duration::from_secs(60);
const ADAM: AdamConfig = AdamConfig { lr: 0.01, betas: (0.9, 0.999), eps: 1e-8, weight_decay: 0.0, decoupled: false };
const CLIP: f64 = 0.05;

/// Rank 0 hosts the store; every rank connects.
fn store(w: &Worker) -> (Option<StoreServer>, Store) {
    let addr = format!("{}:{}", w.master_addr, w.master_port);
    let server = (w.rank == 0).then(|| StoreServer::start(&addr, &w.token).expect("start store"));
    (server, Store::connect(&addr, &w.token, w.rank, TIMEOUT).expect("connect store"))
}

fn comm(s: &Store, w: &Worker, prefix: &str) -> Box<TcpCommunicator> {
    Box::new(TcpCommunicator::new(s, prefix, w.rank, w.world_size, TIMEOUT).expect("communicator"))
}

fn zero(s: &Store, w: &Worker, prefix: &str, opts: ZeroOptions) -> ZeroEngine {
    ZeroEngine::new(make_params(7), comm(s, w, prefix), opts, ADAM).expect("zero engine")
}

fn opts(stage: u8, bucket: usize) -> ZeroOptions {
    ZeroOptions { stage, reduce_bucket_size: bucket, allgather_bucket_size: bucket + 3, overlap_comm: false }
}

fn bits(v: &[f32]) -> String {
    v.iter().map(|x| format!("{:08x}", x.to_bits())).collect::<Vec<_>>().join(",")
}

fn unbits(s: &str) -> Vec<f32> {
    s.split(',').filter(|x| !x.is_empty()).map(|x| f32::from_bits(u32::from_str_radix(x, 16).expect("hex"))).collect()
}

/// The single line `{key} …` a worker printed, without the key.
fn line(r: &WorkerResult, key: &str) -> String {
    let v = r.lines_with(&format!("{key} "));
    assert_eq!(v.len(), 1, "rank {} printed {key} {} times\n{}", r.rank, v.len(), r.stdout());
    v[0].clone()
}

/// Compares ZeRO stage 1 and 2 (with tiny and with large buckets) against
/// DDP and against one process with the whole batch.
fn equivalence_worker(w: &Worker, accum: usize) {
    let (_server, s) = store(w);
    let run = Run { first_step: 0, steps: 10, accum, clip: CLIP, lr: 0.01 };
    let mut single = SingleProcess::new(make_params(7), ADAM).expect("single");
    let single_out = train(&mut single, Run { ..run }, None, &|_, _| {}).expect("single-process run");
    // The single-process run sees the whole batch: world 1, rank 0.
    let want = flat_values(single.parameters());
    assert!(max_rel(&want, &flat_values(&make_params(7))) > 1e-2, "training moves the parameters");
    let mut ddp = Ddp::new(make_params(7), &[], ADAM, comm(&s, w, "ddp"), 64).expect("ddp");
    train(&mut ddp, run, None, &|_, _| {}).expect("ddp run");
    let ddp_vals = flat_values(ddp.parameters());
    for (i, o) in [opts(1, 8), opts(2, 8), opts(1, 1 << 20), opts(2, 1 << 20)].into_iter().enumerate() {
        let mut e = zero(&s, w, &format!("zero{i}"), o);
        assert_eq!(e.layout().padded() % w.world_size, 0);
        let outs = train(&mut e, run, None, &|_, _| {}).expect("zero run");
        let got = flat_values(e.parameters());
        let (vs_ddp, vs_single) = (max_rel(&got, &ddp_vals), max_rel(&got, &want));
        println!("REL stage {} bucket {} vs_ddp {vs_ddp:e} vs_single {vs_single:e}", o.stage, o.reduce_bucket_size);
        assert!(vs_ddp < 1e-5, "stage {} vs DDP: max relative difference {vs_ddp:e}", o.stage);
        assert!(vs_single < 1e-5, "stage {} vs one process with the whole batch: {vs_single:e}", o.stage);
        for (k, (z, r)) in outs.iter().zip(&single_out).enumerate() {
            assert!(z.grad_norm > CLIP, "step {k}: the clip must act, norm {} <= {CLIP}", z.grad_norm);
            assert!((z.grad_norm - r.grad_norm).abs() / r.grad_norm < 1e-5, "step {k}: norm over the shards {} vs single-process {}", z.grad_norm, r.grad_norm);
            assert!(!z.skipped);
        }
        println!("PARAMS{i} {}", bits(&got));
    }
}

fn check_identical(rs: &[WorkerResult], n: usize) {
    for i in 0..n {
        let first = line(&rs[0], &format!("PARAMS{i}"));
        for r in rs {
            assert_eq!(line(r, &format!("PARAMS{i}")), first, "run {i}: rank {} ends with other parameters than rank 0", r.rank);
        }
    }
}

#[test]
fn zero_1_and_2_equal_ddp_and_one_process_at_2_ranks() {
    if let Some(w) = worker() {
        equivalence_worker(&w, 2);
        return;
    }
    let rs = run_ok("zero_1_and_2_equal_ddp_and_one_process_at_2_ranks", 2, &[]);
    check_identical(&rs, 4);
    eprintln!("{}", rs[0].lines_with("REL ").join("\n"));
}

#[test]
fn zero_1_and_2_equal_ddp_and_one_process_at_3_ranks() {
    if let Some(w) = worker() {
        equivalence_worker(&w, 1);
        return;
    }
    let rs = run_ok("zero_1_and_2_equal_ddp_and_one_process_at_3_ranks", 3, &[]);
    check_identical(&rs, 4);
    eprintln!("{}", rs[0].lines_with("REL ").join("\n"));
}

/// DDP with the bucket all-reduce in f16 and in bf16 (`--fp16_grad_sync`)
/// against one process with the whole batch and against DDP in f32.
fn half_sync_worker(w: &Worker, accum: usize) {
    let (_server, s) = store(w);
    let run = Run { first_step: 0, steps: 10, accum, clip: CLIP, lr: 0.01 };
    let mut single = SingleProcess::new(make_params(7), ADAM).expect("single");
    let single_out = train(&mut single, run, None, &|_, _| {}).expect("single-process run");
    let want = flat_values(single.parameters());
    let mut full = Ddp::new(make_params(7), &[], ADAM, comm(&s, w, "f32"), 64).expect("ddp");
    train(&mut full, run, None, &|_, _| {}).expect("ddp run, f32 all-reduce");
    let full = flat_values(full.parameters());
    for half in [DType::F16, DType::BF16] {
        let ddp = Ddp::new(make_params(7), &[], ADAM, comm(&s, w, half.as_str()), 64).expect("ddp").with_half_grad_sync(Some(half)).expect("half sync");
        assert_eq!(ddp.grad_sync_dtype(), Some(half));
        assert!(ddp.stats().lock().unwrap().bucket_numels.len() > 1, "several buckets");
        let mut ddp = ddp;
        let outs = train(&mut ddp, run, None, &|_, _| {}).expect("ddp run, half all-reduce");
        assert!(outs.iter().all(|o| o.grad_norm > CLIP && !o.skipped), "the clip acts and no step is skipped: {outs:?}");
        // Adam and the clip hide a wrong scale from the parameters; the norm
        // shows it (a sum instead of an average is off by w − 1 relative).
        check_half_norms("ddp", half, w.world_size, &outs, &single_out);
        let got = flat_values(ddp.parameters());
        check_half_sync("ddp", half, w.world_size, run, ADAM.betas, &got, &want, &full);
        println!("PARAMS{} {}", half.as_str(), bits(&got));
    }
    let bad = Ddp::new(make_params(7), &[], ADAM, comm(&s, w, "f64"), 64).expect("ddp").with_half_grad_sync(Some(DType::F64));
    let err = bad.err().expect("f64 is not a half type").to_string();
    assert!(err.contains("expected f16 or bf16") && err.contains("f64"), "{err}");
}

/// The used flags stay exact when the buckets travel in half precision:
/// `one` is used by rank 0 only and gets its gradient averaged with the
/// other ranks' zeros, `none` is used by no rank and gets no gradient at
/// all (decoupled weight decay, which applies to every parameter with a
/// gradient, leaves it untouched), `all` is used everywhere. Each in its
/// own bucket and together in one.
fn half_sync_flags_worker(w: &Worker) {
    let (_server, s) = store(w);
    let adam = AdamConfig { weight_decay: 0.5, decoupled: true, ..ADAM };
    let world = w.world_size as f64;
    // Rank 0's gradient of `one` (exact in every dtype); `all`'s gradient on rank r is x·(r + 1).
    let c = [0.5f32, -1.0, 2.0, 0.375];
    let x = [0.25f32, -0.5, 1.5];
    for half in [DType::F16, DType::BF16] {
        for bucket in [4usize, 1 << 20] {
            let params = vec![
                ("all".to_string(), Tensor::from_vec(vec![0.1f32, 0.2, -0.3], vec![3], &Device::Cpu).unwrap().requires_grad_()),
                ("one".to_string(), Tensor::from_vec(vec![1.0f32, -2.0, 3.0, 0.5], vec![4], &Device::Cpu).unwrap().requires_grad_()),
                ("none".to_string(), Tensor::from_vec(vec![0.7f32, -0.9], vec![2], &Device::Cpu).unwrap().requires_grad_()),
            ];
            let before: Vec<Vec<f32>> = params.iter().map(|(_, p)| p.to_vec::<f32>().unwrap()).collect();
            let prefix = format!("flags-{}-{bucket}", half.as_str());
            let mut ddp = Ddp::new(params.clone(), &[], adam, comm(&s, w, &prefix), bucket).expect("ddp").with_half_grad_sync(Some(half)).expect("half sync");
            let k = |v: &[f32]| Tensor::from_vec(v.to_vec(), vec![v.len()], &Device::Cpu).unwrap();
            let xr: Vec<f32> = x.iter().map(|v| v * (w.rank + 1) as f32).collect();
            let mut loss = asrforge::ops::sum_all(&asrforge::ops::mul(&params[0].1, &k(&xr)).unwrap()).unwrap();
            if w.rank == 0 {
                loss = asrforge::ops::add(&loss, &asrforge::ops::sum_all(&asrforge::ops::mul(&params[1].1, &k(&c)).unwrap()).unwrap()).unwrap();
            }
            ddp.backward(&loss, true).expect("backward");
            ddp.step(0.01, 0.0, None).expect("step");
            let st = ddp.optimizer_state().unwrap();
            let m = |name: &str| st.tensors.iter().find(|(n, _)| *n == format!("{name}.exp_avg")).unwrap().1.to_f64_vec().unwrap();
            let label = format!("{} bucket {bucket}", half.as_str());
            // After one step from zero m = (1 − β1)·g, rounded in f32.
            let grad = |name: &str| m(name).iter().map(|v| v / (1.0 - ADAM.betas.0)).collect::<Vec<f64>>();
            // The average: rank 0's share c/w rounded once to the half type, plus exact zeros.
            let u = unit_roundoff(half);
            for (g, ci) in grad("one").iter().zip(c) {
                let want = ci as f64 / world;
                assert!(
                    (g - want).abs() <= (u + 1e-6) * want.abs(),
                    "{label}: `one` got {g}, expected {want} = rank 0's gradient / {world} within the half type's rounding"
                );
            }
            // `all`: Σ_r x·(r+1)/w = x·(w+1)/2, within w roundings.
            for (g, xi) in grad("all").iter().zip(x) {
                let want = xi as f64 * (world + 1.0) / 2.0;
                assert!((g - want).abs() <= (world * u + 1e-6) * want.abs(), "{label}: `all` got {g}, expected {want}");
            }
            assert_eq!(m("none"), vec![0.0, 0.0], "{label}: `none` has no first moment");
            let after: Vec<Vec<f32>> = ddp.parameters().iter().map(|(_, p)| p.to_vec::<f32>().unwrap()).collect();
            assert_eq!(after[2], before[2], "{label}: `none` got no gradient (a zero one would have let weight decay shrink it)");
            assert!(after[1] != before[1] && after[0] != before[0], "{label}: `one` and `all` were updated");
            println!("FLAGS {label}: ok");
        }
    }
}

#[test]
fn ddp_half_grad_sync_keeps_the_used_flags_exact_at_3_ranks() {
    if let Some(w) = worker() {
        half_sync_flags_worker(&w);
        return;
    }
    let rs = run_ok("ddp_half_grad_sync_keeps_the_used_flags_exact_at_3_ranks", 3, &[]);
    assert_eq!(rs[0].lines_with("FLAGS ").len(), 4);
}

fn check_half_identical(rs: &[WorkerResult]) {
    for half in ["f16", "bf16"] {
        let first = line(&rs[0], &format!("PARAMS{half}"));
        for r in rs {
            assert_eq!(line(r, &format!("PARAMS{half}")), first, "{half}: rank {} ends with other parameters than rank 0", r.rank);
        }
    }
    eprintln!("{}", rs[0].lines_with("HALF ").join("\n"));
}

#[test]
fn ddp_half_grad_sync_is_within_half_rounding_of_one_process_at_2_ranks() {
    if let Some(w) = worker() {
        half_sync_worker(&w, 2);
        return;
    }
    check_half_identical(&run_ok("ddp_half_grad_sync_is_within_half_rounding_of_one_process_at_2_ranks", 2, &[]));
}

#[test]
fn ddp_half_grad_sync_is_within_half_rounding_of_one_process_at_3_ranks() {
    if let Some(w) = worker() {
        half_sync_worker(&w, 1);
        return;
    }
    check_half_identical(&run_ok("ddp_half_grad_sync_is_within_half_rounding_of_one_process_at_3_ranks", 3, &[]));
}

/// ZeRO stage 1 and 2 with the gradient reduce-scatter in f16 and in bf16
/// (`--fp16_grad_sync`, `communication_data_type`) against one process with
/// the whole batch (within the bound derived from the half type's
/// rounding, as DDP's half all-reduce) and against the same engine in f32;
/// the bytes handed to the reduce-scatter are exactly half the f32 run's.
fn zero_half_sync_worker(w: &Worker, accum: usize) {
    let (_server, s) = store(w);
    let run = Run { first_step: 0, steps: 10, accum, clip: CLIP, lr: 0.01 };
    let mut single = SingleProcess::new(make_params(7), ADAM).expect("single");
    let single_out = train(&mut single, run, None, &|_, _| {}).expect("single-process run");
    let want = flat_values(single.parameters());
    for stage in [1u8, 2] {
        let mut full = zero(&s, w, &format!("zf32-{stage}"), opts(stage, 8));
        assert_eq!(full.grad_sync_dtype(), None);
        train(&mut full, run, None, &|_, _| {}).expect("zero run, f32 reduce-scatter");
        let full_stats = full.stats().lock().unwrap().clone();
        let full = flat_values(full.parameters());
        for half in [DType::F16, DType::BF16] {
            let mut e = zero(&s, w, &format!("z{}-{stage}", half.as_str()), opts(stage, 8)).with_half_grad_sync(Some(half)).expect("half sync");
            assert_eq!(e.grad_sync_dtype(), Some(half));
            let outs = train(&mut e, run, None, &|_, _| {}).expect("zero run, half reduce-scatter");
            assert!(outs.iter().all(|o| o.grad_norm > CLIP && !o.skipped), "the clip acts and no step is skipped: {outs:?}");
            let label = format!("zero{stage}");
            check_half_norms(&label, half, w.world_size, &outs, &single_out);
            let got = flat_values(e.parameters());
            check_half_sync(&label, half, w.world_size, run, ADAM.betas, &got, &want, &full);
            let st = e.stats().lock().unwrap().clone();
            assert!(st.reduce_scatters > run.steps, "{label}: several buckets per step, {} reduce-scatters", st.reduce_scatters);
            assert_eq!(st.reduce_scatters, full_stats.reduce_scatters, "{label} {}: as many reduce-scatters as in f32", half.as_str());
            assert_eq!(
                2 * st.reduce_scatter_bytes,
                full_stats.reduce_scatter_bytes,
                "{label} {}: the reduce-scatter moves 2 bytes per element instead of 4",
                half.as_str()
            );
            println!("BYTES {label} {} {} (f32 {})", half.as_str(), st.reduce_scatter_bytes, full_stats.reduce_scatter_bytes);
            println!("PARAMS{label}{} {}", half.as_str(), bits(&got));
        }
    }
    let bad = zero(&s, w, "zf64", opts(2, 8)).with_half_grad_sync(Some(DType::F64));
    let err = bad.err().expect("f64 is not a half type").to_string();
    assert!(err.contains("expected f16 or bf16") && err.contains("f64"), "{err}");
}

fn check_zero_half_identical(rs: &[WorkerResult]) {
    for name in ["zero1f16", "zero1bf16", "zero2f16", "zero2bf16"] {
        let first = line(&rs[0], &format!("PARAMS{name}"));
        for r in rs {
            assert_eq!(line(r, &format!("PARAMS{name}")), first, "{name}: rank {} ends with other parameters than rank 0", r.rank);
        }
    }
    eprintln!("{}", rs[0].lines_with("HALF ").join("\n"));
    eprintln!("{}", rs[0].lines_with("BYTES ").join("\n"));
}

#[test]
fn zero_half_grad_sync_is_within_half_rounding_of_one_process_at_2_ranks() {
    if let Some(w) = worker() {
        zero_half_sync_worker(&w, 2);
        return;
    }
    check_zero_half_identical(&run_ok("zero_half_grad_sync_is_within_half_rounding_of_one_process_at_2_ranks", 2, &[]));
}

#[test]
fn zero_half_grad_sync_is_within_half_rounding_of_one_process_at_3_ranks() {
    if let Some(w) = worker() {
        zero_half_sync_worker(&w, 1);
        return;
    }
    check_zero_half_identical(&run_ok("zero_half_grad_sync_is_within_half_rounding_of_one_process_at_3_ranks", 3, &[]));
}

/// The half reduce-scatter divides by the world size before it rounds to
/// f16: every rank's gradient of `p` is (40000, −30000), whose sum over 2
/// ranks (80000) overflows f16 (largest finite 65504) but whose shares
/// (20000, −15000) and their sums are exact in f16. Each rank's shard
/// gradient is exactly the average; without the division the sum is inf
/// and the step is skipped; with the division but an averaging reduction
/// it is half the average.
#[test]
fn zero_half_grad_sync_divides_before_rounding_so_the_sum_does_not_overflow() {
    if let Some(w) = worker() {
        let (_server, s) = store(&w);
        for stage in [1u8, 2] {
            let p = Tensor::from_vec(vec![1.0f32, 2.0], vec![2], &Device::Cpu).unwrap().requires_grad_();
            let mut e = ZeroEngine::new(vec![("p".to_string(), p.clone())], comm(&s, &w, &format!("ovf{stage}")), opts(stage, 8), ADAM)
                .expect("zero")
                .with_half_grad_sync(Some(DType::F16))
                .expect("f16");
            let c = Tensor::from_vec(vec![40000.0f32, -30000.0], vec![2], &Device::Cpu).unwrap();
            let loss = asrforge::ops::sum_all(&asrforge::ops::mul(&p, &c).unwrap()).unwrap();
            e.backward(&loss, true).expect("backward");
            let want = [40000.0f32, -30000.0][w.rank];
            assert_eq!(e.shard_grad(), Some(&[want][..]), "rank {} stage {stage}: the shard gradient is the exact average", w.rank);
            let out = e.step(0.01, 0.0, None).expect("step");
            assert!(!out.skipped && out.grad_norm == 50000.0, "stage {stage}: {out:?}");
            println!("PARAMS{} {}", stage - 1, bits(&flat_values(e.parameters())));
        }
        return;
    }
    let rs = run_ok("zero_half_grad_sync_divides_before_rounding_so_the_sum_does_not_overflow", 2, &[]);
    check_identical(&rs, 2);
}

#[test]
fn fp16_overflow_on_one_rank_skips_the_step_on_every_rank() {
    if let Some(w) = worker() {
        let (_server, s) = store(&w);
        let (ds, _) = parse_deepspeed_config(
            r#"{"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 8, "loss_scale_window": 1000, "hysteresis": 1, "min_loss_scale": 1}}"#,
            "t.json",
        )
        .expect("config");
        for stage in [1u8, 2] {
            let mut e = zero(&s, &w, &format!("fp16_{stage}"), opts(stage, 8));
            let mut scaler = GradScaler::new(ds.scaler_config().expect("fp16"));
            let run = Run { first_step: 0, steps: 3, accum: 2, clip: CLIP, lr: 0.01 };
            train(&mut e, run, Some(&mut scaler), &|_, _| {}).expect("clean steps");
            let (before, adam_before) = (flat_values(e.parameters()), e.adam_step());
            assert_eq!((scaler.scale, adam_before), (256.0, 3));
            // Rank 1 alone poisons w1[0], which lies in rank 0's shard, so
            // rank 1 learns of it only through the all-reduced check.
            assert_eq!(e.layout().entries[0].offset, 0);
            let rank = w.rank;
            let poison = move |_: u64, params: &[(String, Tensor)]| {
                if rank == 1 {
                    let mut g = vec![0.0f32; params[0].1.elem_count()];
                    g[0] = f32::INFINITY;
                    params[0].1.set_grad(Some(Tensor::from_vec(g, params[0].1.dims().to_vec(), &Device::Cpu).expect("grad"))).expect("set grad");
                }
            };
            let out = train(&mut e, Run { first_step: 3, steps: 1, ..run }, Some(&mut scaler), &poison).expect("poisoned step");
            assert!(out[0].skipped, "rank {rank} stage {stage}: the step must be skipped");
            assert_eq!(flat_values(e.parameters()), before, "rank {rank}: a skipped step leaves the parameters");
            assert_eq!((e.adam_step(), scaler.scale, scaler.skipped), (3, 128.0, 1), "rank {rank}: Adam's step stays, the scale halves");
            let out = train(&mut e, Run { first_step: 4, steps: 1, ..run }, Some(&mut scaler), &|_, _| {}).expect("clean step");
            assert!(!out[0].skipped && e.adam_step() == 4 && flat_values(e.parameters()) != before, "training goes on after the skip");
            println!("PARAMS{} {}", stage - 1, bits(&flat_values(e.parameters())));
        }
        return;
    }
    let rs = run_ok("fp16_overflow_on_one_rank_skips_the_step_on_every_rank", 2, &[]);
    check_identical(&rs, 2);
}

fn overlap(stage: u8, bucket: usize) -> ZeroOptions {
    ZeroOptions { overlap_comm: true, ..opts(stage, bucket) }
}

/// ZeRO stage 1 and 2 with `overlap_comm` (each bucket's reduce-scatter
/// launched from the gradient-ready hook on the communication thread)
/// against the same engine without it: bitwise equal parameters and norms
/// after 10 steps, in f32, f16 and bf16, with several small buckets and
/// with one; the same reduce-scatters and bytes; every bucket launched
/// during backward (every parameter gets a gradient); within 1e-5 of one
/// process with the whole batch in f32.
fn overlap_worker(w: &Worker, accum: usize) {
    let (_server, s) = store(w);
    let run = Run { first_step: 0, steps: 10, accum, clip: CLIP, lr: 0.01 };
    let mut single = SingleProcess::new(make_params(7), ADAM).expect("single");
    train(&mut single, run, None, &|_, _| {}).expect("single-process run");
    let want = flat_values(single.parameters());
    let mut i = 0;
    for stage in [1u8, 2] {
        for half in [None, Some(DType::F16), Some(DType::BF16)] {
            for bucket in [8usize, 1 << 20] {
                let label = format!("stage {stage} {} bucket {bucket}", half.map_or("f32", |h| h.as_str()));
                let mut plain = zero(&s, w, &format!("plain{i}"), opts(stage, bucket)).with_half_grad_sync(half).expect("half sync");
                let plain_outs = train(&mut plain, run, None, &|_, _| {}).expect("zero run");
                let mut ov = zero(&s, w, &format!("overlap{i}"), overlap(stage, bucket)).with_half_grad_sync(half).expect("half sync");
                let outs = train(&mut ov, run, None, &|_, _| {}).expect("zero run, overlap_comm");
                let (got, base) = (flat_values(ov.parameters()), flat_values(plain.parameters()));
                assert_eq!(bits(&got), bits(&base), "{label}: overlap_comm must leave the parameters bitwise equal");
                for (k, (a, b)) in outs.iter().zip(&plain_outs).enumerate() {
                    assert_eq!(a.grad_norm.to_bits(), b.grad_norm.to_bits(), "{label} step {k}: gradient norm {} vs {}", a.grad_norm, b.grad_norm);
                }
                if half.is_none() {
                    let rel = max_rel(&got, &want);
                    assert!(rel < 1e-5, "{label}: vs one process with the whole batch {rel:e}");
                }
                let (st, pst) = (ov.stats().lock().unwrap().clone(), plain.stats().lock().unwrap().clone());
                let chunk = (bucket / w.world_size).max(1);
                let buckets = ov.layout().shard_len.div_ceil(chunk) as u64;
                let reductions = run.steps * if stage == 2 { accum as u64 } else { 1 };
                assert_eq!(st.reduce_scatters, reductions * buckets, "{label}: {buckets} buckets in each of {reductions} reductions");
                assert_eq!((st.reduce_scatters, st.reduce_scatter_bytes), (pst.reduce_scatters, pst.reduce_scatter_bytes), "{label}: the same collectives");
                assert_eq!(pst.launched_during_backward, 0, "{label}: without overlap_comm nothing is launched during backward");
                assert_eq!(st.launched_during_backward, st.reduce_scatters, "{label}: every bucket leaves from the gradient-ready hook");
                println!("OVERLAP {label}: {} reduce-scatters, all launched during backward, bitwise equal", st.reduce_scatters);
                println!("PARAMS{i} {}", bits(&got));
                i += 1;
            }
        }
    }
}

#[test]
fn zero_overlap_comm_is_bitwise_the_plain_reduction_at_2_ranks() {
    if let Some(w) = worker() {
        overlap_worker(&w, 2);
        return;
    }
    let rs = run_ok("zero_overlap_comm_is_bitwise_the_plain_reduction_at_2_ranks", 2, &[]);
    check_identical(&rs, 12);
    eprintln!("{}", rs[0].lines_with("OVERLAP ").join("\n"));
}

#[test]
fn zero_overlap_comm_is_bitwise_the_plain_reduction_at_3_ranks() {
    if let Some(w) = worker() {
        overlap_worker(&w, 1);
        return;
    }
    let rs = run_ok("zero_overlap_comm_is_bitwise_the_plain_reduction_at_3_ranks", 3, &[]);
    check_identical(&rs, 12);
}

/// Stage 2 with `overlap_comm`: after a backward every full gradient is
/// freed and only the shard gradient is held; an unused parameter's buckets
/// wait for the end of backward (launched after it, not from the hook).
fn overlap_frees_worker(w: &Worker) {
    let (_server, s) = store(w);
    let mut e = zero(&s, w, "frees", overlap(2, 8));
    let params = e.parameters().to_vec();
    let loss = local_loss(&params, 0, 0, w.rank, w.world_size).unwrap();
    e.backward(&loss, false).expect("backward");
    assert!(params.iter().all(|(_, p)| p.grad().is_none()), "stage 2 frees every full gradient");
    assert_eq!(e.shard_grad().map(<[f32]>::len), Some(e.layout().shard_len));
    let st = e.stats().lock().unwrap().clone();
    assert_eq!(st.launched_during_backward, st.reduce_scatters);
    e.step(0.01, CLIP, None).expect("step");
    // `b1` unused: the buckets launch in descending order, so those above
    // b1's highest bucket leave from the hook and the rest after backward.
    let params = e.parameters().to_vec();
    let mut y = asrforge::ops::sum_all(&asrforge::ops::mul(&params[0].1, &params[0].1).unwrap()).unwrap();
    for (_, p) in &params[2..] {
        y = asrforge::ops::add(&y, &asrforge::ops::sum_all(&asrforge::ops::mul(p, p).unwrap()).unwrap()).unwrap();
    }
    e.backward(&y, true).expect("backward without b1");
    let st2 = e.stats().lock().unwrap().clone();
    let per = st.reduce_scatters;
    let above = per - 1 - e.layout().last_bucket(4)[1] as u64;
    assert!(above > 0 && above < per, "b1 lies in a middle bucket: {above} of {per} above it");
    assert_eq!(st2.reduce_scatters, 2 * per);
    assert_eq!(st2.launched_during_backward, st.launched_during_backward + above, "the {above} buckets above b1's leave from the hook");
    println!("UNUSED {above} of {per} buckets launched during backward with b1 unused");
    e.step(0.01, CLIP, None).expect("step");
    println!("PARAMS0 {}", bits(&flat_values(e.parameters())));
}

#[test]
fn zero2_overlap_comm_frees_full_gradients_and_waits_for_unused_parameters() {
    if let Some(w) = worker() {
        overlap_frees_worker(&w);
        return;
    }
    let rs = run_ok("zero2_overlap_comm_frees_full_gradients_and_waits_for_unused_parameters", 2, &[]);
    check_identical(&rs, 1);
}

/// A backward that fails on one rank (an f64 gradient planted in `w1`,
/// which neither autograd's accumulation nor the bucket read accepts)
/// still launches every bucket: the other ranks' reduce-scatters complete,
/// every rank steps and trains on, and all end bitwise equal well within
/// the communicator's timeout.
fn overlap_failure_worker(w: &Worker) {
    const SHORT: Duration = Duration::from_secs(10);
    let (_server, s) = store(w);
    let c = Box::new(TcpCommunicator::new(&s, "fail", w.rank, w.world_size, SHORT).expect("communicator"));
    let mut e = ZeroEngine::new(make_params(7), c, overlap(2, 8), ADAM).expect("zero");
    let t0 = std::time::Instant::now();
    let f64_grad = |p: &Tensor| Tensor::zeros(p.dims().to_vec(), DType::F64, &Device::Cpu).unwrap();
    let failure = train_with_failing_backward(&mut e, 4, 1, 1, CLIP, &f64_grad).expect("every step but rank 1's backward at step 1");
    let secs = t0.elapsed().as_secs_f64();
    assert!(secs < SHORT.as_secs_f64(), "rank {}: 4 steps took {secs} s, a rank waited on a missing collective", w.rank);
    assert_eq!(failure.is_some(), w.rank == 1);
    if let Some(f) = failure {
        println!("FAILED {f}");
    }
    let st = e.stats().lock().unwrap().clone();
    let buckets = e.layout().shard_len.div_ceil((8 / w.world_size).max(1)) as u64;
    assert_eq!(st.reduce_scatters, 4 * buckets, "rank {}: every bucket of every step, the failed one included", w.rank);
    println!("PARAMS0 {}", bits(&flat_values(e.parameters())));
}

#[test]
fn zero2_overlap_comm_failing_backward_on_one_rank_hangs_no_rank() {
    for world in [2usize, 3] {
        if let Some(w) = worker() {
            overlap_failure_worker(&w);
            return;
        }
        let rs = run_ok("zero2_overlap_comm_failing_backward_on_one_rank_hangs_no_rank", world, &[]);
        check_identical(&rs, 1);
        let failed = rs[1].lines_with("FAILED ");
        eprintln!("world {world}: {}", failed.join(""));
        assert!(failed.len() == 1 && failed[0].to_lowercase().contains("f64"), "rank 1's error says what it found: {failed:?}");
    }
}

/// Writes the parameters (rank 0), the state file (rank 0) and every rank's shard.
fn save(dir: &Path, e: &ZeroEngine, w: &Worker) -> PathBuf {
    let ckpt = dir.join(format!("step_{}.safetensors", e.adam_step()));
    save_optimizer_shard(&ckpt, w.rank, &e.optimizer_state().expect("state")).expect("save shard");
    if w.rank == 0 {
        std::fs::write(dir.join("params.txt"), bits(&flat_values(e.parameters()))).expect("params");
        let st = TrainState {
            position: Position::default(),
            optimizer: Vec::new(),
            optimizer_shards: Some(w.world_size),
            scheduler_steps: 0,
            scaler: None,
            rng: Rng::new(0),
            rank_rngs: Vec::new(),
        };
        save_state(&state_path(&ckpt), &st).expect("save state");
    }
    ckpt
}

fn load_params(dir: &Path, params: &[(String, Tensor)]) {
    let flat = unbits(&std::fs::read_to_string(dir.join("params.txt")).expect("params"));
    let mut at = 0;
    for (_, p) in params {
        let n = p.elem_count();
        p.assign(&Tensor::from_vec(flat[at..at + n].to_vec(), p.dims().to_vec(), &Device::Cpu).expect("t")).expect("assign");
        at += n;
    }
    assert_eq!(at, flat.len());
}

fn shard_line(e: &ZeroEngine, what: &str) {
    let (m, v, p) = e.shard();
    let valid = e.layout().valid_in_shard(e.rank());
    println!("{what} {}|{}|{}", bits(&m[..valid]), bits(&v[..valid]), bits(&p[..valid]));
}

fn full_moments(rs: &[WorkerResult], key: &str) -> Vec<Vec<f32>> {
    let mut parts = vec![Vec::new(), Vec::new(), Vec::new()];
    for r in rs {
        for (j, s) in line(r, key).split('|').enumerate() {
            parts[j].extend(unbits(s));
        }
    }
    parts
}

/// Uninterrupted (saving at step 5 on the way) or resumed from step 5, by `ZERO_MODE`.
fn resume_worker(w: &Worker) {
    let dir = PathBuf::from(std::env::var("ZERO_DIR").expect("ZERO_DIR"));
    let stage: u8 = std::env::var("ZERO_STAGE").expect("stage").parse().expect("stage");
    let (_server, s) = store(w);
    let mut e = zero(&s, w, "resume", opts(stage, 8));
    let run = Run { first_step: 0, steps: 5, accum: 1, clip: CLIP, lr: 0.01 };
    if std::env::var("ZERO_MODE").as_deref() == Ok("first") {
        train(&mut e, run, None, &|_, _| {}).expect("steps 0-4");
        save(&dir, &e, w);
        shard_line(&e, "MOMENTS5");
    } else {
        let ckpt = dir.join("step_5.safetensors");
        let st = load_state(&state_path(&ckpt)).expect("load state and shards");
        let shards: Vec<OptimizerState> = st.optimizer;
        load_params(&dir, e.parameters());
        e.load_optimizer_state(&shards).expect("load the shards");
        shard_line(&e, "MOMENTS5");
        assert_eq!(e.adam_step(), 5);
    }
    train(&mut e, Run { first_step: 5, ..run }, None, &|_, _| {}).expect("steps 5-9");
    println!("PARAMS0 {}", bits(&flat_values(e.parameters())));
    shard_line(&e, "MOMENTS10");
}

#[test]
fn checkpoint_resume_same_world_is_bitwise_and_other_worlds_reshard() {
    if let Some(w) = worker() {
        resume_worker(&w);
        return;
    }
    for stage in [1u8, 2] {
        let dir = std::env::temp_dir().join(format!("zero_resume_{}_{stage}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let env = |mode: &str| vec![("ZERO_DIR", dir.display().to_string()), ("ZERO_STAGE", stage.to_string()), ("ZERO_MODE", mode.to_string())];
        let name = "checkpoint_resume_same_world_is_bitwise_and_other_worlds_reshard";
        let first = run_ok(name, 2, &env("first"));
        check_identical(&first, 1);
        for r in 0..2 {
            assert!(dir.join(format!("step_5.state.rank{r}.safetensors")).exists(), "rank {r} saved its shard");
        }
        let (m5, m10, p10) = (full_moments(&first, "MOMENTS5"), full_moments(&first, "MOMENTS10"), unbits(&line(&first[0], "PARAMS0")));
        assert_eq!(m5[0].len(), 53, "the shards hold 53 elements without padding");
        let same = run_ok(name, 2, &env("resume"));
        assert_eq!(line(&same[0], "PARAMS0"), line(&first[0], "PARAMS0"), "stage {stage}: resuming at 2 ranks continues bitwise");
        assert_eq!(full_moments(&same, "MOMENTS10"), m10, "stage {stage}: moments after the resumed run are bitwise those of the uninterrupted one");
        for world in [3usize, 1] {
            let rs = run_ok(name, world, &env("resume"));
            check_identical(&rs, 1);
            assert_eq!(full_moments(&rs, "MOMENTS5"), m5, "stage {stage}: 2 -> {world} ranks re-shards exp_avg, exp_avg_sq and master exactly");
            let (got_p, got_m) = (unbits(&line(&rs[0], "PARAMS0")), full_moments(&rs, "MOMENTS10"));
            let (rp, rm, rv) = (max_rel(&got_p, &p10), max_rel(&got_m[0], &m10[0]), max_rel(&got_m[1], &m10[1]));
            eprintln!("stage {stage} resumed at {world} ranks: parameters {rp:e}, exp_avg {rm:e}, exp_avg_sq {rv:e} from the uninterrupted 2-rank run");
            assert!(rp < 1e-5 && rm < 1e-4 && rv < 1e-4, "stage {stage} 2 -> {world}: parameters {rp:e}, moments {rm:e} {rv:e}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[path = "train_common/mod.rs"]
mod train_common;

fn ds_json(dir: &Path, stage: u8) -> PathBuf {
    // The tiny train.yaml has accum_grad 1, grad_clip 5, log_interval 1000.
    let p = dir.join(format!("ds_stage{stage}.json"));
    let text = format!(
        r#"{{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 5, "steps_per_print": 1000, "zero_optimization": {{"stage": {stage}, "reduce_bucket_size": 1000, "allgather_bucket_size": 777}}}}"#
    );
    std::fs::write(&p, text).expect("write ds json");
    p
}

fn state_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("model dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".state"))
        .collect();
    v.sort();
    v
}

#[test]
fn deepspeed_train_saves_model_only_or_its_shards_and_equals_torch_ddp_on_one_process() {
    let dir = train_common::tmpdir("zero_model_only");
    let mut args = train_common::setup(&dir, 4, &train_common::tiny_yaml(0.0, 2, 1, ""));
    let plain = asrforge::train::run_train(&args).expect("torch_ddp run");
    let want = flat_values(plain.engine.parameters());
    for (stage, states) in [(2u8, "model_only"), (1, "model+optimizer")] {
        args.model_dir = dir.join(format!("ds{stage}"));
        args.tensorboard_dir = dir.join(format!("ds{stage}/tb"));
        args.train_engine = "deepspeed".into();
        args.deepspeed_config = Some(ds_json(&dir, stage));
        args.deepspeed_save_states = states.into();
        let exec = asrforge::train::run_train(&args).expect("deepspeed run");
        let got = flat_values(exec.engine.parameters());
        let rel = max_rel(&got, &want);
        assert!(rel < 1e-5, "stage {stage} on one process vs torch_ddp: {rel:e}");
        assert!(exec.engine.sharded_state());
        let files = state_files(&args.model_dir);
        if states == "model_only" {
            assert!(files.is_empty(), "model_only writes no optimizer or resume state, found {files:?}");
        } else {
            for tag in ["init", "epoch_0"] {
                for f in [format!("{tag}.state.safetensors"), format!("{tag}.state.rank0.safetensors")] {
                    assert!(files.contains(&f), "model+optimizer writes {f}, found {files:?}");
                }
            }
        }
        // The model file loads into a fresh model with nothing of the engine.
        let ckpt = args.model_dir.join("epoch_0.safetensors");
        let root = asrforge::train::read_config(&args.model_dir.join("train.yaml"), &[]).expect("saved yaml");
        let cfg = asrforge::train::parse_train_config(&root).expect("cfg");
        let load = asrforge::train::TrainArgs { checkpoint: Some(ckpt), train_engine: "torch_ddp".into(), ..args.clone() };
        let (model, resume) = asrforge::train::init_model(&load, &cfg).expect("load the model file");
        assert_eq!(resume.state.is_some(), states != "model_only");
        use asrforge::nn::Module;
        assert_eq!(flat_values(&model.named_parameters()), got, "the saved model is the trained one, in full precision");
    }
}

/// `run_train` in this worker with the engine and save mode of the environment.
fn train_cli_worker(w: &Worker) {
    let dir = PathBuf::from(std::env::var("JOB_DIR").expect("JOB_DIR"));
    let engine = std::env::var("JOB_ENGINE").expect("JOB_ENGINE");
    let mut args = train_common::args(&dir, &engine);
    args.train_data = dir.join("train.list");
    args.cv_data = dir.join("train.list");
    if engine != "torch_ddp" {
        args.train_engine = "deepspeed".into();
        args.deepspeed_config = Some(dir.join(format!("{engine}.json")));
        args.deepspeed_save_states = std::env::var("JOB_SAVE").expect("JOB_SAVE");
    }
    let exec = asrforge::train::run_train(&args).unwrap_or_else(|e| panic!("rank {}: {e}", w.rank));
    assert_eq!(exec.engine.world_size(), 2);
    println!("STEPS {}", exec.history.len());
    println!("PARAMS0 {}", bits(&flat_values(exec.engine.parameters())));
}

#[test]
fn deepspeed_stage_1_and_2_in_run_train_over_2_processes_equal_torch_ddp() {
    if let Some(w) = worker() {
        train_cli_worker(&w);
        return;
    }
    let dir = train_common::tmpdir("zero_train_2proc");
    train_common::setup(&dir, 20, &train_common::tiny_yaml(0.0, 1, 1, ""));
    // Utterances with a one-token transcript (every one fits CTC), 12 of them: 6 steps per rank.
    let lines: Vec<String> = std::fs::read_to_string(dir.join("data.list")).expect("list").lines().step_by(5).map(str::to_string).cycle().take(12).collect();
    std::fs::write(dir.join("train.list"), lines.join("\n") + "\n").expect("train list");
    let name = "deepspeed_stage_1_and_2_in_run_train_over_2_processes_equal_torch_ddp";
    let job = |engine: &str, save: &str| {
        run_ok(name, 2, &[("JOB_DIR", dir.display().to_string()), ("JOB_ENGINE", engine.to_string()), ("JOB_SAVE", save.to_string())])
    };
    let ddp = job("torch_ddp", "");
    check_identical(&ddp, 1);
    let want = unbits(&line(&ddp[0], "PARAMS0"));
    assert_eq!(line(&ddp[0], "STEPS"), "6");
    for (stage, save) in [(1u8, "model+optimizer"), (2, "model_only")] {
        let engine = format!("ds_stage{stage}");
        assert_eq!(ds_json(&dir, stage), dir.join(format!("{engine}.json")));
        let rs = job(&engine, save);
        check_identical(&rs, 1);
        assert_eq!(line(&rs[0], "STEPS"), "6");
        let rel = max_rel(&unbits(&line(&rs[0], "PARAMS0")), &want);
        eprintln!("run_train over 2 processes, ZeRO stage {stage} vs torch_ddp: max relative difference {rel:e}");
        assert!(rel < 1e-5, "stage {stage}: {rel:e}");
        let files = state_files(&dir.join(&engine));
        if save == "model_only" {
            assert!(files.is_empty(), "{files:?}");
        } else {
            for f in ["epoch_0.state.safetensors", "epoch_0.state.rank0.safetensors", "epoch_0.state.rank1.safetensors"] {
                assert!(files.iter().any(|x| x == f), "missing {f} in {files:?}");
            }
        }
    }
}
