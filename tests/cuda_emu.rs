//! The emulated CUDA device (`ASRFORGE_CUDA_EMU=1`, set here before the
//! first device use): its cuBLAS and cuBLASLt against a naive column-major
//! reference written from the definitions (every transpose, leading
//! dimensions above the rows, batch strides including 0, f32/f64/f16/bf16,
//! TF32, the bias epilogue), guard bytes catching a write past a buffer, the
//! seam's counters on a known sequence of operations, and `asrforge info`.
//!
//! The tests share one device and its counters, so they run one at a time.
#![cfg(feature = "cuda")]

use asrforge::backend::cpu::CpuStorage;
use asrforge::backend::cuda::blas::{self, GemmSpec};
use asrforge::backend::cuda::blaslt::{self, MatrixLayout};
use asrforge::backend::cuda::{self, kernels, CudaDevice, CudaStorage, LaunchConfig};
use asrforge::tensor::Rng;
use asrforge::{DType, Device};
use half::{bf16, f16};
use std::sync::{Arc, Mutex, MutexGuard};

static SERIAL: Mutex<()> = Mutex::new(());

/// The emulated device, with the test lock held. Fails (never skips) when
/// the build has no emulated modules: the emulator is what these tests check.
fn emu() -> (MutexGuard<'static, ()>, Arc<CudaDevice>) {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("ASRFORGE_CUDA_EMU", "1");
    let dev = cuda::device(0).unwrap_or_else(|e| panic!("the emulated device must open (ASRFORGE_CUDA_EMU=1): {e}"));
    assert!(dev.is_emulated(), "ASRFORGE_CUDA_EMU=1 must give the emulated device");
    (guard, dev)
}

fn seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
}

/// Host values of `dt` (rounded from `v`) and their exact f64 values.
fn host(dt: DType, v: &[f64]) -> (CpuStorage, Vec<f64>) {
    match dt {
        DType::F64 => (CpuStorage::F64(v.to_vec()), v.to_vec()),
        DType::F32 => {
            let x: Vec<f32> = v.iter().map(|&a| a as f32).collect();
            let e = x.iter().map(|&a| a as f64).collect();
            (CpuStorage::F32(x), e)
        }
        DType::F16 => {
            let x: Vec<f16> = v.iter().map(|&a| f16::from_f32(a as f32)).collect();
            let e = x.iter().map(|a| a.to_f64()).collect();
            (CpuStorage::F16(x), e)
        }
        DType::BF16 => {
            let x: Vec<bf16> = v.iter().map(|&a| bf16::from_f32(a as f32)).collect();
            let e = x.iter().map(|a| a.to_f64()).collect();
            (CpuStorage::BF16(x), e)
        }
        other => panic!("no host values for {other:?}"),
    }
}

fn values(s: &CudaStorage) -> Vec<f64> {
    match s.to_cpu().expect("download") {
        CpuStorage::F64(v) => v,
        CpuStorage::F32(v) => v.iter().map(|&a| a as f64).collect(),
        CpuStorage::F16(v) => v.iter().map(|a| a.to_f64()).collect(),
        CpuStorage::BF16(v) => v.iter().map(|a| a.to_f64()).collect(),
        other => panic!("not a float storage: {other:?}"),
    }
}

/// Relative tolerance of one output: the output's rounding plus the f32 accumulation.
fn tol(dt: DType) -> f64 {
    match dt {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        DType::F16 => 2f64.powi(-10),
        _ => 2f64.powi(-7),
    }
}

fn tf32(x: f64) -> f64 {
    let b = (x as f32).to_bits();
    let r = b.wrapping_add(0xFFF + ((b >> 13) & 1)) & !0x1FFF;
    f32::from_bits(r) as f64
}

/// C[i](r, j) = Σ_l op(A[i])(r, l)·op(B[i])(l, j), straight from cuBLAS's definition.
fn reference(s: &GemmSpec, a: &[f64], b: &[f64], c0: &[f64], round: impl Fn(f64) -> f64) -> (Vec<f64>, Vec<f64>) {
    let mut c = c0.to_vec();
    let mut mag = vec![0.0; c0.len()];
    for i in 0..s.batch {
        for j in 0..s.n {
            for r in 0..s.m {
                let (mut acc, mut abs) = (0.0, 0.0);
                for l in 0..s.k {
                    let av = if s.trans_a { a[i * s.stride_a + l + r * s.lda] } else { a[i * s.stride_a + r + l * s.lda] };
                    let bv = if s.trans_b { b[i * s.stride_b + j + l * s.ldb] } else { b[i * s.stride_b + l + j * s.ldb] };
                    acc += round(av) * round(bv);
                    abs += (round(av) * round(bv)).abs();
                }
                c[i * s.stride_c + r + j * s.ldc] = acc;
                mag[i * s.stride_c + r + j * s.ldc] = abs;
            }
        }
    }
    (c, mag)
}

/// Half the spacing of `dt`'s subnormals: below its smallest normal the
/// rounding of the result is absolute, not relative (f16: 2⁻²⁴ apart, so a
/// result of 1e-6 may move by 3e-8, 3 % of itself).
fn subnormal_half_step(dt: DType) -> f64 {
    match dt {
        DType::F16 => 2f64.powi(-25),
        DType::BF16 => 2f64.powi(-134),
        _ => 1e-30,
    }
}

fn check(what: &str, dt: DType, got: &[f64], want: &[f64], mag: &[f64]) {
    for (i, ((&g, &w), &m)) in got.iter().zip(want).zip(mag).enumerate() {
        let ok = !g.is_nan() && (g - w).abs() <= tol(dt) * (w.abs() + m) + subnormal_half_step(dt);
        assert!(ok, "{what}: element {i}: got {g}, expected {w} (|terms| {m}, {dt:?})");
    }
}

fn run_gemm(dev: &Arc<CudaDevice>, dt: DType, s: &GemmSpec, rng: &mut Rng, tf: bool) {
    let (ra, ca) = if s.trans_a { (s.k, s.m) } else { (s.m, s.k) };
    let (rb, cb) = if s.trans_b { (s.n, s.k) } else { (s.k, s.n) };
    let len = |stride: usize, rows: usize, cols: usize, ld: usize| (s.batch - 1) * stride + (cols - 1) * ld + rows;
    let (ha, ea) = host(dt, &rng.normal(len(s.stride_a, ra, ca, s.lda)));
    let (hb, eb) = host(dt, &rng.normal(len(s.stride_b, rb, cb, s.ldb)));
    // C starts as sentinels: the padding rows (ld > m) and the gaps between
    // batches must keep them.
    let (hc, ec) = host(dt, &vec![7.0; len(s.stride_c, s.m, s.n, s.ldc)]);
    let (a, b, c) = (CudaStorage::from_cpu(dev, &ha).unwrap(), CudaStorage::from_cpu(dev, &hb).unwrap(), CudaStorage::from_cpu(dev, &hc).unwrap());
    blas::gemm_strided_batched(s, &a, &b, &c).unwrap_or_else(|e| panic!("{s:?} {dt:?}: {e}"));
    let round = |x: f64| if tf { tf32(x) } else { x };
    let (want, mag) = reference(s, &ea, &eb, &ec, round);
    check(&format!("gemm {s:?} {dt:?} tf32={tf}"), dt, &values(&c), &want, &mag);
}

#[test]
fn emulated_cublas_gemm_matches_the_column_major_definition() {
    let (_g, dev) = emu();
    let mut rng = Rng::new(seed());
    for dt in [DType::F64, DType::F32, DType::F16, DType::BF16] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let (m, n, k, batch) = (5, 7, 9, 3);
            let (ra, rb) = (if ta { k } else { m }, if tb { n } else { k });
            // ld above the rows everywhere, and strides past one matrix.
            let (lda, ldb, ldc) = (ra + 3, rb + 2, m + 4);
            let ca = if ta { m } else { k };
            let cb = if tb { k } else { n };
            let s = GemmSpec { trans_a: ta, trans_b: tb, m, n, k, lda, ldb, ldc, stride_a: lda * ca + 5, stride_b: ldb * cb + 1, stride_c: ldc * n + 3, batch };
            run_gemm(&dev, dt, &s, &mut rng, false);
            // A shared over the batch (stride 0), tight leading dimensions.
            let s0 = GemmSpec { lda: ra, ldb: rb, ldc: m, stride_a: 0, stride_b: rb * cb, stride_c: m * n, ..s };
            run_gemm(&dev, dt, &s0, &mut rng, false);
            // B shared, one row/column edge cases.
            let s1 = GemmSpec { m: 1, n: 33, k: 1, lda: 1, ldb: if tb { 33 } else { 1 }, ldc: 1, stride_a: 1, stride_b: 0, stride_c: 33, batch: 2, ..s };
            run_gemm(&dev, dt, &s1, &mut rng, false);
        }
    }
    // A product large enough for the parallel path.
    let big = GemmSpec { trans_a: true, trans_b: false, m: 70, n: 90, k: 130, lda: 131, ldb: 130, ldc: 71, stride_a: 0, stride_b: 0, stride_c: 0, batch: 1 };
    run_gemm(&dev, DType::F32, &big, &mut rng, false);
    // TF32: inputs rounded to a 10-bit mantissa, accumulated in f32.
    blas::set_allow_tf32(true);
    let s = GemmSpec { trans_a: false, trans_b: true, m: 6, n: 4, k: 50, lda: 8, ldb: 5, ldc: 6, stride_a: 0, stride_b: 0, stride_c: 0, batch: 1 };
    run_gemm(&dev, DType::F32, &s, &mut rng, true);
    blas::set_allow_tf32(false);
}

#[test]
fn emulated_gemm_rejects_what_cublas_rejects() {
    let (_g, dev) = emu();
    let z = |n| CudaStorage::from_cpu(&dev, &CpuStorage::F32(vec![0.0; n])).unwrap();
    let (a, b, c) = (z(64), z(64), z(64));
    // lda below the rows of the stored A.
    let s = GemmSpec { trans_a: false, trans_b: false, m: 4, n: 4, k: 4, lda: 3, ldb: 4, ldc: 4, stride_a: 0, stride_b: 0, stride_c: 0, batch: 1 };
    let e = blas::gemm_strided_batched(&s, &a, &b, &c).unwrap_err().to_string();
    assert!(e.contains("leading dimension"), "{e}");
    // A buffer too small for the batch strides.
    let s = GemmSpec { lda: 4, stride_c: 50, batch: 2, ..s };
    let e = blas::gemm_strided_batched(&s, &a, &b, &c).unwrap_err().to_string();
    assert!(e.contains("C holds 64 elements"), "{e}");
}

#[test]
fn emulated_cublaslt_matmul_with_bias_matches_the_definition() {
    let (_g, dev) = emu();
    let mut rng = Rng::new(seed());
    for dt in [DType::F64, DType::F32, DType::F16, DType::BF16] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            for with_bias in [false, true] {
                let (m, n, k) = (6, 5, 11);
                let al = if ta { MatrixLayout { rows: k, cols: m, ld: k + 2 } } else { MatrixLayout { rows: m, cols: k, ld: m + 1 } };
                let bl = if tb { MatrixLayout { rows: n, cols: k, ld: n + 3 } } else { MatrixLayout { rows: k, cols: n, ld: k } };
                let dl = MatrixLayout { rows: m, cols: n, ld: m + 2 };
                let size = |l: MatrixLayout| (l.cols - 1) * l.ld + l.rows;
                let (ha, ea) = host(dt, &rng.normal(size(al)));
                let (hb, eb) = host(dt, &rng.normal(size(bl)));
                let (hd, ed) = host(dt, &vec![7.0; size(dl)]);
                let (hbias, ebias) = host(dt, &rng.normal(m));
                let up = |h: &CpuStorage| CudaStorage::from_cpu(&dev, h).unwrap();
                let (a, b, d, bias) = (up(&ha), up(&hb), up(&hd), up(&hbias));
                blaslt::matmul_raw((ta, &a, al), (tb, &b, bl), (&d, dl), with_bias.then_some(&bias)).unwrap();
                let s = GemmSpec { trans_a: ta, trans_b: tb, m, n, k, lda: al.ld, ldb: bl.ld, ldc: dl.ld, stride_a: 0, stride_b: 0, stride_c: 0, batch: 1 };
                let (mut want, mut mag) = reference(&s, &ea, &eb, &ed, |x| x);
                if with_bias {
                    for j in 0..n {
                        for r in 0..m {
                            want[r + j * dl.ld] += ebias[r];
                            mag[r + j * dl.ld] += ebias[r].abs();
                        }
                    }
                }
                check(&format!("lt {dt:?} ta={ta} tb={tb} bias={with_bias}"), dt, &values(&d), &want, &mag);
            }
        }
    }
}

#[test]
fn linear_bias_and_matmul_equal_the_cpu_on_the_emulated_device() {
    let (_g, dev) = emu();
    let mut rng = Rng::new(seed());
    let (m, n, k) = (9, 13, 17);
    let (x, w, bias) = (rng.normal(m * k), rng.normal(n * k), rng.normal(n));
    let up = |v: &[f64]| CudaStorage::from_cpu(&dev, &CpuStorage::F64(v.to_vec())).unwrap();
    let y = values(&blaslt::linear_bias(&up(&x), &up(&w), &up(&bias), m, n, k).unwrap());
    for r in 0..m {
        for c in 0..n {
            let want: f64 = (0..k).map(|l| x[r * k + l] * w[c * k + l]).sum::<f64>() + bias[c];
            assert!((y[r * n + c] - want).abs() <= 1e-12 * (1.0 + want.abs()), "y[{r},{c}] = {}, expected {want}", y[r * n + c]);
        }
    }
}

#[test]
fn a_write_past_a_buffer_is_caught_by_its_guard_naming_the_kernel() {
    let (_g, dev) = emu();
    let n = 100usize;
    let x = CudaStorage::from_cpu(&dev, &CpuStorage::F32(vec![1.5; n + 1])).unwrap();
    let y = dev.alloc(DType::F64, n).unwrap();
    // The cast kernel told one element more than y holds writes 8 bytes past its end.
    let e = kernels::cast::cast(&dev, DType::F32, DType::F64, LaunchConfig::for_elems(n + 1), &x, &y, n as i64 + 1).unwrap_err().to_string();
    assert!(e.contains("cast/cast_f32_f64"), "the error must name the kernel: {e}");
    assert!(e.contains("800 bytes"), "the error must name the buffer's size: {e}");
    assert!(e.contains("past its end"), "{e}");
    // Dropping y (back to the pool) checks its guard and keeps the fault;
    // the next synchronisation reports it, once.
    drop(y);
    let e = dev.synchronize().unwrap_err().to_string();
    assert!(e.contains("800 bytes") && e.contains("cast/cast_f32_f64"), "{e}");
    dev.synchronize().expect("a fault is reported once");
    // The same launch within bounds passes and leaves every guard intact.
    let y2 = dev.alloc(DType::F64, n + 1).unwrap();
    kernels::cast::cast(&dev, DType::F32, DType::F64, LaunchConfig::for_elems(n + 1), &x, &y2, n as i64 + 1).unwrap();
    assert_eq!(values(&y2), vec![1.5; n + 1]);
}

#[test]
fn the_seam_counts_launches_syncs_bytes_and_allocations() {
    let (_g, dev) = emu();
    std::env::remove_var("ASRFORGE_CUDA_SYNC");
    let n = 1000usize;
    let host_x = CpuStorage::F32((0..n).map(|i| i as f32).collect());
    let run = || {
        let before = dev.counters();
        let x = CudaStorage::from_cpu(&dev, &host_x).unwrap(); // 1 alloc, 4000 B up, no wait
        let y = cuda::cast::to_dtype(&x, DType::F64).unwrap(); // 1 alloc, 1 launch
        let back = y.to_cpu().unwrap(); // 8000 B down, 1 sync
        let ev = dev.record_event(0).unwrap();
        ev.synchronize().unwrap(); // 1 sync
        dev.synchronize().unwrap(); // 1 sync
        let CpuStorage::F64(v) = back else { panic!("expected f64") };
        assert_eq!(v[999], 999.0);
        drop((x, y));
        dev.counters().since(&before)
    };
    let first = run();
    assert_eq!((first.launches, first.gemms, first.host_syncs), (1, 0, 3), "{first:?}");
    assert_eq!((first.htod_copies, first.htod_bytes, first.dtoh_copies, first.dtoh_bytes), (1, 4000, 1, 8000), "{first:?}");
    assert_eq!(first.driver_allocs + first.pool_reuses, 2, "{first:?}");
    // The same sequence again reuses both blocks: no driver allocation.
    let second = run();
    assert_eq!((second.driver_allocs, second.pool_reuses, second.launches, second.host_syncs), (0, 2, 1, 3), "{second:?}");
    assert!(second.peak_bytes >= 4096 + 8192, "{second:?}");
    // A product counts as a launch and a GEMM.
    let before = dev.counters();
    let z = CudaStorage::from_cpu(&dev, &CpuStorage::F32(vec![1.0; 64])).unwrap();
    let s = GemmSpec { trans_a: false, trans_b: false, m: 8, n: 8, k: 8, lda: 8, ldb: 8, ldc: 8, stride_a: 0, stride_b: 0, stride_c: 0, batch: 1 };
    let c = dev.alloc(DType::F32, 64).unwrap();
    blas::gemm_strided_batched(&s, &z, &z, &c).unwrap();
    let d = dev.counters().since(&before);
    assert_eq!((d.launches, d.gemms, d.host_syncs, d.htod_bytes), (1, 1, 0, 256), "{d:?}");
    assert_eq!(values(&c), vec![8.0; 64]);
    // Batches through the staging slots (copy stream, events): after the
    // slots exist, uploads make the host wait for nothing and allocate
    // nothing from the driver.
    let batch = CpuStorage::F32(vec![0.25; 3000]);
    for _ in 0..2 {
        cuda::upload_staged(&dev, &batch).unwrap();
    }
    let before = dev.counters();
    for _ in 0..5 {
        drop(cuda::upload_staged(&dev, &batch).unwrap());
    }
    let d = dev.counters().since(&before);
    assert_eq!((d.host_syncs, d.driver_allocs, d.htod_copies, d.dtod_bytes), (0, 0, 5, 5 * 12_000), "{d:?}");
    assert_eq!(values(&cuda::upload_staged(&dev, &batch).unwrap()), vec![0.25; 3000]);
}

/// Scalars read back later (`ScalarReadback`, what a training step's
/// losses take): starting one queues a gather launch per dtype among them
/// and one copy, and waits for nothing; reading it waits only while its copy
/// has not run (here: the compute stream held, as a GPU still running it
/// would be), and after a synchronisation that covered it, not at all. The
/// values are the inputs' own, exactly (f64 holds every float dtype), also
/// with more read-backs in flight than the free list keeps, read out of order.
#[test]
fn scalars_read_back_later_wait_only_for_a_copy_still_running() {
    let (_g, dev) = emu();
    let s = seed();
    let mut rng = Rng::new(s);
    let dtypes = [DType::F32, DType::F16, DType::F64, DType::BF16, DType::F32];
    let draw = |rng: &mut Rng| -> (Vec<CudaStorage>, Vec<f64>) {
        let (mut xs, mut want) = (Vec::new(), Vec::new());
        for dt in dtypes {
            let (h, e) = host(dt, &[rng.normal(1)[0] * 100.0]);
            xs.push(CudaStorage::from_cpu(&dev, &h).unwrap());
            want.extend(e);
        }
        (xs, want)
    };
    let start = |xs: &[CudaStorage]| cuda::ScalarReadback::start(&xs.iter().collect::<Vec<_>>()).unwrap();
    // Held: the copy has not run as far as the host can tell, so reading waits once.
    let (xs, want) = draw(&mut rng);
    dev.emu_hold_stream(0, true).unwrap();
    let before = dev.counters();
    let r = start(&xs);
    let d = dev.counters().since(&before);
    assert_eq!((d.launches, d.host_syncs, d.dtoh_copies, d.dtoh_bytes), (4, 0, 1, 8 * 5), "start: a gather per dtype, one copy, no wait: {d:?}");
    let before = dev.counters();
    assert_eq!(r.values().unwrap(), want, "seed {s}");
    assert_eq!(dev.counters().since(&before).host_syncs, 1, "reading a copy still running waits for it");
    // Held, then a synchronisation (the optimizer step's read-back): reading costs nothing more.
    let (xs, want) = draw(&mut rng);
    dev.emu_hold_stream(0, true).unwrap();
    let r = start(&xs);
    dev.synchronize().unwrap();
    let before = dev.counters();
    assert_eq!(r.values().unwrap(), want, "seed {s}");
    let d = dev.counters().since(&before);
    assert_eq!((d.host_syncs, d.launches, d.dtoh_copies), (0, 0, 0), "read after a synchronisation: {d:?}");
    // Many in flight at once, each with its own buffer, read in reverse order.
    let batches: Vec<_> = (0..20).map(|_| draw(&mut rng)).collect();
    dev.emu_hold_stream(0, true).unwrap();
    let rs: Vec<_> = batches.iter().map(|(xs, _)| start(xs)).collect();
    dev.synchronize().unwrap();
    for (i, (r, (_, want))) in rs.into_iter().zip(&batches).enumerate().rev() {
        assert_eq!(&r.values().unwrap(), want, "read-back {i} of 20, seed {s}");
    }
}

#[test]
fn the_emulated_device_is_available_and_named_by_info() {
    let (_g, _dev) = emu();
    assert!(Device::available().contains(&Device::Cuda(0)));
    assert_eq!(Device::parse("cuda").unwrap(), Device::Cuda(0));
    let bin = env!("CARGO_BIN_EXE_asrforge");
    let out = std::process::Command::new(bin).arg("info").env("ASRFORGE_CUDA_EMU", "1").env("ASRFORGE_EMU_SCHEDULE", "desc").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("EMULATED") && text.contains(&cuda::driver::emu_dir()) && text.contains("thread schedule desc"), "{text}");
    // Without the variable nothing runs on the emulator.
    let out = std::process::Command::new(bin).arg("info").env_remove("ASRFORGE_CUDA_EMU").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("EMULATED"), "{text}");
    // With the variable but no modules where it looks: a clear error.
    let out = std::process::Command::new(bin).arg("info").env("ASRFORGE_CUDA_EMU", "1").env("ASRFORGE_EMU_DIR", "/nonexistent/emu").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("cannot open the emulated device") && text.contains("/nonexistent/emu"), "{text}");
}
