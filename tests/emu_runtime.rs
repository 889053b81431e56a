//! The CUDA-on-CPU runtime (cuda/emu) on its own, through its C ABI
//! (cuda/emu/abi.h) and no driver seam: real project kernels on fresh random
//! inputs against f64 references under the ascending, descending and seeded
//! random thread orders, and deliberate kernel bugs (test-only kernels in
//! cuda/emu/testdata) that must each fail, with an error naming the kernel.
#![cfg(feature = "cuda")]

use std::ffi::{c_char, c_void, CStr};
use std::sync::Mutex;

use asrforge::backend::cuda::kernels::{EMU_DIR, EMU_MODULES, EMU_PROBLEM};
use libloading::Library;

/// The runtime reads ASRFORGE_EMU_SCHEDULE/SEED at each launch: tests that set them run one at a time.
static ENV: Mutex<()> = Mutex::new(());

const SCHEDULES: [(&str, u64); 5] = [("asc", 0), ("desc", 0), ("random", 1), ("random", 2), ("random", 77)];

type LaunchFn = unsafe extern "C" fn(usize, u32, u32, u32, u32, u32, u32, u32, *mut *mut c_void, *mut c_char, usize) -> i32;

struct Module {
    lib: Library,
    names: Vec<String>,
}

impl Module {
    /// Opens `$EMU_DIR/<rel>` (ASRFORGE_EMU_DIR overrides EMU_DIR).
    fn open(rel: &str) -> Module {
        assert!(!EMU_MODULES.is_empty(), "no emulated module was built: {EMU_PROBLEM}");
        let dir = std::env::var("ASRFORGE_EMU_DIR").unwrap_or_else(|_| EMU_DIR.to_string());
        let path = format!("{dir}/{rel}");
        // SAFETY: the library is one build.rs compiled from cuda/; loading it runs no initialiser with side effects.
        let lib = unsafe { Library::new(&path) }.unwrap_or_else(|e| panic!("cannot open {path}: {e}"));
        // SAFETY: the symbols have exactly the signatures of cuda/emu/abi.h.
        let names = unsafe {
            let abi = lib.get::<unsafe extern "C" fn() -> i32>(b"asrforge_emu_abi").unwrap();
            assert_eq!(abi(), 1, "{path}: ABI version");
            let count = lib.get::<unsafe extern "C" fn() -> usize>(b"asrforge_emu_kernel_count").unwrap();
            let name = lib.get::<unsafe extern "C" fn(usize) -> *const c_char>(b"asrforge_emu_kernel_name").unwrap();
            (0..count()).map(|i| CStr::from_ptr(name(i)).to_string_lossy().into_owned()).collect()
        };
        Module { lib, names }
    }

    /// Launches kernel `name`; args[p] points at parameter p's value.
    fn launch(&self, name: &str, grid: (u32, u32, u32), block: (u32, u32, u32), dyn_shared: u32, args: &[*mut c_void]) -> Result<(), String> {
        let i = self.names.iter().position(|n| n == name).unwrap_or_else(|| panic!("no kernel {name} in {:?}", self.names));
        let mut args = args.to_vec();
        let mut err = vec![0 as c_char; 1024];
        // SAFETY: the signature is abi.h's; every args[p] points at a live value of parameter p's type, and
        // every pointer parameter at a live host buffer large enough for the launch (the callers size them).
        let rc = unsafe {
            let launch = self.lib.get::<LaunchFn>(b"asrforge_emu_launch").unwrap();
            launch(i, grid.0, grid.1, grid.2, block.0, block.1, block.2, dyn_shared, args.as_mut_ptr(), err.as_mut_ptr(), err.len())
        };
        if rc == 0 {
            Ok(())
        } else {
            // SAFETY: the runtime wrote a NUL-terminated message into err.
            Err(unsafe { CStr::from_ptr(err.as_ptr()) }.to_string_lossy().into_owned())
        }
    }
}

/// A pointer to a parameter's value, as cuLaunchKernel's kernelParams hold them.
fn p<T>(v: &T) -> *mut c_void {
    v as *const T as *mut c_void
}

fn set_schedule(s: &str, seed: u64) {
    std::env::set_var("ASRFORGE_EMU_SCHEDULE", s);
    std::env::set_var("ASRFORGE_EMU_SEED", seed.to_string());
}

/// xorshift64*: fresh inputs per test, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }
}

fn seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1) | 1
}

/// |got - want| <= tol, NaN never passes.
fn close(got: f64, want: f64, tol: f64) -> bool {
    !got.is_nan() && !want.is_nan() && (got - want).abs() <= tol
}

#[test]
fn sum_rows_matches_f64_reference_under_every_schedule() {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let m = Module::open("libreduce.so");
    let mut rng = Rng(seed());
    for &(rows, n) in &[(1i64, 1i64), (37, 100), (37, 129), (9, 255), (9, 256), (20, 1000)] {
        let x: Vec<f32> = (0..rows * n).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
        let xd: Vec<f64> = (0..rows * n).map(|_| rng.uniform(-1.0, 1.0)).collect();
        for (s, sd) in SCHEDULES {
            set_schedule(s, sd);
            // Fewer blocks than rows, so the row loop wraps.
            let grid = (rows.min(8) as u32, 1, 1);
            let mut y = vec![f32::NAN; rows as usize];
            let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
            m.launch("sum_rows_f32", grid, (256, 1, 1), 256 * 4, &[p(&xp), p(&yp), p(&rows), p(&n)]).unwrap();
            let mut yd = vec![f64::NAN; rows as usize];
            let (xdp, ydp) = (xd.as_ptr(), yd.as_mut_ptr());
            m.launch("sum_rows_f64", grid, (256, 1, 1), 256 * 8, &[p(&xdp), p(&ydp), p(&rows), p(&n)]).unwrap();
            for r in 0..rows as usize {
                let row = &x[r * n as usize..(r + 1) * n as usize];
                let want: f64 = row.iter().map(|&v| v as f64).sum();
                let tol = 1e-6 * row.iter().map(|v| v.abs() as f64).sum::<f64>().max(1.0);
                assert!(close(y[r] as f64, want, tol), "sum_rows_f32 rows={rows} n={n} {s}/{sd} row {r}: got {}, want {want}", y[r]);
                let want_d: f64 = xd[r * n as usize..(r + 1) * n as usize].iter().sum();
                assert!(close(yd[r], want_d, 1e-12 * n as f64), "sum_rows_f64 rows={rows} n={n} {s}/{sd} row {r}: got {}, want {want_d}", yd[r]);
            }
        }
    }
}

#[test]
fn softmax_and_log_softmax_match_f64_reference() {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let m = Module::open("libsoftmax.so");
    let mut rng = Rng(seed());
    for &(rows, n) in &[(5u64, 1u32), (5, 77), (7, 129), (3, 300), (4, 1000)] {
        let x: Vec<f32> = (0..rows * n as u64).map(|_| rng.uniform(-8.0, 8.0) as f32).collect();
        for (s, sd) in SCHEDULES {
            set_schedule(s, sd);
            for (kernel, log) in [("softmax_fwd_f32", false), ("log_softmax_fwd_f32", true)] {
                let mut y = vec![f32::NAN; x.len()];
                let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
                m.launch(kernel, (2, 1, 1), (256, 1, 1), 0, &[p(&xp), p(&yp), p(&rows), p(&n)]).unwrap();
                for r in 0..rows as usize {
                    let row = &x[r * n as usize..(r + 1) * n as usize];
                    let mx = row.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v as f64));
                    let lse = mx + row.iter().map(|&v| (v as f64 - mx).exp()).sum::<f64>().ln();
                    for (k, &v) in row.iter().enumerate() {
                        let want = if log { v as f64 - lse } else { (v as f64 - lse).exp() };
                        let got = y[r * n as usize + k] as f64;
                        let tol = if log { 2e-6 * (1.0 + want.abs()) } else { 1e-5 * want + 1e-12 };
                        assert!(close(got, want, tol), "{kernel} rows={rows} n={n} {s}/{sd} [{r},{k}]: got {got}, want {want}");
                    }
                }
            }
        }
    }
}

/// The two shapes of the row kernels (a warp per row, a block per row)
/// reduce in the same order, so they give the same bits: softmax,
/// log-softmax and their backward, and layer norm's forward, f32, on rows
/// shorter and longer than a warp and up to the warp shape's limit (1024),
/// under every thread order.
#[test]
fn warp_and_block_row_kernels_give_the_same_bits() {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let (sm, ln) = (Module::open("libsoftmax.so"), Module::open("libnorm.so"));
    let mut rng = Rng(seed());
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    for &(rows, n) in &[(9u64, 1u32), (9, 31), (9, 77), (5, 256), (5, 300), (3, 1000), (3, 1024)] {
        let len = (rows * n as u64) as usize;
        let x: Vec<f32> = (0..len).map(|_| rng.uniform(-6.0, 6.0) as f32).collect();
        let g: Vec<f32> = (0..len).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
        let w: Vec<f32> = (0..n).map(|_| rng.uniform(0.5, 1.5) as f32).collect();
        for (s, sd) in SCHEDULES {
            set_schedule(s, sd);
            // Block shape: 2 blocks (grid-stride over rows); warp shape: 1 block of 8 warps.
            let run = |m: &Module, kernel: &str, warp: bool, args: &[*mut c_void]| {
                let name = if warp { kernel.replacen("_f32", "_warp_f32", 1) } else { kernel.to_string() };
                m.launch(&name, (if warp { 1 } else { 2 }, 1, 1), (256, 1, 1), 0, args).unwrap_or_else(|e| panic!("{name}: {e}"));
            };
            for kernel in ["softmax_fwd_f32", "log_softmax_fwd_f32"] {
                let mut out = [vec![f32::NAN; len], vec![f32::NAN; len]];
                for (k, y) in out.iter_mut().enumerate() {
                    let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
                    run(&sm, kernel, k == 1, &[p(&xp), p(&yp), p(&rows), p(&n)]);
                }
                assert_eq!(bits(&out[1]), bits(&out[0]), "{kernel} rows={rows} n={n} {s}/{sd}: the warp shape differs from the block shape");
                assert!(out[0].iter().all(|v| v.is_finite()), "{kernel} rows={rows} n={n}: every element written");
                let bwd = kernel.replacen("fwd", "bwd", 1);
                let mut gx = [vec![f32::NAN; len], vec![f32::NAN; len]];
                for (k, o) in gx.iter_mut().enumerate() {
                    let (yp, gp, op) = (out[0].as_ptr(), g.as_ptr(), o.as_mut_ptr());
                    run(&sm, &bwd, k == 1, &[p(&yp), p(&gp), p(&op), p(&rows), p(&n)]);
                }
                assert_eq!(bits(&gx[1]), bits(&gx[0]), "{bwd} rows={rows} n={n} {s}/{sd}: the warp shape differs from the block shape");
            }
            let mut y = [vec![f32::NAN; len], vec![f32::NAN; len]];
            let mut stats = [vec![f32::NAN; 2 * rows as usize], vec![f32::NAN; 2 * rows as usize]];
            for (k, (y, st)) in y.iter_mut().zip(stats.iter_mut()).enumerate() {
                let (mean, rstd) = st.split_at_mut(rows as usize);
                let (xp, wp, yp, mp, rp) = (x.as_ptr(), w.as_ptr(), y.as_mut_ptr(), mean.as_mut_ptr(), rstd.as_mut_ptr());
                let (eps, one, zero) = (1e-5f64, 1u32, 0u32);
                run(&ln, "layer_norm_fwd_f32", k == 1, &[p(&xp), p(&wp), p(&wp), p(&yp), p(&mp), p(&rp), p(&rows), p(&n), p(&eps), p(&one), p(&zero)]);
            }
            assert_eq!(bits(&y[1]), bits(&y[0]), "layer_norm_fwd_f32 rows={rows} n={n} {s}/{sd}: the warp shape differs from the block shape");
            assert_eq!(bits(&stats[1]), bits(&stats[0]), "layer_norm_fwd_f32 rows={rows} n={n} {s}/{sd}: statistics");
        }
    }
}

/// A byte buffer whose start is 16-byte aligned, filled with 0xFF (NaN in every float dtype).
struct Buf(Vec<u128>);
impl Buf {
    fn new(bytes: usize) -> Buf {
        Buf(vec![u128::MAX; bytes / 16 + 2])
    }
    fn bytes(&self) -> Vec<u8> {
        self.0.iter().flat_map(|w| w.to_le_bytes()).collect()
    }
    fn from_bytes(b: &[u8]) -> Buf {
        Buf(b
            .chunks(16)
            .map(|c| {
                let mut a = [0xFFu8; 16];
                a[..c.len()].copy_from_slice(c);
                u128::from_le_bytes(a)
            })
            .collect())
    }
    fn at(&mut self) -> *mut u8 {
        self.0.as_mut_ptr() as *mut u8
    }
}

/// `vals` in dtype `dt`, little-endian, from byte `off` of a new Buf (0xFF before and after).
fn encode(vals: &[f64], dt: &str, off: usize) -> Buf {
    let mut bytes = vec![0xFFu8; off];
    for &v in vals {
        match dt {
            "f32" => bytes.extend((v as f32).to_le_bytes()),
            "f64" => bytes.extend(v.to_le_bytes()),
            "f16" => bytes.extend(half::f16::from_f64(v).to_le_bytes()),
            _ => bytes.extend(half::bf16::from_f64(v).to_le_bytes()),
        }
    }
    bytes.extend([0xFFu8; 16]);
    Buf::from_bytes(&bytes)
}

fn dt_size(dt: &str) -> usize {
    match dt {
        "f32" => 4,
        "f64" => 8,
        _ => 2,
    }
}

/// Element i of dtype `dt` bytes, as f64.
fn decode(b: &[u8], dt: &str, i: usize) -> f64 {
    let s = dt_size(dt);
    let x = &b[i * s..(i + 1) * s];
    match dt {
        "f32" => f32::from_le_bytes(x.try_into().unwrap()) as f64,
        "f64" => f64::from_le_bytes(x.try_into().unwrap()),
        "f16" => half::f16::from_le_bytes(x.try_into().unwrap()).to_f64(),
        _ => half::bf16::from_le_bytes(x.try_into().unwrap()).to_f64(),
    }
}

/// common.cuh's Strided (MAX_DIMS = 8).
#[repr(C)]
struct Strided {
    rank: i64,
    dims: [i64; 8],
    strides: [i64; 8],
}

/// The row kernels (softmax, log-softmax, their backward, masked softmax, layer norm forward and
/// backward) read and write rows by chunks of 16 / sizeof(T) elements, with 16-byte loads only
/// where the row start is 16-byte aligned and the chunk size divides n. Each kernel runs in four
/// ways: warp and block shapes, on buffers that start 16-byte aligned and on buffers one element
/// past that (every row misaligned: scalar loads); all four must give the same bits, in f32,
/// f64, f16 and bf16, for n a multiple of the chunk and not, rows shorter and longer than a block
/// of chunks, under every thread order. Nothing outside [start, start + len) may be written.
#[test]
fn row_kernels_give_the_same_bits_in_both_shapes_aligned_or_not() {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let (sm, ln) = (Module::open("libsoftmax.so"), Module::open("libnorm.so"));
    let mut rng = Rng(seed());
    for dt in ["f32", "f64", "f16", "bf16"] {
        let es = dt_size(dt);
        // The weight, bias, statistics and their gradients: f32 for the half dtypes.
        let (wdt, ws) = if dt == "f64" { ("f64", 8) } else { ("f32", 4) };
        for &(rows, n) in &[(9u64, 1u32), (9, 31), (9, 77), (5, 256), (4, 296), (5, 300), (3, 1000), (3, 1024), (2, 2100)] {
            let len = (rows * n as u64) as usize;
            let xv: Vec<f64> = (0..len).map(|_| rng.uniform(-6.0, 6.0)).collect();
            let gv: Vec<f64> = (0..len).map(|_| rng.uniform(-1.0, 1.0)).collect();
            let wv: Vec<f64> = (0..n).map(|_| rng.uniform(0.5, 1.5)).collect();
            let bv: Vec<f64> = (0..n).map(|_| rng.uniform(-0.5, 0.5)).collect();
            // Row 1 fully masked; the others about a third.
            let mask: Vec<u8> = (0..len).map(|i| (i / n as usize == 1 || rng.uniform(0.0, 1.0) < 0.3) as u8).collect();
            let mrow = Strided { rank: 1, dims: [rows as i64, 0, 0, 0, 0, 0, 0, 0], strides: [n as i64, 0, 0, 0, 0, 0, 0, 0] };
            let mstep = 1u64;
            let chunk = 2u32;
            let parts = rows.div_ceil(chunk as u64) as usize;
            let (eps, one) = (1e-5f64, 1u32);
            for (s, sd) in [SCHEDULES[0], SCHEDULES[2], SCHEDULES[4]] {
                set_schedule(s, sd);
                // Outputs of each (shape, offset) run: one Buf per output, with its offset and element size.
                let run_all = |what: &str, body: &dyn Fn(bool, usize) -> Vec<(Buf, usize, usize, usize)>| {
                    let mut first: Option<Vec<Vec<u8>>> = None;
                    for warp in [false, true] {
                        for k in [0usize, 1] {
                            let outs = body(warp, k);
                            let got: Vec<Vec<u8>> = outs
                                .iter()
                                .map(|(b, off, size, count)| {
                                    let all = b.bytes();
                                    assert!(all[..*off].iter().all(|&x| x == 0xFF), "{what} {dt} rows={rows} n={n}: wrote before the start");
                                    let end = off + size * count;
                                    assert!(all[end..].iter().all(|&x| x == 0xFF), "{what} {dt} rows={rows} n={n}: wrote past the end");
                                    all[*off..end].to_vec()
                                })
                                .collect();
                            match &first {
                                None => first = Some(got),
                                Some(f) => assert!(
                                    *f == got,
                                    "{what} {dt} rows={rows} n={n} {s}/{sd}: warp={warp} offset={k} element(s) differs from the block shape, aligned"
                                ),
                            }
                        }
                    }
                    first.unwrap()
                };
                let name = |base: &str, warp: bool| format!("{base}{}{dt}", if warp { "_warp_" } else { "_" });
                let launch = |m: &Module, kernel: &str, warp: bool, args: &[*mut c_void]| {
                    m.launch(kernel, (if warp { 1 } else { 2 }, 1, 1), (256, 1, 1), 0, args).unwrap_or_else(|e| panic!("{kernel}: {e}"));
                };
                for base in ["softmax_fwd", "log_softmax_fwd", "masked_softmax_fwd"] {
                    let y = run_all(base, &|warp, k| {
                        let off = k * es;
                        let mut x = encode(&xv, dt, off);
                        let mut y = Buf::new(off + len * es + 16);
                        let (xp, yp) = (x.at().wrapping_add(off), y.at().wrapping_add(off));
                        let mp = mask.as_ptr();
                        if base == "masked_softmax_fwd" {
                            launch(&sm, &name(base, warp), warp, &[p(&xp), p(&mp), p(&mrow), p(&mstep), p(&yp), p(&rows), p(&n)]);
                        } else {
                            launch(&sm, &name(base, warp), warp, &[p(&xp), p(&yp), p(&rows), p(&n)]);
                        }
                        vec![(y, off, es, len)]
                    });
                    let yb = &y[0];
                    assert!((0..len).all(|i| decode(yb, dt, i).is_finite()), "{base} {dt} rows={rows} n={n}: every element written, finite");
                    if base == "masked_softmax_fwd" {
                        continue;
                    }
                    let bwd = base.replacen("fwd", "bwd", 1);
                    run_all(&bwd, &|warp, k| {
                        let off = k * es;
                        let yv: Vec<f64> = (0..len).map(|i| decode(yb, dt, i)).collect();
                        let (mut yy, mut g) = (encode(&yv, dt, off), encode(&gv, dt, off));
                        let mut o = Buf::new(off + len * es + 16);
                        let (yp, gp, op) = (yy.at().wrapping_add(off), g.at().wrapping_add(off), o.at().wrapping_add(off));
                        launch(&sm, &name(&bwd, warp), warp, &[p(&yp), p(&gp), p(&op), p(&rows), p(&n)]);
                        vec![(o, off, es, len)]
                    });
                }
                let stats = run_all("layer_norm_fwd", &|warp, k| {
                    let (off, woff) = (k * es, k * ws);
                    let mut x = encode(&xv, dt, off);
                    let (mut w, mut b) = (encode(&wv, wdt, woff), encode(&bv, wdt, woff));
                    let mut y = Buf::new(off + len * es + 16);
                    let (mut mean, mut rstd) = (Buf::new(rows as usize * ws + 16), Buf::new(rows as usize * ws + 16));
                    let (xp, wp, bp, yp) = (x.at().wrapping_add(off), w.at().wrapping_add(woff), b.at().wrapping_add(woff), y.at().wrapping_add(off));
                    let (mp, rp) = (mean.at(), rstd.at());
                    launch(
                        &ln,
                        &name("layer_norm_fwd", warp),
                        warp,
                        &[p(&xp), p(&wp), p(&bp), p(&yp), p(&mp), p(&rp), p(&rows), p(&n), p(&eps), p(&one), p(&one)],
                    );
                    vec![(y, off, es, len), (mean, 0, ws, rows as usize), (rstd, 0, ws, rows as usize)]
                });
                let stat = |i: usize| {
                    let v = &stats[i];
                    (0..rows as usize)
                        .map(|r| {
                            if ws == 8 {
                                f64::from_le_bytes(v[r * 8..r * 8 + 8].try_into().unwrap())
                            } else {
                                f32::from_le_bytes(v[r * 4..r * 4 + 4].try_into().unwrap()) as f64
                            }
                        })
                        .collect::<Vec<f64>>()
                };
                let (mean_v, rstd_v) = (stat(1), stat(2));
                assert!(rstd_v.iter().all(|v| v.is_finite() && *v > 0.0), "layer_norm_fwd {dt} rows={rows} n={n}: rstd {rstd_v:?}");
                run_all("layer_norm_bwd", &|warp, k| {
                    let (off, woff) = (k * es, k * ws);
                    let (mut x, mut g) = (encode(&xv, dt, off), encode(&gv, dt, off));
                    let mut w = encode(&wv, wdt, woff);
                    let (mut mean, mut rstd) = (encode(&mean_v, wdt, 0), encode(&rstd_v, wdt, 0));
                    let mut gx = Buf::new(off + len * es + 16);
                    let (mut pw, mut pb) = (Buf::new(parts * n as usize * ws + 16), Buf::new(parts * n as usize * ws + 16));
                    let (xp, wp, mp, rp, gp, op) =
                        (x.at().wrapping_add(off), w.at().wrapping_add(woff), mean.at(), rstd.at(), g.at().wrapping_add(off), gx.at().wrapping_add(off));
                    let (mut gw, mut gb) = (Buf::new(n as usize * ws + 16), Buf::new(n as usize * ws + 16));
                    // The arrival counter: 0 at the launch, and set back to 0 by the last block.
                    let mut arrivals = [0u64; 1];
                    let (pwp, pbp, gwp, gbp, ap) = (pw.at(), pb.at(), gw.at(), gb.at(), arrivals.as_mut_ptr());
                    launch(
                        &ln,
                        &name("layer_norm_bwd", warp),
                        warp,
                        &[p(&xp), p(&wp), p(&mp), p(&rp), p(&gp), p(&op), p(&pwp), p(&pbp), p(&gwp), p(&gbp), p(&ap), p(&rows), p(&n), p(&one), p(&chunk)],
                    );
                    assert_eq!(arrivals[0], 0, "layer_norm_bwd {dt} rows={rows} n={n} warp={warp}: the arrival counter is left at 0");
                    vec![(gx, off, es, len), (pw, 0, ws, parts * n as usize), (pb, 0, ws, parts * n as usize), (gw, 0, ws, n as usize), (gb, 0, ws, n as usize)]
                });
            }
        }
    }
}

/// The 16-bit encoding nearest to x (ties to the even encoding), by search over all finite
/// encodings; `decode` maps bits to f64 exactly. NaN -> 0x7FFF; beyond the rounding range -> inf.
fn nearest16(x: f64, decode: &dyn Fn(u16) -> f64, inf: u16) -> u16 {
    if x.is_nan() {
        return 0x7FFF;
    }
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    let a = x.abs();
    let (mut best, mut best_d) = (0u16, f64::INFINITY);
    for bits in 0..inf {
        let d = (decode(bits) - a).abs();
        if d < best_d || (d == best_d && bits % 2 == 0) {
            best = bits;
            best_d = d;
        }
    }
    // The largest finite value rounds to inf from half an ulp above it (ties to even: inf).
    let max = decode(inf - 1);
    let half_ulp = (max - decode(inf - 2)) / 2.0;
    if a >= max + half_ulp {
        best = inf;
    }
    sign | best
}

fn f16_to_f64(b: u16) -> f64 {
    let (e, m) = ((b >> 10) & 0x1F, (b & 0x3FF) as f64);
    let v = if e == 0 { m * 2f64.powi(-24) } else { (1.0 + m / 1024.0) * 2f64.powi(e as i32 - 15) };
    if b & 0x8000 != 0 {
        -v
    } else {
        v
    }
}

fn bf16_to_f64(b: u16) -> f64 {
    f32::from_bits((b as u32) << 16) as f64
}

#[test]
fn casts_to_f16_and_bf16_round_once_to_nearest_even() {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    set_schedule("random", 5);
    let m = Module::open("libcast.so");
    let mut rng = Rng(seed());
    // Random magnitudes from subnormal to overflow, exact ties, values just off a tie, specials.
    let mut xs: Vec<f64> = (0..300).map(|_| rng.uniform(-1.0, 1.0) * 2f64.powf(rng.uniform(-30.0, 17.0))).collect();
    xs.extend((0..100).map(|_| rng.uniform(-1.0, 1.0) * 2f64.powf(rng.uniform(-135.0, 128.5))));
    for k in [1.0f64, 3.0, 5.0, 1023.0, 2047.0] {
        let tie = (1.0 + (k + 0.5) / 1024.0) * 2f64.powi(rng.uniform(-14.0, 15.0) as i32);
        xs.extend([tie, -tie, tie * (1.0 + 1e-15), tie * (1.0 - 1e-15)]);
        let btie = (1.0 + (k.min(127.0) + 0.5) / 128.0) * 2f64.powi(rng.uniform(-100.0, 100.0) as i32);
        xs.extend([btie, btie * (1.0 + 1e-15), btie * (1.0 - 1e-15)]);
    }
    xs.extend([0.0, -0.0, 65504.0, 65519.99, 65520.0, 1e-8, 3e-8, 2.98e-8, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 3.4e38, 3.3961e38]);
    let n = xs.len() as i64;
    let xf: Vec<f32> = xs.iter().map(|&v| v as f32).collect();
    for (kernel, from_f32, bf) in [("cast_f64_f16", false, false), ("cast_f64_bf16", false, true), ("cast_f32_f16", true, false), ("cast_f32_bf16", true, true)]
    {
        let mut y = vec![0x1234u16; xs.len()];
        let yp = y.as_mut_ptr();
        let (xp, xfp) = (xs.as_ptr(), xf.as_ptr());
        let src = if from_f32 { p(&xfp) } else { p(&xp) };
        m.launch(kernel, (3, 1, 1), (128, 1, 1), 0, &[src, p(&yp), p(&n)]).unwrap();
        for (i, &x) in xs.iter().enumerate() {
            let x = if from_f32 { xf[i] as f64 } else { x };
            let want = if bf { nearest16(x, &bf16_to_f64, 0x7F80) } else { nearest16(x, &f16_to_f64, 0x7C00) };
            assert_eq!(y[i], want, "{kernel}({x:e}): got {:#06x}, want {want:#06x}", y[i]);
        }
    }
}

#[test]
fn ctc_loss_matches_brute_force_alignment_sum() {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let m = Module::open("libctc.so");
    let mut rng = Rng(seed());
    let (nb, t_max, v, s_max, blank) = (3i64, 5i64, 3i64, 2i64, 0i64);
    let in_len = [5i64, 4, 5];
    let targets = [1i64, 2, 2, 0, 1, 1];
    let tgt_len = [2i64, 1, 2];
    // log-softmax rows.
    let mut lp = vec![0f64; (nb * t_max * v) as usize];
    for row in lp.chunks_mut(v as usize) {
        let z: Vec<f64> = (0..v).map(|_| rng.uniform(-2.0, 2.0)).collect();
        let lse = z.iter().map(|a| a.exp()).sum::<f64>().ln();
        for (o, a) in row.iter_mut().zip(z) {
            *o = a - lse;
        }
    }
    for (s, sd) in SCHEDULES {
        set_schedule(s, sd);
        let states = (2 * s_max + 1) as usize;
        let mut alpha = vec![f64::NAN; nb as usize * t_max as usize * states];
        let mut beta = alpha.clone();
        let mut nll = vec![f64::NAN; nb as usize];
        // The kernel writes only the occupied (t, k): the caller zeroes the
        // gradient first (a memset in src/backend/cuda/ctc.rs).
        let mut grad = vec![0.0f64; lp.len()];
        let (lpp, tp, ip, tlp) = (lp.as_ptr(), targets.as_ptr(), in_len.as_ptr(), tgt_len.as_ptr());
        let (ap, bp, np, gp) = (alpha.as_mut_ptr(), beta.as_mut_ptr(), nll.as_mut_ptr(), grad.as_mut_ptr());
        let want_grad = 1i32;
        let args = [p(&lpp), p(&tp), p(&ip), p(&tlp), p(&ap), p(&bp), p(&np), p(&gp), p(&nb), p(&t_max), p(&v), p(&s_max), p(&blank), p(&want_grad)];
        m.launch("ctc_loss_f64", (2, 1, 1), (32, 1, 1), 0, &args).unwrap();
        for b in 0..nb as usize {
            let tl = in_len[b] as usize;
            let label = &targets[b * s_max as usize..b * s_max as usize + tgt_len[b] as usize];
            let mut total = 0.0;
            for code in 0..(v as usize).pow(tl as u32) {
                let path: Vec<i64> = (0..tl).map(|t| ((code / (v as usize).pow(t as u32)) % v as usize) as i64).collect();
                let mut collapsed = Vec::new();
                let mut prev = -1;
                for &c in &path {
                    if c != prev && c != blank {
                        collapsed.push(c);
                    }
                    prev = c;
                }
                if collapsed == label {
                    total += path.iter().enumerate().map(|(t, &c)| lp[(b * t_max as usize + t) * v as usize + c as usize]).sum::<f64>().exp();
                }
            }
            let want = -total.ln();
            assert!(close(nll[b], want, 1e-10 * want.abs().max(1.0)), "ctc_loss_f64 {s}/{sd} seq {b}: got {}, want {want}", nll[b]);
            // Frames past in_len get zero gradient; every element is written.
            for t in 0..t_max as usize {
                for k in 0..v as usize {
                    let g = grad[(b * t_max as usize + t) * v as usize + k];
                    assert!(!g.is_nan() && (t < tl || g == 0.0), "ctc grad {s}/{sd} [{b},{t},{k}] = {g}");
                }
            }
        }
    }
}

#[test]
fn a_removed_barrier_gives_wrong_sums_under_some_schedule() {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let good = Module::open("libreduce.so");
    let bad = Module::open("testdata/libemu_selftest.so");
    let mut rng = Rng(seed());
    let (rows, n) = (6i64, 300i64);
    let x: Vec<f32> = (0..rows * n).map(|_| rng.uniform(0.0, 1.0) as f32).collect();
    let mut failing = Vec::new();
    for (s, sd) in SCHEDULES {
        set_schedule(s, sd);
        for (module, kernel) in [(&good, "sum_rows_f32"), (&bad, "sum_rows_missing_barrier_f32")] {
            let mut y = vec![f32::NAN; rows as usize];
            let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
            module.launch(kernel, (4, 1, 1), (256, 1, 1), 256 * 4, &[p(&xp), p(&yp), p(&rows), p(&n)]).unwrap();
            let ok = (0..rows as usize).all(|r| {
                let want: f64 = x[r * n as usize..(r + 1) * n as usize].iter().map(|&v| v as f64).sum();
                close(y[r] as f64, want, 1e-4)
            });
            if module as *const Module == &good as *const Module {
                assert!(ok, "the unbroken sum_rows_f32 failed under {s}/{sd}: {y:?}");
            } else if !ok {
                failing.push(format!("{s}/{sd}"));
            }
        }
    }
    assert!(!failing.is_empty(), "the missing barrier went unnoticed under every schedule");
    assert!(failing.iter().any(|f| f == "asc/0"), "the missing barrier should show under asc (NaN-filled shared memory); it showed under {failing:?}");
}

fn expect_err(res: Result<(), String>, kernel: &str, needles: &[&str]) {
    let msg = match res {
        Ok(()) => panic!("{kernel}: the launch succeeded; expected an error mentioning {needles:?}"),
        Err(m) => m,
    };
    assert!(msg.contains(&format!("kernel {kernel}")), "error does not name the kernel {kernel}: {msg}");
    for n in needles {
        assert!(msg.contains(n), "error for {kernel} lacks {n:?}: {msg}");
    }
}

#[test]
fn shared_memory_faults_are_errors_naming_the_kernel() {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let m = Module::open("testdata/libemu_selftest.so");
    for (s, sd) in SCHEDULES {
        set_schedule(s, sd);
        // Dynamic shared memory sized right: every value comes back.
        let mut out = vec![f32::NAN; 3 * 64];
        let op = out.as_mut_ptr();
        m.launch("fill_dyn_shared", (3, 1, 1), (64, 1, 1), 64 * 4, &[p(&op)]).unwrap();
        for (i, &v) in out.iter().enumerate() {
            assert_eq!(v, (63 - i % 64) as f32, "fill_dyn_shared {s}/{sd} [{i}]");
        }
        // One float short: the last thread writes past the end, into the guard zone.
        expect_err(m.launch("fill_dyn_shared", (3, 1, 1), (64, 1, 1), 63 * 4, &[p(&op)]), "fill_dyn_shared", &["dynamic shared memory", "252 bytes"]);
        expect_err(m.launch("fill_dyn_shared", (1, 1, 1), (64, 1, 1), 48 * 1024 + 4, &[p(&op)]), "fill_dyn_shared", &["too much dynamic shared memory"]);
        // Static shared memory starts as NaN bytes in every block (even blocks write 32 slots first).
        let mut u = vec![0u32; 4 * 96];
        let (up, k) = (u.as_mut_ptr(), 32u32);
        m.launch("read_uninit_shared", (4, 1, 1), (96, 1, 1), 0, &[p(&up), p(&k)]).unwrap();
        for (i, &b) in u.iter().enumerate() {
            let (block, slot) = (i / 96, (i % 96) % 64);
            let want = if block % 2 == 0 && slot < 32 { slot as u32 } else { 0xFFFF_FFFF };
            assert_eq!(b, want, "read_uninit_shared {s}/{sd} block {block} slot {slot}: shared memory not NaN-filled at block start");
        }
    }
}

#[test]
fn partial_barriers_warps_and_asserts_are_errors_naming_the_kernel() {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let m = Module::open("testdata/libemu_selftest.so");
    for (s, sd) in SCHEDULES {
        set_schedule(s, sd);
        let mut out = vec![0f32; 128];
        let op = out.as_mut_ptr();
        let all = 128u32;
        m.launch("partial_syncthreads", (2, 1, 1), (128, 1, 1), 0, &[p(&op), p(&all)]).unwrap();
        assert!(out.iter().all(|&v| v == 1.0));
        let some = 100u32;
        expect_err(
            m.launch("partial_syncthreads", (2, 1, 1), (128, 1, 1), 0, &[p(&op), p(&some)]),
            "partial_syncthreads",
            &["__syncthreads", "emu_selftest.cu", "100 of 128"],
        );
        expect_err(m.launch("partial_shfl", (1, 1, 1), (64, 1, 1), 0, &[p(&op)]), "partial_shfl", &["__shfl_xor_sync", "part of warp"]);
        let good = vec![1i32, 2, 3, 4, 5];
        let bad = vec![1i32, 2, -3, 4, 5];
        let n = 5i32;
        let gp = good.as_ptr();
        m.launch("assert_positive", (1, 1, 1), (32, 1, 1), 0, &[p(&gp), p(&n)]).unwrap();
        let bp = bad.as_ptr();
        expect_err(m.launch("assert_positive", (1, 1, 1), (32, 1, 1), 0, &[p(&bp), p(&n)]), "assert_positive", &["assert(x[i] > 0)", "thread (2,0,0)"]);
        let a = vec![0u16; 256];
        let ap = a.as_ptr();
        expect_err(m.launch("wmma_partial", (1, 1, 1), (32, 1, 1), 0, &[p(&ap)]), "wmma_partial", &["__syncwarp", "part of warp"]);
    }
}

#[test]
fn warp_intrinsics_exchange_values_between_lanes() {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let m = Module::open("testdata/libemu_selftest.so");
    let mut rng = Rng(seed());
    let n = 100i32; // not a multiple of 32: the last warp has lanes past n (value 0)
    let x: Vec<f32> = (0..n).map(|_| (rng.uniform(0.0, 1.0) * 64.0).round() as f32 / 64.0).collect();
    let v = |i: usize| if i < n as usize { x[i] } else { 0.0 };
    for (s, sd) in SCHEDULES {
        set_schedule(s, sd);
        let (mut xs, mut ds, mut bc, mut sc) = (vec![f32::NAN; 100], vec![f32::NAN; 4], vec![f32::NAN; 100], vec![f32::NAN; 100]);
        let (mut bal, mut aa) = (vec![0u32; 4], vec![-1i32; 8]);
        let (xp, xsp, dsp, bcp, scp, balp, aap) =
            (x.as_ptr(), xs.as_mut_ptr(), ds.as_mut_ptr(), bc.as_mut_ptr(), sc.as_mut_ptr(), bal.as_mut_ptr(), aa.as_mut_ptr());
        m.launch("warp_ops", (2, 1, 1), (64, 1, 1), 0, &[p(&xp), p(&xsp), p(&dsp), p(&bcp), p(&scp), p(&balp), p(&aap), p(&n)]).unwrap();
        for w in 0..4 {
            // Sums of multiples of 1/64 below 32: exact in f32 in any order.
            let lanes: Vec<f32> = (0..32).map(|l| v(w * 32 + l)).collect();
            let sum: f32 = lanes.iter().sum();
            assert_eq!(ds[w], sum, "shfl_down sum, warp {w}, {s}/{sd}");
            let ballot = lanes.iter().enumerate().fold(0u32, |b, (l, &a)| if a > 0.5 { b | 1 << l } else { b });
            assert_eq!(bal[w], ballot, "ballot, warp {w}, {s}/{sd}");
            assert_eq!(aa[2 * w], lanes.iter().any(|&a| a > 0.9) as i32, "any, warp {w}");
            assert_eq!(aa[2 * w + 1], lanes.iter().all(|&a| a > 0.1) as i32, "all, warp {w}");
            for l in 0..32 {
                let i = w * 32 + l;
                if i >= n as usize {
                    continue;
                }
                assert_eq!(xs[i], sum, "xor sum [{i}] {s}/{sd}");
                assert_eq!(bc[i], lanes[3], "shfl broadcast [{i}] {s}/{sd}");
                assert_eq!(sc[i], lanes[..=l].iter().sum::<f32>(), "shfl_up scan [{i}] {s}/{sd}");
            }
        }
    }
}

#[test]
fn atomics_voting_barriers_and_3d_launches() {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("ASRFORGE_EMU_THREADS", "4");
    let m = Module::open("testdata/libemu_selftest.so");
    for (s, sd) in SCHEDULES {
        set_schedule(s, sd);
        let (mut count, mut fsum, mut dsum, mut umax, mut cas) = (0i32, 0f32, 0f64, 0u32, 0u64);
        let (cp, fp, dp, up, kp) = (&mut count as *mut i32, &mut fsum as *mut f32, &mut dsum as *mut f64, &mut umax as *mut u32, &mut cas as *mut u64);
        m.launch("atomics", (37, 1, 1), (96, 1, 1), 0, &[p(&cp), p(&fp), p(&dp), p(&up), p(&kp)]).unwrap();
        assert_eq!((count, fsum, dsum, umax, cas), (3552, 3552.0, 1776.0, 3551, 3552), "atomics under {s}/{sd}");
        let mut votes = vec![-1i32; 5 * 2 * 100];
        let vp = votes.as_mut_ptr();
        m.launch("sync_votes", (2, 1, 1), (100, 1, 1), 0, &[p(&vp)]).unwrap();
        for (t, r) in votes.chunks(5).enumerate() {
            assert_eq!(r, &[34, 1, 0, 1, 0], "__syncthreads_count/and/or seen by thread {t} under {s}/{sd}");
        }
        let mut tripled = vec![-1i32; 40];
        let tp = tripled.as_mut_ptr();
        m.launch("in_extern_c_block", (1, 1, 1), (40, 1, 1), 0, &[p(&tp)]).unwrap();
        assert!(tripled.iter().enumerate().all(|(i, &v)| v == 3 * i as i32), "in_extern_c_block: {tripled:?}");
        let (g, b) = ((3u32, 2u32, 2u32), (4u32, 3u32, 2u32));
        let total = (g.0 * g.1 * g.2 * b.0 * b.1 * b.2) as usize;
        let mut out = vec![u32::MAX; 6 * total];
        let op = out.as_mut_ptr();
        m.launch("coords3d", g, b, 0, &[p(&op)]).unwrap();
        let mut k = 0;
        for bz in 0..g.2 {
            for by in 0..g.1 {
                for bx in 0..g.0 {
                    for tz in 0..b.2 {
                        for ty in 0..b.1 {
                            for tx in 0..b.0 {
                                assert_eq!(&out[6 * k..6 * k + 6], &[bx, by, bz, tx, ty, tz], "coords3d entry {k}");
                                k += 1;
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn wmma_tiles_multiply_half_and_bf16_with_f32_accumulation() {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let m = Module::open("testdata/libemu_selftest.so");
    let mut rng = Rng(seed());
    let (mm, nn, kk) = (32i32, 48i32, 64i32);
    for (kernel, bf) in [("wmma_gemm_f16", false), ("wmma_gemm_bf16", true)] {
        // Inputs exactly representable in the 16-bit type (f32 -> 16 bits rounds once).
        let enc = |v: f32| if bf { half::bf16::from_f32(v).to_bits() } else { half::f16::from_f32(v).to_bits() };
        let dec = |b: u16| if bf { bf16_to_f64(b) } else { f16_to_f64(b) };
        let a: Vec<u16> = (0..mm * kk).map(|_| enc(rng.uniform(-2.0, 2.0) as f32)).collect();
        let b: Vec<u16> = (0..nn * kk).map(|_| enc(rng.uniform(-2.0, 2.0) as f32)).collect(); // B column-major: N rows of K
        for (s, sd) in SCHEDULES {
            set_schedule(s, sd);
            let mut c = vec![f32::NAN; (mm * nn) as usize];
            let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
            // 6 tiles, one warp each: 3 blocks of 2 warps.
            m.launch(kernel, (3, 1, 1), (64, 1, 1), 0, &[p(&ap), p(&bp), p(&cp), p(&mm), p(&nn), p(&kk)]).unwrap();
            for i in 0..mm as usize {
                for j in 0..nn as usize {
                    let want: f64 = (0..kk as usize).map(|k| dec(a[i * kk as usize + k]) * dec(b[j * kk as usize + k])).sum();
                    let mag: f64 = (0..kk as usize).map(|k| (dec(a[i * kk as usize + k]) * dec(b[j * kk as usize + k])).abs()).sum();
                    let got = c[i * nn as usize + j] as f64;
                    assert!(close(got, want, 1e-5 * mag.max(1.0)), "{kernel} {s}/{sd} C[{i},{j}]: got {got}, want {want}");
                }
            }
        }
    }
}
