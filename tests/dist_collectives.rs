//! Every collective of the TCP communicator at world sizes 1–4, with real
//! processes on loopback. Each rank's input comes from a seed the parent
//! picks fresh per run (printed); every worker recomputes the single-process
//! answer in f64 from all ranks' seeds and checks its result against it, and
//! prints a hash of its result bytes so the parent can check that every rank
//! ended with identical bits.

mod dist_common;

use asrforge::dist::{Communicator, ReduceOp, Store, StoreServer, TcpCommunicator};
use asrforge::tensor::Rng;
use asrforge::{DType, Device, Tensor};
use dist_common::{run_ok, worker, Worker};
use half::{bf16, f16};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Rank 0 hosts the store; everyone connects and joins the group `prefix`.
fn group(w: &Worker, prefix: &str) -> (Option<StoreServer>, Store, TcpCommunicator) {
    let addr = format!("{}:{}", w.master_addr, w.master_port);
    let server = (w.rank == 0).then(|| StoreServer::start(&addr, &w.token).expect("start store"));
    let store = Store::connect(&addr, &w.token, w.rank, TIMEOUT).expect("connect store");
    let comm = TcpCommunicator::new(&store, prefix, w.rank, w.world_size, TIMEOUT).expect("communicator");
    (server, store, comm)
}

/// Rank `rank`'s input of check number `check`: `n` values in [-1, 1), or
/// integers in [-1000, 1000] for i64.
fn input(base: u64, check: usize, rank: usize, n: usize, dtype: DType) -> Vec<f64> {
    let u = Rng::new(base.wrapping_add(1000 * check as u64 + rank as u64)).uniform(n);
    let v: Vec<f64> = u.iter().map(|x| 2.0 * x - 1.0).collect();
    match dtype {
        DType::I64 => v.iter().map(|x| (x * 1000.0).round()).collect(),
        // The value the tensor actually holds, so the reference starts from the same numbers.
        DType::F32 => v.iter().map(|&x| x as f32 as f64).collect(),
        DType::F16 => v.iter().map(|&x| f16::from_f64(x).to_f64()).collect(),
        DType::BF16 => v.iter().map(|&x| bf16::from_f64(x).to_f64()).collect(),
        _ => v,
    }
}

fn tensor(v: &[f64], dtype: DType) -> Tensor {
    let n = v.len();
    match dtype {
        DType::F32 => Tensor::from_vec(v.iter().map(|&x| x as f32).collect::<Vec<_>>(), vec![n], &Device::Cpu),
        DType::F64 => Tensor::from_vec(v.to_vec(), vec![n], &Device::Cpu),
        DType::F16 => Tensor::from_vec(v.iter().map(|&x| f16::from_f64(x)).collect::<Vec<_>>(), vec![n], &Device::Cpu),
        DType::BF16 => Tensor::from_vec(v.iter().map(|&x| bf16::from_f64(x)).collect::<Vec<_>>(), vec![n], &Device::Cpu),
        DType::I64 => Tensor::from_vec(v.iter().map(|&x| x as i64).collect::<Vec<_>>(), vec![n], &Device::Cpu),
        DType::U8 => panic!("no u8 inputs"),
    }
    .expect("tensor")
}

/// FNV-1a over the tensor's bytes (read through its typed elements).
fn hash(t: &Tensor) -> u64 {
    let bytes: Vec<u8> = match t.dtype() {
        DType::F32 => t.to_vec::<f32>().unwrap().iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        DType::F64 => t.to_vec::<f64>().unwrap().iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        DType::F16 => t.to_vec::<f16>().unwrap().iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        DType::BF16 => t.to_vec::<bf16>().unwrap().iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        DType::I64 => t.to_vec::<i64>().unwrap().iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::U8 => t.to_vec::<u8>().unwrap(),
    };
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// Relative tolerance of a sum in `dtype` (of the sum of magnitudes): the
/// ring rounds once per combine.
fn tolerance(dtype: DType, world: usize) -> f64 {
    let eps = match dtype {
        DType::F32 => 1e-6,
        DType::F64 => 1e-14,
        DType::F16 => 2f64.powi(-10),
        DType::BF16 => 2f64.powi(-7),
        _ => 0.0,
    };
    eps * world as f64
}

/// The single-process reduction in f64 of `inputs` (one per rank).
fn reference(inputs: &[Vec<f64>], op: ReduceOp) -> (Vec<f64>, Vec<f64>) {
    let n = inputs[0].len();
    let w = inputs.len() as f64;
    let want = (0..n)
        .map(|i| {
            let col = inputs.iter().map(|v| v[i]);
            match op {
                ReduceOp::Sum => col.sum(),
                ReduceOp::Avg => col.sum::<f64>() / w,
                ReduceOp::Max => col.fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Min => col.fold(f64::INFINITY, f64::min),
            }
        })
        .collect();
    let scale = (0..n).map(|i| inputs.iter().map(|v| v[i].abs()).sum::<f64>()).collect();
    (want, scale)
}

fn assert_close(name: &str, got: &[f64], want: &[f64], scale: &[f64], rel: f64) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    for i in 0..got.len() {
        let err = (got[i] - want[i]).abs();
        assert!(
            err <= rel * scale[i],
            "{name}: element {i} is {} but the single-process answer is {} (error {err:e}, allowed {:e})",
            got[i],
            want[i],
            rel * scale[i]
        );
    }
}

struct Checks {
    w: Worker,
    base: u64,
    n_check: usize,
}

impl Checks {
    fn next(&mut self, name: &str, t: &Tensor) {
        println!("HASH #{}/{name} {:016x}", self.n_check, hash(t));
        self.n_check += 1;
    }

    fn all_reduce(&mut self, comm: &mut TcpCommunicator, dtype: DType, n: usize, op: ReduceOp) {
        let c = self.n_check;
        let inputs: Vec<Vec<f64>> = (0..self.w.world_size).map(|r| input(self.base, c, r, n, dtype)).collect();
        let t = tensor(&inputs[self.w.rank], dtype);
        comm.all_reduce(&t, op).expect("all_reduce");
        let (want, scale) = reference(&inputs, op);
        let name = format!("all_reduce/{}/{n}/{op:?}", dtype.as_str());
        let _ = c;
        let rel = if matches!(op, ReduceOp::Sum | ReduceOp::Avg) { tolerance(dtype, self.w.world_size) } else { 0.0 };
        assert_close(&name, &t.to_f64_vec().unwrap(), &want, &scale, rel);
        self.next(&name, &t);
    }

    fn broadcast(&mut self, comm: &mut TcpCommunicator, dtype: DType, n: usize, root: usize) {
        let c = self.n_check;
        let want = input(self.base, c, root, n, dtype);
        let t = tensor(&input(self.base, c, self.w.rank, n, dtype), dtype);
        comm.broadcast(&t, root).expect("broadcast");
        let name = format!("broadcast/{}/{n}/root{root}", dtype.as_str());
        assert_eq!(t.to_f64_vec().unwrap(), want, "{name}: not rank {root}'s tensor");
        self.next(&name, &t);
    }

    fn all_gather(&mut self, comm: &mut TcpCommunicator, dtype: DType, n: usize) {
        let c = self.n_check;
        let w = self.w.world_size;
        let want: Vec<f64> = (0..w).flat_map(|r| input(self.base, c, r, n, dtype)).collect();
        let t = tensor(&input(self.base, c, self.w.rank, n, dtype), dtype);
        let out = tensor(&vec![0.0; w * n], dtype);
        comm.all_gather(&t, &out).expect("all_gather");
        let name = format!("all_gather/{}/{n}", dtype.as_str());
        assert_eq!(out.to_f64_vec().unwrap(), want, "{name}: not the ranks' inputs in rank order");
        self.next(&name, &out);
    }

    fn reduce_scatter(&mut self, comm: &mut TcpCommunicator, dtype: DType, n: usize, op: ReduceOp) {
        let c = self.n_check;
        let (w, r) = (self.w.world_size, self.w.rank);
        let inputs: Vec<Vec<f64>> = (0..w).map(|q| input(self.base, c, q, w * n, dtype)).collect();
        let t = tensor(&inputs[r], dtype);
        let before = t.to_f64_vec().unwrap();
        let out = tensor(&vec![0.0; n], dtype);
        comm.reduce_scatter(&t, &out, op).expect("reduce_scatter");
        let (want, scale) = reference(&inputs, op);
        let name = format!("reduce_scatter/{}/{n}/{op:?}", dtype.as_str());
        let rel = if matches!(op, ReduceOp::Sum | ReduceOp::Avg) { tolerance(dtype, w) } else { 0.0 };
        assert_close(&name, &out.to_f64_vec().unwrap(), &want[r * n..(r + 1) * n], &scale[r * n..(r + 1) * n], rel);
        assert_eq!(t.to_f64_vec().unwrap(), before, "{name}: the input changed");
        // Every rank holds a different segment: hash the rank into the name.
        self.next(&format!("{name}/rank{r}"), &out);
    }
}

fn collectives_body(w: Worker) {
    let base: u64 = std::env::var("SEED_BASE").expect("SEED_BASE").parse().expect("SEED_BASE");
    let (_server, _store, mut comm) = group(&w, "collectives");
    let world = w.world_size;
    let mut c = Checks { w: w.clone(), base, n_check: 0 };
    for n in [0, 1, 7, 1000, 100_003] {
        for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min] {
            c.all_reduce(&mut comm, DType::F32, n, op);
        }
    }
    for n in [1000, 100_003] {
        c.all_reduce(&mut comm, DType::F64, n, ReduceOp::Sum);
        c.all_reduce(&mut comm, DType::F64, n, ReduceOp::Avg);
    }
    for n in [7, 30_001] {
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            c.all_reduce(&mut comm, DType::I64, n, op);
        }
    }
    c.all_reduce(&mut comm, DType::F16, 1000, ReduceOp::Sum);
    c.all_reduce(&mut comm, DType::BF16, 50_001, ReduceOp::Avg);
    // Larger than one 1 MiB piece per ring segment at every world size here.
    c.all_reduce(&mut comm, DType::F32, 1_300_007, ReduceOp::Sum);
    // Many pieces per step; a requested size that is no multiple of 8 must
    // not split an f64 element.
    comm.set_chunk_bytes(4100);
    c.all_reduce(&mut comm, DType::F64, 100_003, ReduceOp::Sum);
    comm.set_chunk_bytes(4096);
    c.all_reduce(&mut comm, DType::F32, 100_003, ReduceOp::Sum);
    c.all_gather(&mut comm, DType::F32, 30_001);
    c.reduce_scatter(&mut comm, DType::F32, 30_001, ReduceOp::Sum);
    c.broadcast(&mut comm, DType::F32, 30_001, world - 1);
    comm.set_chunk_bytes(asrforge::dist::tcp::DEFAULT_CHUNK_BYTES);

    for n in [7, 300_001] {
        c.broadcast(&mut comm, DType::F32, n, world - 1);
    }
    c.broadcast(&mut comm, DType::I64, 7, world / 2);
    for n in [0, 1, 7, 25_001] {
        c.all_gather(&mut comm, DType::F32, n);
    }
    c.all_gather(&mut comm, DType::I64, 5);
    for n in [0, 1, 7, 40_001] {
        for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
            c.reduce_scatter(&mut comm, DType::F32, n, op);
        }
    }
    c.reduce_scatter(&mut comm, DType::F64, 3, ReduceOp::Min);

    // A barrier holds everyone until the last rank arrives.
    if w.rank == 0 {
        std::thread::sleep(Duration::from_millis(400));
    }
    let t0 = Instant::now();
    comm.barrier().expect("barrier");
    let waited = t0.elapsed();
    if w.rank != 0 && world > 1 {
        assert!(waited >= Duration::from_millis(300), "rank {} left the barrier after {waited:?}, before rank 0 arrived (400 ms late)", w.rank);
    }
    comm.barrier().expect("second barrier");
    println!("CHECKS {}", c.n_check);
}

fn parent(world: usize) {
    let base = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 % 1_000_000_007;
    eprintln!("world {world}: seed base {base}");
    let name = format!("collectives_world_{world}");
    let rs = run_ok(&name, world, &[("SEED_BASE", base.to_string())]);
    let per_rank: Vec<BTreeMap<String, String>> = rs
        .iter()
        .map(|r| {
            r.lines_with("HASH ")
                .iter()
                .map(|l| {
                    let (k, v) = l.rsplit_once(' ').expect("HASH name value");
                    (k.replace(&format!("/rank{}", r.rank), "/own"), v.to_string())
                })
                .collect()
        })
        .collect();
    let n: usize = rs[0].lines_with("CHECKS ")[0].parse().unwrap();
    assert!(n > 40, "only {n} checks ran");
    for (r, m) in per_rank.iter().enumerate() {
        assert_eq!(m.len(), n, "rank {r} reported {} results, expected {n}", m.len());
    }
    for (k, v) in &per_rank[0] {
        if k.contains("/own") {
            continue; // reduce_scatter: each rank holds its own segment
        }
        for (r, m) in per_rank.iter().enumerate().skip(1) {
            assert_eq!(m.get(k), Some(v), "{k}: rank {r}'s result bits differ from rank 0's");
        }
    }
}

#[test]
fn collectives_world_1() {
    if let Some(w) = worker() {
        return collectives_body(w);
    }
    parent(1);
}

#[test]
fn collectives_world_2() {
    if let Some(w) = worker() {
        return collectives_body(w);
    }
    parent(2);
}

#[test]
fn collectives_world_3() {
    if let Some(w) = worker() {
        return collectives_body(w);
    }
    parent(3);
}

#[test]
fn collectives_world_4() {
    if let Some(w) = worker() {
        return collectives_body(w);
    }
    parent(4);
}
