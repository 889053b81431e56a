//! TCP all-reduce bandwidth on loopback at world size 2: two threads of this
//! process, each owning a `TcpCommunicator` (the same sockets, framing and
//! ring as between processes). Criterion reports the tensor's bytes per
//! second — the algorithm bandwidth; at world size 2 the bus bandwidth
//! (bytes each rank sends: 2·(w − 1)/w of the tensor) is the same number.

use asrforge::dist::{Communicator, ReduceOp, Store, StoreServer, TcpCommunicator};
use asrforge::{Device, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::collections::HashMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(120);

fn zeros(n: usize) -> Tensor {
    Tensor::from_vec(vec![0f32; n], vec![n], &Device::Cpu).expect("tensor")
}

fn all_reduce(c: &mut Criterion) {
    let server = StoreServer::start("127.0.0.1:0", "bench").expect("store server");
    let addr = server.addr().to_string();
    // Rank 1 runs `iters` all-reduces of `n` elements per request.
    let (go, requests) = mpsc::channel::<(usize, u64)>();
    let (done, finished) = mpsc::channel::<()>();
    let a1 = addr.clone();
    let peer = std::thread::spawn(move || {
        let store = Store::connect(&a1, "bench", 1, TIMEOUT).expect("rank 1 store");
        let mut comm = TcpCommunicator::new(&store, "bench", 1, 2, TIMEOUT).expect("rank 1 communicator");
        let mut tensors: HashMap<usize, Tensor> = HashMap::new();
        while let Ok((n, iters)) = requests.recv() {
            let t = tensors.entry(n).or_insert_with(|| zeros(n));
            for _ in 0..iters {
                comm.all_reduce(t, ReduceOp::Sum).expect("rank 1 all_reduce");
            }
            let _ = done.send(());
        }
    });
    let store = Store::connect(&addr, "bench", 0, TIMEOUT).expect("rank 0 store");
    let mut comm = TcpCommunicator::new(&store, "bench", 0, 2, TIMEOUT).expect("rank 0 communicator");

    let mut g = c.benchmark_group("tcp_all_reduce_world2_f32");
    g.sample_size(10);
    for mb in [1usize, 4, 16, 64] {
        let bytes = mb << 20;
        let n = bytes / 4;
        let t = zeros(n);
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_with_input(BenchmarkId::from_parameter(format!("{mb}MB")), &n, |b, &n| {
            b.iter_custom(|iters| {
                go.send((n, iters)).expect("rank 1 is gone");
                let t0 = Instant::now();
                for _ in 0..iters {
                    comm.all_reduce(&t, ReduceOp::Sum).expect("rank 0 all_reduce");
                }
                finished.recv().expect("rank 1 is gone");
                t0.elapsed()
            })
        });
    }
    g.finish();
    drop(go);
    let _ = peer.join();
}

criterion_group!(benches, all_reduce);
criterion_main!(benches);
