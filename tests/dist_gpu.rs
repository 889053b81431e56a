//! The GPU engines (DDP, ZeRO stage 1 and 2) with their parameters on the
//! device, in real processes on 127.0.0.1 over the TCP communicator (the
//! emulated device under `ASRFORGE_CUDA_EMU=1`, whose device memory is host
//! memory; on a GPU the same code stages through the host). NCCL is not
//! exercised here (see `scripts/gpu-run.sh`).
//!
//! - 2 ranks with accumulation 2 and 3 ranks without: DDP and ZeRO-1/2 on
//!   the device, every rank seeded differently (the initial broadcast makes
//!   them equal), end within 1e-5 of one CPU process that takes the whole
//!   global batch (the CPU dist tests' tolerance), with the clip acting;
//!   every rank ends bitwise equal; host synchronisations per step are
//!   counted and bounded.
//! - ZeRO-1/2 with collectives on device tensors (NCCL's way, over a TCP
//!   stand-in that refuses host buckets): bitwise the host-staged engine,
//!   with and without `overlap_comm`, in f32, f16 and bf16.
//! - `run_train` with `--device cuda` at 2 ranks whose data gives 2 and 4
//!   batches: both stop after 2 steps (the join group stays on the CPU).

mod common;
mod dist_common;
mod train_common;
mod zero_common;

use asrforge::dist::{Communicator, ReduceOp, Store, StoreServer, TcpCommunicator};
use asrforge::engine::{Ddp, Engine, SingleProcess, ZeroEngine, ZeroOptions};
use asrforge::optim::AdamConfig;
use asrforge::tensor::{DType, Device};
use dist_common::{worker, Worker, WorkerResult};
use std::path::PathBuf;
use std::time::Duration;
use zero_common::*;

const TIMEOUT: Duration = Duration::from_secs(60);
const ADAM: AdamConfig = AdamConfig { lr: 0.01, betas: (0.9, 0.999), eps: 1e-8, weight_decay: 0.0, decoupled: false };
const CLIP: f64 = 0.05;
const STEPS: u64 = 10;

fn store(w: &Worker) -> (Option<StoreServer>, Store) {
    let addr = format!("{}:{}", w.master_addr, w.master_port);
    let server = (w.rank == 0).then(|| StoreServer::start(&addr, &w.token).expect("start store"));
    (server, Store::connect(&addr, &w.token, w.rank, TIMEOUT).expect("connect store"))
}

fn comm(s: &Store, w: &Worker, prefix: &str) -> Box<TcpCommunicator> {
    Box::new(TcpCommunicator::new(s, prefix, w.rank, w.world_size, TIMEOUT).expect("communicator"))
}

/// Where every device worker starts: its device, the rendezvous store (the
/// server on rank 0), the run, one CPU process's run of it with the whole
/// batch (its outcomes and final parameters), and this rank's seed: rank r
/// starts from seed 7 + r, so only an engine's initial broadcast makes the
/// ranks agree (and equal seed 7, the single process's).
struct Start {
    dev: Device,
    _server: Option<StoreServer>,
    s: Store,
    run: Run,
    single_out: Vec<asrforge::engine::StepOutcome>,
    want: Vec<f32>,
    seed: u64,
}

fn start(w: &Worker, name: &str, accum: usize) -> Start {
    let dev = common::gpu::gpu(name).expect("the parent checked for a GPU");
    let (_server, s) = store(w);
    let run = Run { first_step: 0, steps: STEPS, accum, clip: CLIP, lr: 0.01 };
    let mut single = SingleProcess::new(make_params(7), ADAM).expect("single");
    let single_out = train(&mut single, run, None, &|_, _| {}).expect("single-process run");
    let want = flat_values(single.parameters());
    Start { dev, _server, s, run, single_out, want, seed: 7 + w.rank as u64 }
}

/// The zero_common model with rank-dependent values, moved to `dev`.
fn device_params(seed: u64, dev: &Device) -> Vec<(String, asrforge::Tensor)> {
    let p = make_params(seed);
    for (name, t) in &p {
        t.move_to_device(dev).unwrap_or_else(|e| panic!("moving {name} to {dev:?}: {e}"));
    }
    p
}

/// The TCP communicator declaring that it reduces device buffers, as
/// NCCL does: DDP then keeps its buckets on the device and hands them to the
/// communication thread, and ZeRO cuts, joins and gathers its buckets on the
/// device (NCCL's code paths in the engines; the TCP communicator stages
/// them through the host there). It refuses a reduce-scatter or all-gather
/// handed host tensors, so a ZeRO engine that staged its buckets through the
/// host fails here (the step's scalars may be host values).
struct DeviceSide(Box<TcpCommunicator>);

impl DeviceSide {
    fn on_device(op: &str, ts: [&asrforge::Tensor; 2]) -> asrforge::Result<()> {
        match ts.iter().find(|t| t.device() == Device::Cpu) {
            Some(t) => Err(asrforge::Error::invalid("DeviceSide", format!("{op}: expected device tensors, got a host tensor of {} elements", t.elem_count()))),
            None => Ok(()),
        }
    }
}

impl Communicator for DeviceSide {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn world_size(&self) -> usize {
        self.0.world_size()
    }
    fn timeout(&self) -> Duration {
        self.0.timeout()
    }
    fn set_timeout(&mut self, t: Duration) {
        self.0.set_timeout(t)
    }
    fn all_reduce(&mut self, t: &asrforge::Tensor, op: ReduceOp) -> asrforge::Result<()> {
        self.0.all_reduce(t, op)
    }
    fn broadcast(&mut self, t: &asrforge::Tensor, root: usize) -> asrforge::Result<()> {
        self.0.broadcast(t, root)
    }
    fn all_gather(&mut self, i: &asrforge::Tensor, o: &asrforge::Tensor) -> asrforge::Result<()> {
        Self::on_device("all_gather", [i, o])?;
        self.0.all_gather(i, o)
    }
    fn reduce_scatter(&mut self, i: &asrforge::Tensor, o: &asrforge::Tensor, op: ReduceOp) -> asrforge::Result<()> {
        Self::on_device("reduce_scatter", [i, o])?;
        self.0.reduce_scatter(i, o, op)
    }
    fn barrier(&mut self) -> asrforge::Result<()> {
        self.0.barrier()
    }
    fn device_collectives(&self) -> bool {
        true
    }
}

fn bits(v: &[f32]) -> String {
    v.iter().map(|x| format!("{:08x}", x.to_bits())).collect::<Vec<_>>().join(",")
}

fn counters() -> asrforge::backend::cuda::Counters {
    asrforge::backend::cuda::device(0).expect("cuda:0").counters()
}

fn host_syncs() -> u64 {
    asrforge::backend::cuda::device(0).expect("cuda:0").counters().host_syncs
}

/// Trains DDP and ZeRO-1/2 on the device and checks them against one CPU process.
fn engines_worker(w: &Worker, accum: usize) {
    let Start { dev, _server, s, run, single_out, want, seed } = start(w, "engines_worker", accum);
    assert!(max_rel(&want, &flat_values(&make_params(7))) > 1e-2, "training moves the parameters");
    let mut engines: Vec<(String, Box<dyn Engine>)> = Vec::new();
    let ddp = Ddp::new(device_params(seed, &dev), &[], ADAM, comm(&s, w, "ddp"), 64).expect("ddp on the device");
    println!("BUCKETS {}", ddp.stats().lock().unwrap().bucket_numels.len());
    engines.push(("ddp".into(), Box::new(ddp)));
    let dev_side = Box::new(DeviceSide(comm(&s, w, "ddp-dev")));
    engines.push(("ddp-dev".into(), Box::new(Ddp::new(device_params(seed, &dev), &[], ADAM, dev_side, 64).expect("ddp, device buckets"))));
    for stage in [1u8, 2] {
        let o = ZeroOptions { stage, reduce_bucket_size: 8, allgather_bucket_size: 11, overlap_comm: false };
        let e = ZeroEngine::new(device_params(seed, &dev), comm(&s, w, &format!("zero{stage}")), o, ADAM).expect("zero on the device");
        assert!(e.on_device(), "stage {stage}: the shard lives on the device");
        engines.push((format!("zero{stage}"), Box::new(e)));
    }
    for (name, e) in &mut engines {
        let before = host_syncs();
        let outs = train(e.as_mut(), run, None, &|_, _| {}).expect("device run");
        let syncs = host_syncs() - before;
        for (_, p) in e.parameters() {
            assert_eq!(p.device(), dev, "{name}: parameters stay on the device");
        }
        let got = flat_values(e.parameters());
        let rel = max_rel(&got, &want);
        println!("REL {name} world {} accum {accum}: vs one CPU process {rel:e}; host syncs {syncs} in {STEPS} steps", w.world_size);
        println!("SYNCS {name} {syncs}");
        assert!(rel < 1e-5, "{name} on the device vs one CPU process with the whole batch: {rel:e}");
        for (k, (z, r)) in outs.iter().zip(&single_out).enumerate() {
            assert!(z.grad_norm > CLIP, "{name} step {k}: the clip must act, norm {} <= {CLIP}", z.grad_norm);
            assert!((z.grad_norm - r.grad_norm).abs() / r.grad_norm < 1e-5, "{name} step {k}: norm {} vs single-process {}", z.grad_norm, r.grad_norm);
            assert!(!z.skipped);
        }
        println!("PARAMS{name} {}", bits(&got));
    }
}

/// Panics with every failed rank's stderr (the first failure is often not rank 0's).
fn all_ok(rs: Vec<WorkerResult>) -> Vec<WorkerResult> {
    let failed: Vec<String> = rs
        .iter()
        .filter(|r| !r.output.status.success())
        .map(|r| {
            let err = r.stderr();
            let tail: Vec<&str> = err.lines().filter(|l| !l.starts_with(' ') && !l.starts_with('(') && !l.starts_with(')')).collect();
            format!("rank {} ({:?}):\n{}", r.rank, r.output.status, tail[tail.len().saturating_sub(15)..].join("\n"))
        })
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    rs
}

fn line(r: &WorkerResult, key: &str) -> String {
    let v = r.lines_with(&format!("{key} "));
    assert_eq!(v.len(), 1, "rank {} printed {key} {} times\n{}", r.rank, v.len(), r.stdout());
    v[0].clone()
}

/// A test run as `ranks` processes: in a worker, `work` with `accum`
/// micro-batches; in the parent (where there is a GPU), the workers spawned
/// and, when every one succeeded, their results checked by `check`.
fn on_ranks(name: &str, ranks: usize, accum: usize, work: fn(&Worker, usize), check: &dyn Fn(&[WorkerResult])) {
    if let Some(w) = worker() {
        work(&w, accum);
        return;
    }
    if common::gpu::gpu(name).is_none() {
        return;
    }
    check(&all_ok(dist_common::spawn(name, ranks, &[], &|_| Vec::new())));
}

/// Every rank printed the same `PARAMS<name>` line for each of `names`.
fn check_identical(rs: &[WorkerResult], names: &[&str]) {
    for name in names {
        let first = line(&rs[0], &format!("PARAMS{name}"));
        for r in rs {
            assert_eq!(line(r, &format!("PARAMS{name}")), first, "{name}: rank {} ends with other parameters than rank 0", r.rank);
        }
    }
}

fn check_engines(rs: &[WorkerResult], accum: u64) {
    for name in ["ddp", "ddp-dev", "zero1", "zero2"] {
        let first = line(&rs[0], &format!("PARAMS{name}"));
        for r in rs {
            assert_eq!(line(r, &format!("PARAMS{name}")), first, "{name}: rank {} ends with other parameters than rank 0", r.rank);
        }
    }
    eprintln!("{}", rs[0].lines_with("REL ").join("\n"));
    for r in rs {
        // DDP: each bucket comes to the host once in every step's
        // synchronising backward, and Adam's fused step reads its outcome
        // once; the earlier micro-batches of an accumulation communicate
        // nothing. ZeRO: one flat gradient copy per reduction (every
        // micro-batch for stage 2, the last one for stage 1), then one norm
        // read and one master-shard copy per step. The loss stays on the
        // device (the test never reads it), so these are all.
        let buckets: u64 = line(r, "BUCKETS").parse().unwrap();
        assert!(buckets > 1, "several buckets");
        let got = |k: &str| -> u64 { line(r, &format!("SYNCS {k}")).parse().unwrap() };
        assert_eq!(got("ddp"), STEPS * (buckets + 1), "rank {}: DDP's host synchronisations in {STEPS} steps of {buckets} buckets", r.rank);
        // Device buckets: the used flags of every bucket in one read, Adam's
        // outcome in one; the TCP communicator under them then stages each
        // bucket through the host on the communication thread (NCCL would not).
        assert_eq!(got("ddp-dev"), STEPS * (buckets + 2), "rank {}: DDP with device buckets", r.rank);
        assert_eq!(got("zero1"), STEPS * 3, "rank {}: ZeRO-1's host synchronisations in {STEPS} steps", r.rank);
        assert_eq!(got("zero2"), STEPS * (accum + 2), "rank {}: ZeRO-2's host synchronisations in {STEPS} steps of {accum} micro-batches", r.rank);
    }
}

#[test]
fn gpu_ddp_and_zero_equal_one_process_at_2_ranks() {
    on_ranks("gpu_ddp_and_zero_equal_one_process_at_2_ranks", 2, 2, engines_worker, &|rs| check_engines(rs, 2));
}

#[test]
fn gpu_ddp_and_zero_equal_one_process_at_3_ranks() {
    on_ranks("gpu_ddp_and_zero_equal_one_process_at_3_ranks", 3, 1, engines_worker, &|rs| check_engines(rs, 1));
}

/// DDP on the device with the bucket all-reduce in f16 and in bf16
/// (`--fp16_grad_sync`), with host buckets (the TCP communicator's path)
/// and device buckets (NCCL's path, the cast on the GPU): within the bound
/// derived from the half type's rounding of one CPU process with the whole
/// batch, off DDP with the f32 all-reduce by more than f32 rounding, and
/// with exactly as many host synchronisations as the f32 all-reduce.
fn half_sync_worker(w: &Worker, accum: usize) {
    let Start { dev, _server, s, run, single_out, want, seed } = start(w, "half_sync_worker", accum);
    for device_buckets in [false, true] {
        let c = |prefix: &str| -> Box<dyn Communicator> {
            let prefix = format!("{prefix}-{device_buckets}");
            if device_buckets {
                Box::new(DeviceSide(comm(&s, w, &prefix)))
            } else {
                comm(&s, w, &prefix)
            }
        };
        let mut full = Ddp::new(device_params(seed, &dev), &[], ADAM, c("f32"), 64).expect("ddp, f32 all-reduce");
        let before = counters();
        train(&mut full, run, None, &|_, _| {}).expect("device run, f32 all-reduce");
        let full_c = counters().since(&before);
        let full = flat_values(full.parameters());
        for half in [DType::F16, DType::BF16] {
            let label = if device_buckets { "ddp-dev" } else { "ddp" };
            let mut e = Ddp::new(device_params(seed, &dev), &[], ADAM, c(half.as_str()), 64).expect("ddp").with_half_grad_sync(Some(half)).expect("half sync");
            let buckets = e.stats().lock().unwrap().bucket_numels.len() as u64;
            let before = counters();
            let outs = train(&mut e, run, None, &|_, _| {}).expect("device run, half all-reduce");
            let c = counters().since(&before);
            println!(
                "COUNT {label} {} world {}: {buckets} buckets, {STEPS} steps: launches {} (f32 all-reduce {}), device-to-host bytes {} ({}), host syncs {} ({})",
                half.as_str(),
                w.world_size,
                c.launches,
                full_c.launches,
                c.dtoh_bytes,
                full_c.dtoh_bytes,
                c.host_syncs,
                full_c.host_syncs
            );
            for (_, p) in e.parameters() {
                assert_eq!(p.device(), dev, "{label}: parameters stay on the device");
            }
            let got = flat_values(e.parameters());
            check_half_norms(label, half, w.world_size, &outs, &single_out);
            check_half_sync(label, half, w.world_size, run, ADAM.betas, &got, &want, &full);
            assert_eq!(c.host_syncs, full_c.host_syncs, "{label} in {}: host synchronisations in {STEPS} steps vs the f32 all-reduce", half.as_str());
            // Host buckets come to the host in f32 and are cast there (no
            // launch); device
            // buckets are cast on the device, so the communicator stages 2
            // bytes instead of 4 per gradient element and used flag.
            let packed: u64 = e.stats().lock().unwrap().bucket_numels.iter().sum::<usize>() as u64 + e.parameters().len() as u64;
            let saved = if device_buckets { (STEPS * 2 * packed) as i64 } else { 0 };
            assert_eq!(
                full_c.dtoh_bytes as i64 - c.dtoh_bytes as i64,
                saved,
                "{label} in {}: device-to-host bytes in {STEPS} steps vs the f32 all-reduce",
                half.as_str()
            );
            // Device buckets: a division and a cast to pack each bucket, a cast to unpack it.
            let extra = if device_buckets { STEPS * buckets * 3 } else { 0 };
            assert_eq!(c.launches, full_c.launches + extra, "{label} in {}: kernel launches in {STEPS} steps vs the f32 all-reduce", half.as_str());
            println!("PARAMS{label}{} {}", half.as_str(), bits(&got));
        }
    }
}

fn check_half_identical(rs: &[WorkerResult]) {
    check_identical(rs, &["ddpf16", "ddpbf16", "ddp-devf16", "ddp-devbf16"]);
    eprintln!("{}", rs[0].lines_with("HALF ").join("\n"));
    eprintln!("{}", rs[0].lines_with("COUNT ").join("\n"));
}

#[test]
fn gpu_ddp_half_grad_sync_is_within_half_rounding_of_one_process_at_2_ranks() {
    on_ranks("gpu_ddp_half_grad_sync_is_within_half_rounding_of_one_process_at_2_ranks", 2, 2, half_sync_worker, &check_half_identical);
}

#[test]
fn gpu_ddp_half_grad_sync_is_within_half_rounding_of_one_process_at_3_ranks() {
    on_ranks("gpu_ddp_half_grad_sync_is_within_half_rounding_of_one_process_at_3_ranks", 3, 1, half_sync_worker, &check_half_identical);
}

/// ZeRO stage 1 and 2 on the device with the gradient reduce-scatter in f16
/// and in bf16 (`--fp16_grad_sync`): within the bound derived from the half
/// type's rounding of one CPU process with the whole batch, off the f32
/// reduce-scatter by more than f32 rounding, every rank bitwise equal, the
/// reduce-scatter handed half the f32 run's bytes, and no more host
/// synchronisations than the f32 run.
fn zero_half_sync_worker(w: &Worker, accum: usize) {
    let Start { dev, _server, s, run, single_out, want, seed } = start(w, "zero_half_sync_worker", accum);
    for stage in [1u8, 2] {
        let o = ZeroOptions { stage, reduce_bucket_size: 8, allgather_bucket_size: 11, overlap_comm: false };
        let mut full = ZeroEngine::new(device_params(seed, &dev), comm(&s, w, &format!("zf32-{stage}")), o, ADAM).expect("zero on the device");
        let before = host_syncs();
        train(&mut full, run, None, &|_, _| {}).expect("device run, f32 reduce-scatter");
        let full_syncs = host_syncs() - before;
        let full_stats = full.stats().lock().unwrap().clone();
        let full = flat_values(full.parameters());
        for half in [DType::F16, DType::BF16] {
            let label = format!("zero{stage}");
            let mut e = ZeroEngine::new(device_params(seed, &dev), comm(&s, w, &format!("z{}-{stage}", half.as_str())), o, ADAM)
                .expect("zero on the device")
                .with_half_grad_sync(Some(half))
                .expect("half sync");
            assert!(e.on_device());
            let before = host_syncs();
            let outs = train(&mut e, run, None, &|_, _| {}).expect("device run, half reduce-scatter");
            let syncs = host_syncs() - before;
            for (_, p) in e.parameters() {
                assert_eq!(p.device(), dev, "{label}: parameters stay on the device");
            }
            let got = flat_values(e.parameters());
            check_half_norms(&label, half, w.world_size, &outs, &single_out);
            check_half_sync(&label, half, w.world_size, run, ADAM.betas, &got, &want, &full);
            assert_eq!(syncs, full_syncs, "{label} in {}: host synchronisations in {STEPS} steps vs the f32 reduce-scatter", half.as_str());
            let st = e.stats().lock().unwrap().clone();
            assert_eq!(st.reduce_scatters, full_stats.reduce_scatters);
            assert_eq!(2 * st.reduce_scatter_bytes, full_stats.reduce_scatter_bytes, "{label} in {}: 2 bytes per element on the wire", half.as_str());
            println!("PARAMS{label}{} {}", half.as_str(), bits(&got));
        }
    }
}

fn check_zero_half_identical(rs: &[WorkerResult]) {
    check_identical(rs, &["zero1f16", "zero1bf16", "zero2f16", "zero2bf16"]);
    eprintln!("{}", rs[0].lines_with("HALF ").join("\n"));
}

#[test]
fn gpu_zero_half_grad_sync_is_within_half_rounding_of_one_process_at_2_ranks() {
    on_ranks("gpu_zero_half_grad_sync_is_within_half_rounding_of_one_process_at_2_ranks", 2, 2, zero_half_sync_worker, &check_zero_half_identical);
}

#[test]
fn gpu_zero_half_grad_sync_is_within_half_rounding_of_one_process_at_3_ranks() {
    on_ranks("gpu_zero_half_grad_sync_is_within_half_rounding_of_one_process_at_3_ranks", 3, 1, zero_half_sync_worker, &check_zero_half_identical);
}

/// ZeRO-1/2 on the device with `overlap_comm` against the same engine
/// without it: bitwise equal parameters and norms after 10 steps in f32,
/// f16 and bf16; within 1e-5 of one CPU process in f32; every bucket
/// launched from the gradient-ready hook; and exactly one host
/// synchronisation per bucket per reduction (each bucket comes to the host
/// when it is launched) plus the step's two.
fn overlap_worker(w: &Worker, accum: usize) {
    let Start { dev, _server, s, run, single_out: _, want, seed } = start(w, "overlap_worker", accum);
    for stage in [1u8, 2] {
        for half in [None, Some(DType::F16), Some(DType::BF16)] {
            let label = format!("zero{stage}{}", half.map_or("f32", |h| h.as_str()));
            let o = ZeroOptions { stage, reduce_bucket_size: 8, allgather_bucket_size: 11, overlap_comm: false };
            let mut plain =
                ZeroEngine::new(device_params(seed, &dev), comm(&s, w, &format!("plain-{label}")), o, ADAM).unwrap().with_half_grad_sync(half).unwrap();
            let plain_outs = train(&mut plain, run, None, &|_, _| {}).expect("device run");
            let o = ZeroOptions { overlap_comm: true, ..o };
            let mut ov = ZeroEngine::new(device_params(seed, &dev), comm(&s, w, &format!("ov-{label}")), o, ADAM).unwrap().with_half_grad_sync(half).unwrap();
            assert!(ov.on_device());
            let before = host_syncs();
            let outs = train(&mut ov, run, None, &|_, _| {}).expect("device run, overlap_comm");
            let syncs = host_syncs() - before;
            for (_, p) in ov.parameters() {
                assert_eq!(p.device(), dev, "{label}: parameters stay on the device");
            }
            let (got, base) = (flat_values(ov.parameters()), flat_values(plain.parameters()));
            assert_eq!(bits(&got), bits(&base), "{label}: overlap_comm must leave the parameters bitwise equal");
            for (k, (a, b)) in outs.iter().zip(&plain_outs).enumerate() {
                assert_eq!(a.grad_norm.to_bits(), b.grad_norm.to_bits(), "{label} step {k}: gradient norm {} vs {}", a.grad_norm, b.grad_norm);
            }
            if half.is_none() {
                let rel = max_rel(&got, &want);
                assert!(rel < 1e-5, "{label}: vs one CPU process {rel:e}");
            }
            let st = ov.stats().lock().unwrap().clone();
            let buckets = ov.layout().shard_len.div_ceil((8 / w.world_size).max(1)) as u64;
            let reductions = STEPS * if stage == 2 { accum as u64 } else { 1 };
            assert_eq!(st.reduce_scatters, reductions * buckets, "{label}");
            assert_eq!(st.launched_during_backward, st.reduce_scatters, "{label}: every bucket leaves from the gradient-ready hook");
            assert_eq!(
                syncs,
                reductions * buckets + 2 * STEPS,
                "{label}: host synchronisations in {STEPS} steps of {reductions} reductions of {buckets} buckets"
            );
            println!("OVERLAP {label} world {} accum {accum}: bitwise equal, {} reduce-scatters, {syncs} host syncs", w.world_size, st.reduce_scatters);
            println!("PARAMS{label} {}", bits(&got));
        }
    }
    // A backward that fails on rank 1 (a host gradient planted in w1) still launches every bucket: nobody waits.
    const SHORT: Duration = Duration::from_secs(10);
    let c = Box::new(TcpCommunicator::new(&s, "fail", w.rank, w.world_size, SHORT).expect("communicator"));
    let o = ZeroOptions { stage: 2, reduce_bucket_size: 8, allgather_bucket_size: 11, overlap_comm: true };
    let mut e = ZeroEngine::new(device_params(seed, &dev), c, o, ADAM).expect("zero");
    let t0 = std::time::Instant::now();
    let host_grad = |p: &asrforge::Tensor| asrforge::Tensor::zeros(p.dims().to_vec(), DType::F32, &Device::Cpu).unwrap();
    let failure = train_with_failing_backward(&mut e, 4, 1, 1, CLIP, &host_grad).expect("every step but rank 1's backward at step 1");
    let secs = t0.elapsed().as_secs_f64();
    assert!(secs < SHORT.as_secs_f64(), "rank {}: 4 steps took {secs} s", w.rank);
    assert_eq!(failure.is_some(), w.rank == 1);
    if let Some(f) = failure {
        println!("FAILED {f}");
    }
    assert_eq!(e.stats().lock().unwrap().reduce_scatters, 4 * e.layout().shard_len.div_ceil((8 / w.world_size).max(1)) as u64);
    println!("PARAMSfail {}", bits(&flat_values(e.parameters())));
}

fn check_overlap(rs: &[WorkerResult]) {
    check_identical(rs, &["zero1f32", "zero1f16", "zero1bf16", "zero2f32", "zero2f16", "zero2bf16", "fail"]);
    eprintln!("{}", rs[0].lines_with("OVERLAP ").join("\n"));
    let failed = rs[1].lines_with("FAILED ");
    eprintln!("rank 1: {}", failed.join(""));
    assert_eq!(failed.len(), 1, "rank 1's backward failed once");
}

#[test]
fn gpu_zero_overlap_comm_is_bitwise_the_plain_reduction_at_2_ranks() {
    on_ranks("gpu_zero_overlap_comm_is_bitwise_the_plain_reduction_at_2_ranks", 2, 2, overlap_worker, &check_overlap);
}

#[test]
fn gpu_zero_overlap_comm_is_bitwise_the_plain_reduction_at_3_ranks() {
    on_ranks("gpu_zero_overlap_comm_is_bitwise_the_plain_reduction_at_3_ranks", 3, 1, overlap_worker, &check_overlap);
}

/// Lines of the corpus with a one-token transcript (every one fits CTC).
fn good_lines(dir: &std::path::Path, n: usize) -> Vec<String> {
    let all: Vec<String> = std::fs::read_to_string(dir.join("data.list")).unwrap().lines().map(str::to_string).collect();
    all.into_iter().enumerate().filter(|(i, _)| i % 5 == 0).map(|(_, l)| l).cycle().take(n).collect()
}

fn uneven_worker(w: &Worker) {
    let dir = PathBuf::from(std::env::var("JOB_DIR").unwrap());
    let engine = std::env::var("JOB_ENGINE").unwrap();
    let mut a = train_common::args(&dir, "exp");
    a.train_data = dir.join(format!("train{}.list", w.rank));
    a.cv_data = dir.join("cv.list");
    a.timeout = 60;
    a.device = "cuda".into();
    if engine == "deepspeed" {
        a.train_engine = "deepspeed".into();
        a.deepspeed_config = Some(dir.join("ds.json"));
    }
    let e = asrforge::train::run_train(&a).unwrap_or_else(|e| panic!("rank {}: {e}", w.rank));
    println!("STEPS {}", e.history.iter().map(|r| r.step.to_string()).collect::<Vec<_>>().join(","));
    println!("POS {} {} {}", e.position.epoch, e.position.batches, e.position.step);
    use asrforge::nn::Module;
    for (name, p) in e.model.named_parameters() {
        assert_eq!(p.device(), Device::Cuda(0), "{name} trained on the device");
    }
    println!("ENGINE {engine} on {:?}", e.model.named_parameters()[0].1.device());
    let v: Vec<f32> = e.model.named_parameters().iter().flat_map(|(_, p)| p.to_vec::<f32>().unwrap()).collect();
    println!("PARAMS {}", bits(&v));
}

fn uneven(test: &str, engine: &str) {
    if common::gpu::gpu(test).is_none() {
        return;
    }
    let dir = train_common::tmpdir(&format!("dist-gpu-uneven-{engine}"));
    train_common::setup(&dir, 5 * 12, &train_common::tiny_yaml(0.0, 1, 1, ""));
    // Rank r keeps (partitioned by index) counts[r] of the 2·counts[r] lines of its list.
    for (r, n) in [2usize, 4].into_iter().enumerate() {
        std::fs::write(dir.join(format!("train{r}.list")), good_lines(&dir, 2 * n).join("\n") + "\n").unwrap();
    }
    std::fs::write(dir.join("cv.list"), good_lines(&dir, 2).join("\n") + "\n").unwrap();
    std::fs::write(
        dir.join("ds.json"),
        r#"{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2, "reduce_bucket_size": 1000, "allgather_bucket_size": 1000}}"#,
    )
    .unwrap();
    let extra = [("JOB_DIR", dir.display().to_string()), ("JOB_ENGINE", engine.to_string())];
    // The emulator shows one device per process: each rank is a node with
    // one GPU (LOCAL_RANK 0 of 1), as on a cluster of one-GPU nodes.
    let one_gpu_nodes = |r: usize| vec![("LOCAL_RANK".into(), "0".into()), ("LOCAL_WORLD_SIZE".into(), "1".into()), ("GROUP_RANK".into(), r.to_string())];
    let rs = all_ok(dist_common::spawn(test, 2, &extra, &one_gpu_nodes));
    let params: Vec<String> = rs.iter().map(|r| line(r, "PARAMS")).collect();
    for r in &rs {
        // The first rank to run out had 2 batches: both stop after step 2, and the epoch ends.
        assert_eq!(line(r, "STEPS"), "1,2", "rank {}", r.rank);
        assert_eq!(line(r, "POS"), "1 0 2", "rank {}: finished the epoch", r.rank);
    }
    assert_eq!(params[0], params[1], "both ranks end with the same parameters");
}

#[test]
fn gpu_ddp_uneven_data_ends_the_epoch_on_every_rank() {
    if let Some(w) = worker() {
        uneven_worker(&w);
        return;
    }
    uneven("gpu_ddp_uneven_data_ends_the_epoch_on_every_rank", "torch_ddp");
}

#[test]
fn gpu_zero2_uneven_data_ends_the_epoch_on_every_rank() {
    if let Some(w) = worker() {
        uneven_worker(&w);
        return;
    }
    uneven("gpu_zero2_uneven_data_ends_the_epoch_on_every_rank", "deepspeed");
}

/// Whether `n` workers can each open `cuda:LOCAL_RANK`: on the emulator
/// always (`ASRFORGE_CUDA_EMU_DEVICES`), on GPUs when `n` are visible; says why not.
fn devices_for_launch(test: &str, n: usize) -> bool {
    let Some(_) = common::gpu::gpu(test) else { return false };
    let emulated = asrforge::backend::cuda::device(0).is_ok_and(|d| d.is_emulated());
    let visible = asrforge::backend::cuda::device_count().unwrap_or(0);
    if !emulated && visible < n {
        println!("{test}: skipped, {visible} GPU(s) visible and the launcher's {n} workers need one each");
        return false;
    }
    true
}

/// `asrforge launch --nproc_per_node {nproc} ... train --device cuda` over
/// `dir`'s `train.list` with `--timeout`, on as many emulated devices as
/// workers; stdout and stderr in `dir/launch.{out,err}`.
fn launch_gpu_train(dir: &std::path::Path, nproc: usize, timeout: u64, engine: &str) -> (std::process::Child, PathBuf) {
    let a = train_common::args(dir, "exp");
    let port = dist_common::free_port().to_string();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_asrforge"));
    let (nproc_s, timeout) = (nproc.to_string(), timeout.to_string());
    cmd.args(["launch", "--nproc_per_node", &nproc_s, "--master_port", &port, "--grace_period", "3", "train", "--dist_backend", "gloo"]);
    cmd.args(["--device", "cuda", "--num_workers", "1", "--timeout", &timeout, "--train_engine", engine]);
    if engine == "deepspeed" {
        cmd.arg("--deepspeed_config").arg(dir.join("ds.json"));
    }
    for (flag, p) in [
        ("--config", &a.config),
        ("--model_dir", &a.model_dir),
        ("--tensorboard_dir", &a.tensorboard_dir),
        ("--train_data", &dir.join("train.list")),
        ("--cv_data", &dir.join("cv.list")),
        ("--symbol_table", &dir.join("units.txt")),
    ] {
        cmd.arg(flag).arg(p);
    }
    cmd.env_remove("ASRFORGE_RDZV_TOKEN").env("ASRFORGE_CUDA_EMU_DEVICES", nproc.to_string()).stdin(std::process::Stdio::null());
    cmd.stdout(std::fs::File::create(dir.join("launch.out")).unwrap()).stderr(std::fs::File::create(dir.join("launch.err")).unwrap());
    (cmd.spawn().unwrap(), a.model_dir)
}

/// A corpus whose `train.list` gives `per_rank` batches to each of `nproc` ranks, a cv list and a ZeRO-2 JSON.
fn launch_corpus(name: &str, nproc: usize, per_rank: usize) -> train_common::TempDir {
    let dir = train_common::tmpdir(name);
    train_common::setup(&dir, 5 * 12, &train_common::tiny_yaml(0.0, 1, 1, "save_interval: 2\n"));
    std::fs::write(dir.join("train.list"), good_lines(&dir, nproc * per_rank).join("\n") + "\n").unwrap();
    std::fs::write(dir.join("cv.list"), good_lines(&dir, 4).join("\n") + "\n").unwrap();
    std::fs::write(
        dir.join("ds.json"),
        r#"{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2, "reduce_bucket_size": 1000, "allgather_bucket_size": 1000}}"#,
    )
    .unwrap();
    dir
}

/// Waits (at most 120 s) until the run in `model_dir` has saved step 2.
fn wait_for_step_2(model_dir: &std::path::Path, dir: &std::path::Path) {
    let marker = model_dir.join("step_2.yaml");
    let t0 = std::time::Instant::now();
    while !marker.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "training never reached step 2:\n{}",
            std::fs::read_to_string(dir.join("launch.err")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Signals rank 1 of a GPU job of 2 workers with `sig` once it saved step 2,
/// and checks that the launcher fails within `--timeout` + 5 s with a
/// message containing `want`, leaving no worker behind.
fn signal_gpu_job(name: &str, engine: &str, sig: &str, want: &str) {
    if !devices_for_launch(name, 2) {
        return;
    }
    const TIMEOUT: u64 = 10;
    let dir = launch_corpus(name, 2, 60);
    let (mut launcher, model_dir) = launch_gpu_train(&dir, 2, TIMEOUT, engine);
    wait_for_step_2(&model_dir, &dir);
    let workers = dist_common::workers_of(launcher.id());
    assert_eq!(workers.iter().map(|(r, _)| *r).collect::<Vec<_>>(), [0, 1], "two workers: {workers:?}");
    assert!(std::process::Command::new("kill").args([sig, &workers[1].1.to_string()]).status().unwrap().success());
    let t0 = std::time::Instant::now();
    // Bounded wait: a job that ignores the timeout is stopped by the test, which then fails.
    let status = loop {
        if let Some(s) = launcher.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > Duration::from_secs(4 * TIMEOUT) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let secs = t0.elapsed().as_secs_f64();
    if status.is_none() {
        for (_, pid) in &workers {
            let _ = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
        let _ = launcher.kill();
        let _ = launcher.wait();
    }
    let err = std::fs::read_to_string(dir.join("launch.err")).unwrap();
    println!(
        "{engine} on the device, {sig}: launcher exited {status:?} {secs:.1} s later; {}",
        err.lines().filter(|l| l.contains("rank 1")).collect::<Vec<_>>().join(" | ")
    );
    let status = status.unwrap_or_else(|| panic!("the job still ran {secs:.0} s after {sig} of rank 1 (--timeout {TIMEOUT}):\n{err}"));
    assert!(!status.success());
    assert!(secs < (TIMEOUT + 5) as f64, "the job took {secs} s to fail");
    assert!(err.contains(want), "the job names rank 1 ({want:?}):\n{err}");
    assert!(!err.contains("panicked") && !err.contains("stack backtrace"), "{err}");
    std::thread::sleep(Duration::from_millis(200));
    let left: Vec<u32> = workers.iter().map(|(_, p)| *p).filter(|p| dist_common::alive(*p)).collect();
    assert!(left.is_empty(), "workers left behind: {left:?}");
    assert!(!model_dir.join("epoch_0.yaml").exists(), "stopped mid-epoch");
}

#[test]
fn gpu_ddp_job_fails_naming_a_stopped_rank_within_the_timeout() {
    signal_gpu_job("gpu_ddp_job_fails_naming_a_stopped_rank_within_the_timeout", "torch_ddp", "-STOP", "rank 1 did not answer within 10 s");
}

#[test]
fn gpu_zero2_job_fails_naming_a_stopped_rank_within_the_timeout() {
    signal_gpu_job("gpu_zero2_job_fails_naming_a_stopped_rank_within_the_timeout", "deepspeed", "-STOP", "rank 1 did not answer within 10 s");
}

#[test]
fn gpu_ddp_job_fails_naming_a_killed_rank() {
    signal_gpu_job("gpu_ddp_job_fails_naming_a_killed_rank", "torch_ddp", "-KILL", "asrforge launch: rank 1 (");
}

#[test]
fn gpu_zero2_job_fails_naming_a_killed_rank() {
    signal_gpu_job("gpu_zero2_job_fails_naming_a_killed_rank", "deepspeed", "-KILL", "asrforge launch: rank 1 (");
}

/// The launcher's own path with `--device cuda` on 2 emulated devices: a
/// whole epoch, both workers on their own `cuda:LOCAL_RANK`.
#[test]
fn gpu_launch_trains_an_epoch_on_2_devices() {
    if !devices_for_launch("gpu_launch_trains_an_epoch_on_2_devices", 2) {
        return;
    }
    let dir = launch_corpus("gpu-launch-epoch", 2, 3);
    let (launcher, model_dir) = launch_gpu_train(&dir, 2, 30, "torch_ddp");
    let out = launcher.wait_with_output().unwrap();
    let err = std::fs::read_to_string(dir.join("launch.err")).unwrap();
    assert!(out.status.success(), "launch failed:\n{err}");
    assert!(model_dir.join("epoch_0.yaml").exists() && model_dir.join("final.safetensors").exists(), "the epoch finished:\n{err}");
}

/// The engines' own collectives honour the communicator's timeout: rank 1
/// builds the engines and then stays silent (as a hung process would) while
/// rank 0 trains; rank 0's step fails within the timeout (+ 5 s) naming
/// rank 1, for DDP's bucket all-reduce on the communication thread and for
/// ZeRO-2's reduce-scatter on the training thread.
fn silent_rank_worker(w: &Worker) {
    const SHORT: Duration = Duration::from_secs(3);
    let dev = common::gpu::gpu("silent_rank_worker").expect("the parent checked for a GPU");
    let (_server, s) = store(w);
    let c = |prefix: &str| Box::new(TcpCommunicator::new(&s, prefix, w.rank, w.world_size, SHORT).expect("communicator"));
    let o = ZeroOptions { stage: 2, reduce_bucket_size: 8, allgather_bucket_size: 11, overlap_comm: false };
    let mut engines: Vec<(&str, Box<dyn Engine>)> = vec![
        ("ddp", Box::new(Ddp::new(device_params(7, &dev), &[], ADAM, c("ddp"), 64).expect("ddp"))),
        ("zero2", Box::new(ZeroEngine::new(device_params(7, &dev), c("zero2"), o, ADAM).expect("zero"))),
    ];
    if w.rank == 1 {
        // Silent, connections open, for longer than rank 0 may wait on both engines.
        std::thread::sleep(SHORT * 2 + Duration::from_secs(12));
        return;
    }
    let run = Run { first_step: 0, steps: 3, accum: 1, clip: CLIP, lr: 0.01 };
    for (name, e) in &mut engines {
        let t0 = std::time::Instant::now();
        let err = train(e.as_mut(), run, None, &|_, _| {}).expect_err("rank 1 never answers");
        let secs = t0.elapsed().as_secs_f64();
        println!("SILENT {name} failed after {secs:.1} s: {err}");
        assert!(secs < SHORT.as_secs_f64() + 5.0, "{name}: {secs} s");
        assert!(err.to_string().contains("rank 1"), "{name}: the error names rank 1: {err}");
    }
}

#[test]
fn gpu_engine_collectives_fail_within_the_timeout_naming_a_silent_rank() {
    if let Some(w) = worker() {
        silent_rank_worker(&w);
        return;
    }
    if common::gpu::gpu("gpu_engine_collectives_fail_within_the_timeout_naming_a_silent_rank").is_none() {
        return;
    }
    let rs = all_ok(dist_common::spawn("gpu_engine_collectives_fail_within_the_timeout_naming_a_silent_rank", 2, &[], &|_| Vec::new()));
    eprintln!("{}", rs[0].lines_with("SILENT ").join("\n"));
    assert_eq!(rs[0].lines_with("SILENT ").len(), 2);
}

/// `asrforge train --dist_backend nccl` in a job of 2 (this process rank 0,
/// rendezvous `--timeout 2`): its exit status and stderr.
fn nccl_train(device: &str, emu: Option<&str>) -> (bool, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_asrforge"));
    cmd.args(["train", "--config", concat!(env!("CARGO_MANIFEST_DIR"), "/conf/tiny.yaml"), "--train_data", "none.list", "--cv_data", "none.list"]);
    cmd.args(["--model_dir", &std::env::temp_dir().join(format!("asrforge-nccl-cli-{}", std::process::id())).display().to_string()]);
    cmd.args(["--dist_backend", "nccl", "--device", device, "--timeout", "2"]);
    cmd.env("WORLD_SIZE", "2").env("RANK", "0").env("MASTER_PORT", dist_common::free_port().to_string()).env_remove("ASRFORGE_CUDA_EMU");
    if let Some(v) = emu {
        cmd.env("ASRFORGE_CUDA_EMU", v);
    }
    let out = cmd.output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).trim().to_string())
}

/// `--dist_backend nccl` where it cannot run is one line saying why and
/// what to do: on the CPU, on the emulated device, without a GPU (or, on a
/// GPU host, without NCCL). NCCL itself is not run here.
#[test]
fn dist_backend_nccl_without_a_gpu_or_nccl_is_one_clean_line() {
    let one_line = |what: &str, ok: bool, err: &str, want: &[&str]| {
        println!("{what}: {err}");
        assert!(!ok, "{what}: the run must fail");
        assert_eq!(err.lines().count(), 1, "{what}: one line:\n{err}");
        assert!(err.starts_with("error: config key `--dist_backend`: nccl"), "{what}: {err}");
        assert!(want.iter().any(|w| err.contains(w)), "{what}: expected one of {want:?} in {err}");
        assert!(!err.contains("panicked"), "{what}: {err}");
    };
    let (ok, err) = nccl_train("cpu", None);
    one_line("--device cpu", ok, &err, &["trains on the CPU (--device \"cpu\"); use --dist_backend gloo"]);
    let (ok, err) = nccl_train("cuda", Some("1"));
    one_line("the emulated device", ok, &err, &["the emulated CUDA device (ASRFORGE_CUDA_EMU=1) runs the GPU engines over --dist_backend gloo"]);
    let (ok, err) = nccl_train("cuda", None);
    if err.contains("rendezvous") || err.contains("did not") {
        // A GPU with NCCL: the checks passed and the job waited for rank 1 (2 s).
        println!("a GPU with NCCL is present; the rendezvous timed out as it should: {err}");
        assert!(!ok);
    } else {
        one_line("no GPU, or no NCCL", ok, &err, &["nccl needs a GPU (cuda:0, LOCAL_RANK) but none is usable", "NCCL was not found on the loader path"]);
    }
}

/// `Cuda(0)` where a real GPU and NCCL are usable, else `None` after saying
/// why (a failure instead under `ASRFORGE_REQUIRE_NCCL=1`, which
/// scripts/gpu-run.sh sets). The emulated device has no NCCL.
#[cfg(feature = "cuda")]
fn nccl_gpu(test: &str) -> Option<Device> {
    let why = match asrforge::backend::cuda::device(0) {
        Err(e) => format!("no usable GPU: {e}"),
        Ok(d) if d.is_emulated() => "the emulated device has no NCCL".to_string(),
        Ok(_) => match asrforge::backend::cuda::nccl::version() {
            Ok(v) => {
                println!("{test}: NCCL {v}");
                return Some(Device::Cuda(0));
            }
            Err(e) => e.to_string(),
        },
    };
    assert!(std::env::var("ASRFORGE_REQUIRE_NCCL").map_or(true, |v| v != "1"), "{test}: ASRFORGE_REQUIRE_NCCL=1 but {why}");
    println!("{test}: skipped, {why}");
    None
}

/// A world-size-1 NCCL communicator on `dev` (its own store on a free port).
#[cfg(feature = "cuda")]
fn nccl_world_1(dev: &Device, prefix: &str) -> (StoreServer, asrforge::dist::NcclComm) {
    let addr = format!("127.0.0.1:{}", dist_common::free_port());
    let server = StoreServer::start(&addr, "nccl-test").expect("store");
    let store = Store::connect(&addr, "nccl-test", 0, TIMEOUT).expect("connect");
    (server, asrforge::dist::NcclComm::new(&store, prefix, 0, 1, dev, TIMEOUT).expect("NCCL init, world size 1"))
}

/// NCCL's initialisation is bounded by the timeout: rank 0 of a job of 2
/// whose rank 1 never comes fails within the timeout (+ 5 s) with an error
/// naming rank 0 and the timeout, the communicator aborted (non-blocking
/// `ncclCommInitRankConfig`, polled), instead of waiting forever.
#[cfg(feature = "cuda")]
#[test]
fn nccl_init_without_a_peer_fails_within_the_timeout() {
    let Some(dev) = nccl_gpu("nccl_init_without_a_peer_fails_within_the_timeout") else { return };
    let addr = format!("127.0.0.1:{}", dist_common::free_port());
    let _server = StoreServer::start(&addr, "nccl-test").expect("store");
    let store = Store::connect(&addr, "nccl-test", 0, TIMEOUT).expect("connect");
    let t0 = std::time::Instant::now();
    let err = match asrforge::dist::NcclComm::new(&store, "lonely", 0, 2, &dev, Duration::from_secs(3)) {
        Ok(_) => panic!("NCCL init of a job of 2 succeeded without rank 1"),
        Err(e) => e.to_string(),
    };
    let secs = t0.elapsed().as_secs_f64();
    println!("NCCL init without a peer failed after {secs:.1} s: {err}");
    assert!(secs < 3.0 + 5.0, "{secs} s");
    assert!(err.contains("rank 0") && err.contains("3 s"), "the error names the rank and the timeout: {err}");
}

/// NCCL at world size 1 on a GPU: init, every collective on f32, f16 and
/// bf16 against its expected value (at one rank: the input itself, into
/// outputs poisoned with NaN), a grouped all-reduce, host tensors staged,
/// a size mismatch refused, then destroy.
#[cfg(feature = "cuda")]
#[test]
fn nccl_world_1_collectives_on_f32_f16_bf16() {
    use asrforge::tensor::{DType, Rng};
    let Some(dev) = nccl_gpu("nccl_world_1_collectives_on_f32_f16_bf16") else { return };
    let (_server, mut c) = nccl_world_1(&dev, "coll");
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let mut rng = Rng::new(seed);
    for dt in [DType::F32, DType::F16, DType::BF16] {
        let n = 1000 + (rng.normal(1)[0].abs() * 500.0) as usize;
        let x = asrforge::Tensor::randn([n], 0.0, 1.0, dt, &mut rng, &dev).unwrap();
        let want = x.to_f64_vec().unwrap();
        for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min] {
            let t = asrforge::ops::mul_scalar(&x, 1.0).unwrap();
            c.all_reduce(&t, op).unwrap();
            assert_eq!(t.to_f64_vec().unwrap(), want, "{dt:?} all_reduce {op:?} at world size 1 (seed {seed})");
        }
        let t = asrforge::ops::mul_scalar(&x, 1.0).unwrap();
        c.broadcast(&t, 0).unwrap();
        assert_eq!(t.to_f64_vec().unwrap(), want, "{dt:?} broadcast (seed {seed})");
        let out = asrforge::Tensor::full([n], f64::NAN, dt, &dev).unwrap();
        c.all_gather(&x, &out).unwrap();
        assert_eq!(out.to_f64_vec().unwrap(), want, "{dt:?} all_gather into a NaN-poisoned output (seed {seed})");
        let out = asrforge::Tensor::full([n], f64::NAN, dt, &dev).unwrap();
        c.reduce_scatter(&x, &out, ReduceOp::Sum).unwrap();
        assert_eq!(out.to_f64_vec().unwrap(), want, "{dt:?} reduce_scatter into a NaN-poisoned output (seed {seed})");
        let (a, b) = (asrforge::ops::mul_scalar(&x, 2.0).unwrap(), asrforge::ops::mul_scalar(&x, 1.0).unwrap());
        c.all_reduce_many(&[&a, &b], ReduceOp::Sum).unwrap();
        assert_eq!(b.to_f64_vec().unwrap(), want, "{dt:?} grouped all_reduce (seed {seed})");
        let bad = asrforge::Tensor::zeros([n + 1], dt, &dev).unwrap();
        let e = c.all_gather(&x, &bad).unwrap_err().to_string();
        assert!(e.contains("expected an output of 1 x"), "{e}");
    }
    let mut v = [1.5, -2.0, 3.25];
    c.all_reduce_f64(&mut v, ReduceOp::Sum).unwrap();
    assert_eq!(v, [1.5, -2.0, 3.25], "a host tensor staged through the device");
    c.barrier().unwrap();
    drop(c);
    println!("NCCL world size 1: every collective on f32, f16, bf16 checked, communicator destroyed (seed {seed})");
}

/// DDP and ZeRO-2 over a world-size-1 NCCL communicator on a GPU equal one
/// process on the same GPU after 20 steps (1e-5, the dist tests'
/// tolerance). The distance from one CPU process is printed beside it: the
/// GPU's own summation orders move 20 Adam steps by about 2e-5 (seen on an
/// H200), which is not the engines' doing.
#[cfg(feature = "cuda")]
#[test]
fn nccl_ddp_and_zero2_at_world_1_match_one_process_after_20_steps() {
    let Some(dev) = nccl_gpu("nccl_ddp_and_zero2_at_world_1_match_one_process_after_20_steps") else { return };
    let run = Run { first_step: 0, steps: 20, accum: 2, clip: CLIP, lr: 0.01 };
    let mut single = SingleProcess::new(device_params(7, &dev), ADAM).unwrap();
    train(&mut single, run, None, &|_, _| {}).unwrap();
    let want = flat_values(single.parameters());
    let mut cpu = SingleProcess::new(make_params(7), ADAM).unwrap();
    train(&mut cpu, run, None, &|_, _| {}).unwrap();
    println!("one GPU process vs one CPU process, 20 steps: {:e}", max_rel(&want, &flat_values(cpu.parameters())));
    let (_s1, c1) = nccl_world_1(&dev, "ddp");
    let mut ddp = Ddp::new(device_params(7, &dev), &[], ADAM, Box::new(c1), 64).unwrap();
    let (_s2, c2) = nccl_world_1(&dev, "zero2");
    let o = ZeroOptions { stage: 2, reduce_bucket_size: 8, allgather_bucket_size: 11, overlap_comm: false };
    let mut zero = ZeroEngine::new(device_params(7, &dev), Box::new(c2), o, ADAM).unwrap();
    for (name, e) in [("ddp", &mut ddp as &mut dyn Engine), ("zero2", &mut zero)] {
        train(e, run, None, &|_, _| {}).unwrap();
        let rel = max_rel(&flat_values(e.parameters()), &want);
        println!("NCCL {name} at world size 1, 20 steps: {rel:e} from one process on the same GPU");
        assert!(rel < 1e-5, "{name} over NCCL: {rel:e}");
    }
}

/// `--fp16_grad_sync` over a world-size-1 NCCL communicator on a GPU: the
/// buckets are cast to f16 / bf16 on the device, all-reduced by NCCL in
/// that type and cast back, for 20 steps; the parameters stay within the
/// bound derived from the half type's rounding (`half_sync_bound` at one
/// rank) of one process on the same GPU, and differ from DDP with the f32
/// all-reduce (the cast happened). One GPU cannot exercise the sum across
/// ranks; the emulated tests above do, over TCP.
#[cfg(feature = "cuda")]
#[test]
fn nccl_ddp_half_grad_sync_at_world_1_within_half_rounding_of_one_process() {
    let Some(dev) = nccl_gpu("nccl_ddp_half_grad_sync_at_world_1_within_half_rounding_of_one_process") else { return };
    let run = Run { first_step: 0, steps: 20, accum: 2, clip: CLIP, lr: 0.01 };
    let mut single = SingleProcess::new(device_params(7, &dev), ADAM).unwrap();
    let single_out = train(&mut single, run, None, &|_, _| {}).unwrap();
    let want = flat_values(single.parameters());
    let (_s0, c0) = nccl_world_1(&dev, "f32");
    let mut full = Ddp::new(device_params(7, &dev), &[], ADAM, Box::new(c0), 64).unwrap();
    train(&mut full, run, None, &|_, _| {}).unwrap();
    let full = flat_values(full.parameters());
    for half in [DType::F16, DType::BF16] {
        let (_s, c) = nccl_world_1(&dev, half.as_str());
        let mut ddp = Ddp::new(device_params(7, &dev), &[], ADAM, Box::new(c), 64).unwrap().with_half_grad_sync(Some(half)).unwrap();
        let outs = train(&mut ddp, run, None, &|_, _| {}).unwrap();
        let got = flat_values(ddp.parameters());
        println!("NCCL ddp {} at world size 1, 20 steps: max |Δθ| {:e} from one process on the same GPU", half.as_str(), max_abs(&got, &want));
        check_half_norms("nccl ddp", half, 1, &outs, &single_out);
        check_half_sync("nccl ddp", half, 1, run, ADAM.betas, &got, &want, &full);
    }
}

/// ZeRO-1/2 on the device with a communicator whose collectives take device
/// tensors (NCCL's way; here `DeviceSide` over TCP, which refuses host
/// buckets): the gradient buckets are cut and joined on the device, the
/// reduce-scatter outputs stay there, and the parameters are all-gathered
/// and cut there, with and without `overlap_comm`, in f32, f16 and bf16.
/// The result is bitwise the host-staged engine's (the same reductions in
/// the same order), with the same reduce-scatter count and bytes; in f32
/// within 1e-5 of one CPU process; and an inf on one rank skips the step on
/// every rank in both engines.
fn zero_device_collectives_worker(w: &Worker, accum: usize) {
    let Start { dev, _server, s, run, single_out: _, want, seed } = start(w, "zero_device_collectives_worker", accum);
    for stage in [1u8, 2] {
        for overlap_comm in [false, true] {
            for half in [None, Some(DType::F16), Some(DType::BF16)] {
                let label = format!("zero{stage}{}{}", half.map_or("f32", |h| h.as_str()), if overlap_comm { "overlap" } else { "" });
                let o = ZeroOptions { stage, reduce_bucket_size: 8, allgather_bucket_size: 11, overlap_comm };
                let mut host =
                    ZeroEngine::new(device_params(seed, &dev), comm(&s, w, &format!("host-{label}")), o, ADAM).unwrap().with_half_grad_sync(half).unwrap();
                let host_outs = train(&mut host, run, None, &|_, _| {}).expect("host-staged run");
                let dc = Box::new(DeviceSide(comm(&s, w, &format!("dev-{label}"))));
                let mut e = ZeroEngine::new(device_params(seed, &dev), dc, o, ADAM).unwrap().with_half_grad_sync(half).unwrap();
                assert!(e.on_device());
                let outs = train(&mut e, run, None, &|_, _| {}).unwrap_or_else(|err| panic!("{label}: device collectives run: {err}"));
                for (_, p) in e.parameters() {
                    assert_eq!(p.device(), dev, "{label}: parameters stay on the device");
                }
                let (got, base) = (flat_values(e.parameters()), flat_values(host.parameters()));
                assert_eq!(bits(&got), bits(&base), "{label}: device collectives must leave the parameters bitwise the host-staged engine's");
                for (k, (a, b)) in outs.iter().zip(&host_outs).enumerate() {
                    assert_eq!(a.grad_norm.to_bits(), b.grad_norm.to_bits(), "{label} step {k}: gradient norm {} vs {}", a.grad_norm, b.grad_norm);
                    assert_eq!(a.skipped, b.skipped, "{label} step {k}");
                }
                let (st, hst) = (e.stats().lock().unwrap().clone(), host.stats().lock().unwrap().clone());
                assert_eq!((st.reduce_scatters, st.reduce_scatter_bytes), (hst.reduce_scatters, hst.reduce_scatter_bytes), "{label}: the same buckets");
                assert!(st.reduce_scatters > STEPS, "{label}: several buckets per reduction ({})", st.reduce_scatters);
                if overlap_comm {
                    assert_eq!(st.launched_during_backward, st.reduce_scatters, "{label}: every bucket leaves from the gradient-ready hook");
                }
                if half.is_none() {
                    let rel = max_rel(&got, &want);
                    assert!(rel < 1e-5, "{label}: vs one CPU process {rel:e}");
                }
                // An inf that rank 1 alone plants in w1[0] (rank 0's shard)
                // skips the step on every rank: the one all-reduce of the
                // squared norms is the global inf/NaN check.
                let rank = w.rank;
                let poison = move |_: u64, params: &[(String, asrforge::Tensor)]| {
                    if rank == 1 {
                        let mut g = vec![0.0f32; params[0].1.elem_count()];
                        g[0] = f32::INFINITY;
                        let g = asrforge::Tensor::from_vec(g, params[0].1.dims().to_vec(), &Device::Cpu).unwrap().to_device(&dev).unwrap();
                        params[0].1.set_grad(Some(g)).expect("set grad");
                    }
                };
                for (which, eng) in [("host-staged", &mut host), ("device", &mut e)] {
                    let before = flat_values(eng.parameters());
                    let out = train(eng, Run { first_step: STEPS, steps: 1, ..run }, None, &poison).expect("poisoned step");
                    assert!(out[0].skipped && !out[0].grad_norm.is_finite(), "{label} {which}, rank {rank}: the poisoned step must be skipped: {:?}", out[0]);
                    assert_eq!(bits(&flat_values(eng.parameters())), bits(&before), "{label} {which}, rank {rank}: a skipped step leaves the parameters");
                }
                println!("PARAMS{label} {}", bits(&got));
            }
        }
    }
}

fn check_zero_device_collectives(rs: &[WorkerResult]) {
    let mut names = Vec::new();
    for stage in [1, 2] {
        for ov in ["", "overlap"] {
            for h in ["f32", "f16", "bf16"] {
                names.push(format!("zero{stage}{h}{ov}"));
            }
        }
    }
    check_identical(rs, &names.iter().map(String::as_str).collect::<Vec<_>>());
}

#[test]
fn gpu_zero_with_device_collectives_is_bitwise_the_host_staged_engine_at_2_ranks() {
    on_ranks(
        "gpu_zero_with_device_collectives_is_bitwise_the_host_staged_engine_at_2_ranks",
        2,
        2,
        zero_device_collectives_worker,
        &check_zero_device_collectives,
    );
}

#[test]
fn gpu_zero_with_device_collectives_is_bitwise_the_host_staged_engine_at_3_ranks() {
    on_ranks(
        "gpu_zero_with_device_collectives_is_bitwise_the_host_staged_engine_at_3_ranks",
        3,
        1,
        zero_device_collectives_worker,
        &check_zero_device_collectives,
    );
}
