//! The stream-aware caching allocator on the device (the emulated one in
//! CI, `ASRFORGE_CUDA_EMU=1`): a block another stream used
//! (`CudaStorage::record_stream`) and that was then freed is handed to no
//! request while that stream's event is pending, and is reused once the
//! event completes; without `record_stream` the emulator's stream-order
//! check catches the reuse, naming both streams; a request from another
//! stream gets only that stream's blocks; a single-stream sequence records
//! no event and reuses every block; out of memory, the pool waits for its
//! pending blocks, frees them and retries. Staged uploads (whose staging
//! buffers belong to the copy stream) keep every batch across slot growth,
//! a block the compute stream read being reused by the copy stream.
//!
//! Pending work is staged with the emulator's stream hold
//! (`CudaDevice::emu_hold_stream`: a held stream's events report "not
//! finished"), and the out-of-memory path with its memory limit; on a GPU
//! only the single-stream and staged-upload tests run. The tests share one
//! device, its counters and its pool, so they run one at a time.
#![cfg(feature = "cuda")]

mod common;

use asrforge::backend::cpu::CpuStorage;
use asrforge::backend::cuda::{self, CudaDevice, CudaStorage};
use asrforge::tensor::Rng;
use asrforge::DType;
use common::gpu::gpu;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

static SERIAL: Mutex<()> = Mutex::new(());

/// 3000 f32: 12000 bytes, the 12288-byte size class.
const N: usize = 3000;
const CLASS: usize = 12288;

fn seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
}

/// A test's device, its second stream and the test lock. Dropping it
/// lifts the stream hold and the memory limit (also when the test fails)
/// before the lock is released.
struct Ctx {
    dev: Arc<CudaDevice>,
    side: usize,
    _guard: MutexGuard<'static, ()>,
}

impl Drop for Ctx {
    fn drop(&mut self) {
        let _ = self.dev.emu_hold_stream(self.side, false);
        let _ = self.dev.emu_limit_memory(None);
    }
}

/// The device with the test lock held, its cache emptied, and a second
/// stream of it (made once); None (after printing why) where there is no
/// device. The hold, the limit and the race check are the emulator's: on a
/// GPU the tests that need them (`emulator_only`) skip.
fn device(test: &str, emulator_only: bool) -> Option<Ctx> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    gpu(test)?;
    let dev = cuda::device(0).unwrap();
    if emulator_only && !dev.is_emulated() {
        println!("{test}: skipped, it stages pending work with the emulator's stream hold");
        return None;
    }
    static SIDE: OnceLock<usize> = OnceLock::new();
    let side = *SIDE.get_or_init(|| dev.new_stream().unwrap());
    dev.empty_cache().unwrap();
    Some(Ctx { dev, side, _guard: guard })
}

/// Random f32 values and a device copy of them (made on the compute stream).
fn random(dev: &Arc<CudaDevice>, rng: &mut Rng, n: usize) -> (Vec<f32>, CudaStorage) {
    let v: Vec<f32> = rng.normal(n).into_iter().map(|x| x as f32).collect();
    let s = CudaStorage::from_cpu(dev, &CpuStorage::F32(v.clone())).unwrap();
    (v, s)
}

fn host(s: &CudaStorage) -> Vec<f32> {
    match s.to_cpu().unwrap() {
        CpuStorage::F32(v) => v,
        other => panic!("expected f32, found {:?}", other.dtype()),
    }
}

/// A fresh compute-stream block that `side` writes (after waiting for the
/// compute stream's fill), as a copy or a collective on another stream does.
fn written_on(dev: &Arc<CudaDevice>, side: usize, src: &CudaStorage, record: bool) -> CudaStorage {
    let a = dev.alloc(DType::F32, N).unwrap();
    dev.record_event(0).unwrap().wait_on(side).unwrap();
    a.copy_from_on(src, side).unwrap();
    if record {
        a.record_stream(side).unwrap();
    }
    a
}

#[test]
fn a_block_used_on_a_second_stream_is_not_reused_until_its_event_completes() {
    let Some(ctx) = device("a_block_used_on_a_second_stream_is_not_reused_until_its_event_completes", true) else { return };
    let (dev, side) = (&ctx.dev, ctx.side);
    let s = seed();
    let mut rng = Rng::new(s);
    let (_, src) = random(dev, &mut rng, N);
    let a = written_on(dev, side, &src, true);
    assert_eq!(a.stream(), 0);
    let addr = a.address();
    // The side stream's copy is still running (as far as queries can tell).
    dev.emu_hold_stream(side, true).unwrap();
    let pending = dev.pool_stats().pending;
    let before = dev.counters();
    drop(a);
    // A compute request of the same class does not get it: a fresh block.
    // (Without `record_stream` it would, and its poison fill on the compute
    // stream would be reported as a race with the side stream's copy.)
    let b = dev.alloc(DType::F32, N).unwrap();
    let c2 = dev.alloc(DType::F32, N).unwrap();
    assert!(b.address() != addr && c2.address() != addr, "a pending block was handed out");
    let d = dev.counters().since(&before);
    assert_eq!((d.driver_allocs, d.pool_reuses, d.host_syncs), (2, 0, 0), "{d:?}");
    assert_eq!(dev.pool_stats().pending, pending + CLASS, "the freed block waits for the side stream's event");
    // The side stream's work completes: the next request reuses the block.
    dev.emu_hold_stream(side, false).unwrap();
    let before = dev.counters();
    let c = dev.alloc(DType::F32, N).unwrap();
    let d = dev.counters().since(&before);
    assert_eq!(c.address(), addr, "the block returns to the compute stream's free list once its event completed");
    assert_eq!((d.driver_allocs, d.pool_reuses, d.host_syncs), (0, 1, 0), "{d:?}");
    assert_eq!(dev.pool_stats().pending, pending);
    // And the compute stream may use it.
    let (want, src2) = random(dev, &mut rng, N);
    c.copy_from(&src2).unwrap();
    assert_eq!(host(&c), want, "seed {s}");
    drop((b, c2));
}

#[test]
fn without_record_stream_the_emulator_catches_the_reuse_naming_both_streams() {
    let Some(ctx) = device("without_record_stream_the_emulator_catches_the_reuse_naming_both_streams", true) else { return };
    let (dev, side) = (&ctx.dev, ctx.side);
    let mut rng = Rng::new(seed());
    let (_, src) = random(dev, &mut rng, N);
    let a = written_on(dev, side, &src, false);
    let addr = a.address();
    drop(a);
    // The block went straight back to the compute stream's list: the next
    // request gets it, and its first use on the compute stream (the poison
    // fill, or the copy) races with the side stream's copy.
    let r = dev.alloc(DType::F32, N).and_then(|b| {
        assert_eq!(b.address(), addr);
        b.copy_from(&src).map(|_| b)
    });
    let e = r.expect_err("reusing a block another stream used, with no event, must fail on the emulator").to_string();
    assert!(e.contains("stream-order race") && e.contains("on stream 0") && e.contains(&format!("stream {side} touched")), "{e}");
    // The host waiting for the side stream orders it; the block is usable again.
    dev.record_event(side).unwrap().synchronize().unwrap();
    let b = dev.alloc(DType::F32, N).unwrap();
    assert_eq!(b.address(), addr);
    b.copy_from(&src).unwrap();
}

#[test]
fn a_request_from_another_stream_gets_only_that_streams_blocks() {
    let Some(ctx) = device("a_request_from_another_stream_gets_only_that_streams_blocks", true) else { return };
    let (dev, side) = (&ctx.dev, ctx.side);
    let s = seed();
    let mut rng = Rng::new(s);
    let (want, src) = random(dev, &mut rng, N);
    let x = dev.alloc(DType::F32, N).unwrap();
    let xa = x.address();
    drop(x);
    let before = dev.counters();
    let y = dev.alloc_on_stream(DType::F32, N, side).unwrap();
    assert_eq!((y.stream(), dev.counters().since(&before).driver_allocs), (side, 1));
    assert_ne!(y.address(), xa, "a compute-stream block was handed to the side stream");
    let ya = y.address();
    dev.record_event(0).unwrap().wait_on(side).unwrap();
    y.copy_from_on(&src, side).unwrap();
    // Used on its own stream only: free at once, no event.
    drop(y);
    assert_eq!(dev.pool_stats().pending, 0);
    let z = dev.alloc_on_stream(DType::F32, N, side).unwrap();
    assert_eq!(z.address(), ya);
    let w = dev.alloc(DType::F32, N).unwrap();
    assert_eq!(w.address(), xa);
    // The compute stream reads the side stream's block after its event.
    dev.record_event(0).unwrap().wait_on(side).unwrap();
    z.copy_from_on(&src, side).unwrap();
    dev.record_event(side).unwrap().wait_on(0).unwrap();
    z.record_stream(0).unwrap();
    w.copy_from(&z).unwrap();
    assert_eq!(host(&w), want, "seed {s}");
    // Dropped, it waits for the compute stream's event, then returns to the side stream's list.
    drop(z);
    assert_eq!(dev.pool_stats().pending, CLASS);
    let again = dev.alloc_on_stream(DType::F32, N, side).unwrap();
    assert_eq!((again.address(), dev.pool_stats().pending), (ya, 0));
}

#[test]
fn a_single_stream_sequence_records_no_event_and_reuses_every_block() {
    let Some(ctx) = device("a_single_stream_sequence_records_no_event_and_reuses_every_block", false) else { return };
    let (dev, _side) = (&ctx.dev, ctx.side);
    let s = seed();
    let mut rng = Rng::new(s);
    let v: Vec<f32> = rng.normal(N).into_iter().map(|x| x as f32).collect();
    let input = CpuStorage::F32(v.clone());
    let run = || {
        let before = dev.counters();
        let x = CudaStorage::from_cpu(dev, &input).unwrap();
        let y = x.try_clone().unwrap();
        let z = dev.zeros(DType::F64, N).unwrap();
        drop(x);
        assert_eq!(dev.pool_stats().pending, 0);
        let got = host(&y);
        drop((y, z));
        assert_eq!(dev.pool_stats().pending, 0);
        (got, dev.counters().since(&before))
    };
    let (got, first) = run();
    assert_eq!(got, v, "seed {s}");
    assert_eq!((first.driver_allocs, first.pool_reuses, first.host_syncs), (3, 0, 1), "{first:?}");
    let (got, second) = run();
    assert_eq!(got, v, "seed {s}");
    assert_eq!((second.driver_allocs, second.pool_reuses, second.host_syncs, second.driver_frees), (0, 3, 1, 0), "{second:?}");
}

/// `record_stream` of a number that is not one of the device's streams (below
/// 64, so a bit of the mask, but never made) is an error naming it, and the
/// mask is left alone: when the storage drops, its block is free at once and
/// the next request of its size gets it (an event on a stream that does not
/// exist could not be recorded, and the block would never be reused).
#[test]
fn record_stream_of_a_stream_the_device_lacks_is_refused_and_the_block_comes_back() {
    let Some(ctx) = device("record_stream_of_a_stream_the_device_lacks_is_refused_and_the_block_comes_back", false) else { return };
    let (dev, side) = (&ctx.dev, ctx.side);
    let mut rng = Rng::new(seed());
    let (_, x) = random(dev, &mut rng, N);
    let xa = x.address();
    // The tests make two streams besides the compute stream (theirs and the copy stream).
    assert!(side < 40);
    for bogus in [40, 63, 64, 1000] {
        let err = x.record_stream(bogus).expect_err("a stream the device lacks").to_string();
        assert!(err.contains(&format!("found {bogus}")) && err.contains("expected a stream of cuda:0"), "{err}");
    }
    x.record_stream(0).unwrap();
    drop(x);
    assert_eq!(dev.pool_stats().pending, 0, "no event was waited for");
    let again = dev.alloc(DType::F32, N).unwrap();
    assert_eq!(again.address(), xa, "the block came back to the compute stream's list");
}

#[test]
fn out_of_memory_waits_for_pending_blocks_frees_them_and_retries() {
    let Some(ctx) = device("out_of_memory_waits_for_pending_blocks_frees_them_and_retries", true) else { return };
    let (dev, side) = (&ctx.dev, ctx.side);
    let s = seed();
    let mut rng = Rng::new(s);
    let (want, src) = random(dev, &mut rng, N);
    // Room for exactly one more block of the class.
    let (free, total) = dev.mem_info().unwrap();
    dev.emu_limit_memory(Some(total - free + CLASS)).unwrap();
    let a = written_on(dev, side, &src, true);
    dev.emu_hold_stream(side, true).unwrap();
    drop(a);
    assert_eq!(dev.pool_stats().pending, CLASS);
    // The device is full and the one cached block is pending: the pool waits
    // for its event (a host wait), synchronises the compute stream, frees it
    // and retries.
    let before = dev.counters();
    let b = dev.alloc(DType::F32, N).unwrap();
    let d = dev.counters().since(&before);
    assert_eq!((d.host_syncs, d.driver_frees, d.driver_allocs, d.pool_reuses), (2, 1, 1, 0), "{d:?}");
    assert_eq!(dev.pool_stats().pending, 0);
    b.copy_from(&src).unwrap();
    assert_eq!(host(&b), want, "seed {s}");
    // Nothing cached left: the next request is out of memory, with the pool's state.
    let e = dev.alloc(DType::F32, N).expect_err("the limit leaves no room").to_string();
    assert!(e.contains("CUDA out of memory") && e.contains(&format!("tried to allocate {} bytes", N * 4)), "{e}");
}

#[test]
fn staged_uploads_keep_every_batch_while_their_slots_grow() {
    let Some(ctx) = device("staged_uploads_keep_every_batch_while_their_slots_grow", false) else { return };
    let (dev, _side) = (&ctx.dev, ctx.side);
    let s = seed();
    let mut rng = Rng::new(s);
    let mut kept = Vec::new();
    // Two slots used in turn: slot 0 grows from 4096 to 131072 elements and
    // frees its 16 KiB block, which slot 1 takes when it grows from 128 to
    // 4096: the copy stream writes a block the compute stream read, which
    // the compute stream's event (`record_stream` on the staging buffer)
    // must order first.
    for n in [3000usize, 100, 70_000, 3000, 140_000, 1, 9000] {
        let v: Vec<f32> = rng.normal(n).into_iter().map(|x| x as f32).collect();
        let out = cuda::upload_staged(dev, &CpuStorage::F32(v.clone())).unwrap();
        kept.push((v, out));
    }
    for (v, out) in &kept {
        assert_eq!(&host(out), v, "seed {s}");
    }
}
