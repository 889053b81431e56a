//! The CUDA kernels of the elementwise, cast, reduce and matmul families
//! against the CPU ops on fresh random inputs, through the harness of
//! `common::gpu` (tolerance per dtype, f16/bf16 against the CPU's f32 result
//! on the same half-rounded inputs; outputs poisoned with NaN before every
//! kernel; NaN or inf never passes; the grid capped so grid-stride loops
//! wrap). Plus the runtime's error paths: out of memory names the size and
//! the pool state, a missing kernel is named. Every test prints why it skips
//! where no GPU can be used, and fails instead where one is required.

mod common;

use asrforge::backend::cuda::{self, kernels, LaunchConfig};
use asrforge::ops;
use asrforge::tensor::Rng;
use asrforge::{DType, Device, Result, Tensor};
use common::gpu::{self, gpu};
use common::{draw, fresh_seed, run_with_grads, tensor, Kind};

type OpFn = dyn Fn(&[Tensor]) -> Result<Tensor>;

/// Runs `f` with gradients on the CPU and the GPU in `dtype` and compares.
fn cmp(name: &str, f: &OpFn, shapes: &[&[usize]], kind: Kind, grads: bool, dtype: DType, tol: f64, dev: &Device) {
    cmp_floor(name, f, shapes, kind, grads, dtype, tol, 0.0, dev)
}

/// `cmp` with a floor on the forward's absolute tolerance (see `gpu::assert_close_floor`).
#[allow(clippy::too_many_arguments)]
fn cmp_floor(name: &str, f: &OpFn, shapes: &[&[usize]], kind: Kind, grads: bool, dtype: DType, tol: f64, floor: f64, dev: &Device) {
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    let vals: Vec<(Vec<f64>, Vec<usize>)> = shapes.iter().map(|s| (draw(&mut rng, s, kind), s.to_vec())).collect();
    let y = f(&vals.iter().map(|(v, s)| tensor(v, s, DType::F64, &Device::Cpu)).collect::<Vec<_>>()).expect("cpu forward");
    let r = rng.normal(y.elem_count().max(1));
    let mask = vec![grads; vals.len()];
    let (yc, gc) = run_with_grads(f, &vals, &mask, &r, dtype, &Device::Cpu);
    let (yg, gg) = run_with_grads(f, &vals, &mask, &r, dtype, dev);
    gpu::assert_close_floor(&format!("{name} {dtype:?} forward"), &yg, &yc, tol, floor, seed);
    for (i, (a, b)) in gg.iter().zip(&gc).enumerate() {
        if let (Some(a), Some(b)) = (a, b) {
            let floor = broadcast_grad_floor(f, &vals, i, &r, y.dims());
            gpu::assert_close_floor(&format!("{name} {dtype:?} grad of input {i}"), a, b, tol, floor, seed);
        }
    }
}

/// The gradient of an input broadcast over n output elements is a sum of n
/// terms (one per output element): its floor is √n times their RMS (see
/// `gpu::assert_close_floor`). The terms are the gradient of the same op
/// with that input expanded to the output's shape, in f64 on the CPU. 0
/// where the input is not broadcast (or the op does not broadcast).
fn broadcast_grad_floor(f: &OpFn, vals: &[(Vec<f64>, Vec<usize>)], i: usize, r: &[f64], y_dims: &[usize]) -> f64 {
    let y_n: usize = y_dims.iter().product();
    let x_n: usize = vals[i].1.iter().product();
    if x_n == 0 || y_n <= x_n {
        return 0.0;
    }
    let mut xs: Vec<Tensor> = vals.iter().map(|(v, s)| tensor(v, s, DType::F64, &Device::Cpu)).collect();
    let Ok(full) = ops::add(&xs[i], &Tensor::zeros(y_dims.to_vec(), DType::F64, &Device::Cpu).unwrap()) else { return 0.0 };
    if full.dims() != y_dims {
        return 0.0;
    }
    let leaf = tensor(&full.to_f64_vec().unwrap(), y_dims, DType::F64, &Device::Cpu).requires_grad_();
    xs[i] = leaf.clone();
    let Ok(y) = f(&xs) else { return 0.0 };
    let loss = ops::sum_all(&ops::mul(&y, &tensor(&r[..y.elem_count()], y.dims(), DType::F64, &Device::Cpu)).unwrap()).unwrap();
    asrforge::autograd::backward(&loss).unwrap();
    let terms = leaf.grad().map(|g| g.to_f64_vec().unwrap()).unwrap_or_default();
    let rms = (terms.iter().map(|t| t * t).sum::<f64>() / terms.len().max(1) as f64).sqrt();
    ((y_n / x_n) as f64).sqrt() * rms
}

/// `f` on the GPU in a half dtype against `f` on the CPU in f32 over the
/// same half-rounded inputs, rounded to the half type once (the CPU has no
/// half kernels).
fn cmp_half(name: &str, f: &OpFn, shapes: &[&[usize]], kind: Kind, dtype: DType, tol: f64, dev: &Device) {
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    let mut cpu_in = Vec::new();
    let mut gpu_in = Vec::new();
    for s in shapes {
        let h = tensor(&draw(&mut rng, s, kind), s, DType::F32, &Device::Cpu);
        let h = ops::to_dtype(&h, dtype).unwrap();
        cpu_in.push(ops::to_dtype(&h, DType::F32).unwrap());
        gpu_in.push(h.to_device(dev).unwrap());
    }
    // The reference: computed in f32 and rounded to the half type once, as
    // the half kernels must (a sum past f16's range is inf on both sides).
    let want = ops::to_dtype(&f(&cpu_in).unwrap(), dtype).unwrap().to_f64_vec().unwrap();
    let got = f(&gpu_in).unwrap();
    assert_eq!(got.dtype(), dtype, "{name}: output dtype");
    gpu::assert_close_or_same_inf(&format!("{name} {dtype:?}"), &got.to_f64_vec().unwrap(), &want, tol, seed);
}

fn unary_ops() -> Vec<(&'static str, Box<OpFn>, Kind)> {
    vec![
        ("exp", Box::new(|x: &[Tensor]| ops::exp(&x[0])), Kind::Normal),
        ("log", Box::new(|x: &[Tensor]| ops::log(&x[0])), Kind::Positive),
        ("sqrt", Box::new(|x: &[Tensor]| ops::sqrt(&x[0])), Kind::Positive),
        ("rsqrt", Box::new(|x: &[Tensor]| ops::rsqrt(&x[0])), Kind::Positive),
        ("abs", Box::new(|x: &[Tensor]| ops::abs(&x[0])), Kind::AwayFromZero),
        ("relu", Box::new(|x: &[Tensor]| ops::relu(&x[0])), Kind::AwayFromZero),
        ("silu", Box::new(|x: &[Tensor]| ops::silu(&x[0])), Kind::Normal),
        ("gelu", Box::new(|x: &[Tensor]| ops::gelu(&x[0])), Kind::Normal),
        ("sigmoid", Box::new(|x: &[Tensor]| ops::sigmoid(&x[0])), Kind::Normal),
        ("tanh", Box::new(|x: &[Tensor]| ops::tanh(&x[0])), Kind::Normal),
        ("neg", Box::new(|x: &[Tensor]| ops::neg(&x[0])), Kind::Normal),
        ("affine", Box::new(|x: &[Tensor]| ops::affine(&x[0], -1.5, 0.25)), Kind::Normal),
        ("pow", Box::new(|x: &[Tensor]| ops::pow(&x[0], 2.5)), Kind::Positive),
    ]
}

#[test]
fn unary_forward_and_backward() {
    let Some(dev) = gpu("unary_forward_and_backward") else { return };
    // 1000 + 3: not a multiple of any vector width; 70_000: several blocks.
    for shape in [&[1003usize][..], &[7, 10_000]] {
        for (name, f, kind) in unary_ops() {
            cmp(name, &*f, &[shape], kind, true, DType::F32, gpu::F32, &dev);
            cmp(name, &*f, &[shape], kind, true, DType::F64, gpu::F64, &dev);
            cmp_half(name, &*f, &[shape], kind, DType::F16, gpu::F16, &dev);
            cmp_half(name, &*f, &[shape], kind, DType::BF16, gpu::BF16, &dev);
        }
    }
}

fn binary_ops() -> Vec<(&'static str, Box<OpFn>, Kind)> {
    vec![
        ("add", Box::new(|x: &[Tensor]| ops::add(&x[0], &x[1])), Kind::Normal),
        ("sub", Box::new(|x: &[Tensor]| ops::sub(&x[0], &x[1])), Kind::Normal),
        ("mul", Box::new(|x: &[Tensor]| ops::mul(&x[0], &x[1])), Kind::Normal),
        ("div", Box::new(|x: &[Tensor]| ops::div(&x[0], &x[1])), Kind::Positive),
    ]
}

#[test]
fn binary_with_broadcasting_and_its_gradient_reduction() {
    let Some(dev) = gpu("binary_with_broadcasting_and_its_gradient_reduction") else { return };
    // (600, 40) + (40): the bias-gradient shape whose reduction takes the tiled column sum.
    let cases: [(&[usize], &[usize]); 7] = [
        (&[4099], &[4099]),
        (&[2, 3, 5], &[3, 1]),
        (&[5], &[2, 3, 5]),
        (&[2, 1, 5], &[1, 4, 1]),
        (&[3, 4], &[]),
        (&[6, 1, 7, 2], &[6, 3, 1, 2]),
        (&[600, 40], &[40]),
    ];
    for (sa, sb) in cases {
        for (name, f, kind) in binary_ops() {
            cmp(name, &*f, &[sa, sb], kind, true, DType::F32, gpu::F32, &dev);
            cmp(name, &*f, &[sa, sb], kind, true, DType::F64, gpu::F64, &dev);
            cmp_half(name, &*f, &[sa, sb], kind, DType::F16, gpu::F16, &dev);
            cmp_half(name, &*f, &[sa, sb], kind, DType::BF16, gpu::BF16, &dev);
        }
    }
}

/// The broadcast kernels by both index widths (u32 with host divisors and
/// merged dims, 64-bit) give the same bits, within the dtype's tolerance of
/// the CPU's f64 result on the same (rounded) inputs, in every float dtype,
/// on shapes with size-1 dims and one whose launch wraps the capped grid.
#[test]
fn broadcasts_by_both_index_widths_agree_and_match_the_cpu() {
    use asrforge::backend::cpu::elementwise::Binary;
    use asrforge::backend::cuda::{elementwise::broadcast_binary_with, fastdiv::IndexWidth};
    use asrforge::backend::Storage;
    let Some(dev) = gpu("broadcasts_by_both_index_widths_agree_and_match_the_cpu") else { return };
    let cases: [(&[usize], &[usize]); 4] = [(&[2, 1, 5], &[1, 4, 1]), (&[6, 1, 7, 2], &[6, 3, 1, 2]), (&[37, 1, 30], &[1, 41, 30]), (&[3, 4], &[])];
    for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for (sa, sb) in cases {
            let seed = fresh_seed();
            let mut rng = Rng::new(seed);
            let a = tensor(&draw(&mut rng, sa, Kind::Normal), sa, dt, &Device::Cpu);
            let b = tensor(&draw(&mut rng, sb, Kind::Positive), sb, dt, &Device::Cpu);
            let (a64, b64) = (ops::to_dtype(&a, DType::F64).unwrap(), ops::to_dtype(&b, DType::F64).unwrap());
            let (ag, bg) = (a.to_device(&dev).unwrap(), b.to_device(&dev).unwrap());
            let (st_a, st_b) = (ag.storage(), bg.storage());
            let (Storage::Cuda(ca), Storage::Cuda(cb)) = (&*st_a, &*st_b) else { panic!("device tensors") };
            for (op, want) in [(Binary::Add, ops::add(&a64, &b64)), (Binary::Div, ops::div(&a64, &b64))] {
                let want = want.unwrap().to_f64_vec().unwrap();
                let narrow = broadcast_binary_with(op, ca, sa, cb, sb, IndexWidth::Auto).unwrap().to_cpu().unwrap().to_f64_vec();
                let wide = broadcast_binary_with(op, ca, sa, cb, sb, IndexWidth::Wide).unwrap().to_cpu().unwrap().to_f64_vec();
                let what = format!("{op:?} {sa:?} {sb:?} {dt:?}");
                assert!(narrow.iter().zip(&wide).all(|(x, y)| x.to_bits() == y.to_bits()), "{what}: u32 and 64-bit kernels differ (seed {seed})");
                gpu::assert_close(&what, &narrow, &want, gpu::tol(dt), seed);
            }
        }
    }
}

#[test]
fn reductions_over_dims() {
    let Some(dev) = gpu("reductions_over_dims") else { return };
    // Each op with the sum it amounts to: its result's rounding error grows
    // with √n·σ of the n summed terms (σ = 1 here), or that over n for a mean.
    #[derive(Clone, Copy)]
    enum Acc {
        Sum,
        Mean,
        Exact,
    }
    let fs: Vec<(&str, Box<OpFn>, Acc)> = vec![
        ("sum last", Box::new(|x: &[Tensor]| ops::sum(&x[0], &[-1], false)), Acc::Sum),
        ("sum middle keepdim", Box::new(|x: &[Tensor]| ops::sum(&x[0], &[1], true)), Acc::Sum),
        ("sum two dims", Box::new(|x: &[Tensor]| ops::sum(&x[0], &[0, 2], false)), Acc::Sum),
        ("mean first", Box::new(|x: &[Tensor]| ops::mean(&x[0], &[0], false)), Acc::Mean),
        ("mean two dims", Box::new(|x: &[Tensor]| ops::mean(&x[0], &[0, 1], false)), Acc::Mean),
        ("sum_all", Box::new(|x: &[Tensor]| ops::sum_all(&x[0])), Acc::Sum),
        ("mean_all", Box::new(|x: &[Tensor]| ops::mean_all(&x[0])), Acc::Mean),
        ("max last", Box::new(|x: &[Tensor]| ops::max(&x[0], -1, false)), Acc::Exact),
        ("max middle keepdim", Box::new(|x: &[Tensor]| ops::max(&x[0], 1, true)), Acc::Exact),
    ];
    // Rows of 7, of 200 (between half a block and a block, 134 of them: more
    // than the capped grid) and of 129 or 300 (past a block); 4·300·129
    // positive halves sum past f16's largest finite value unless the sum
    // stays in f32 across every reduced dim.
    for shape in [&[3usize, 5, 7][..], &[2, 67, 200], &[4, 300, 129]] {
        for (name, f, acc) in &fs {
            let total: usize = shape.iter().product();
            let n = total / f(&[Tensor::zeros(shape.to_vec(), DType::F32, &Device::Cpu).unwrap()]).unwrap().elem_count().max(1);
            let floor = match acc {
                Acc::Sum => (n as f64).sqrt(),
                Acc::Mean => 1.0 / (n as f64).sqrt(),
                Acc::Exact => 0.0,
            };
            cmp_floor(name, &**f, &[shape], Kind::Normal, true, DType::F32, gpu::F32, floor, &dev);
            cmp_floor(name, &**f, &[shape], Kind::Normal, true, DType::F64, gpu::F64, floor, &dev);
            cmp_half(name, &**f, &[shape], Kind::Positive, DType::F16, gpu::F16, &dev);
            cmp_half(name, &**f, &[shape], Kind::Positive, DType::BF16, gpu::BF16, &dev);
        }
    }
    // A long full sum is deterministic: the same bits twice.
    let x = Tensor::randn([1 << 20], 0.0, 1.0, DType::F32, &mut Rng::new(fresh_seed()), &dev).unwrap();
    let a = ops::sum_all(&x).unwrap().to_vec::<f32>().unwrap();
    let b = ops::sum_all(&x).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(a[0].to_bits(), b[0].to_bits(), "sum_all must be deterministic");
}

/// `cuda::reduce::sum_dim_acc_with` on `x` (a device tensor) of layout
/// `(outer, n, inner)`, as f64.
fn device_sum(x: &Tensor, outer: usize, n: usize, inner: usize, path: cuda::reduce::SumPath) -> Vec<f64> {
    let st = x.storage();
    let asrforge::backend::Storage::Cuda(c) = &*st else { panic!("a device tensor") };
    cuda::reduce::sum_dim_acc_with(c, outer, n, inner, path).unwrap().to_cpu().unwrap().to_f64_vec()
}

/// Row sums (a warp per short row; a block per long row with 16-byte loads
/// after an unaligned head and the warp-shuffle block reduce; row tiles
/// whose sums the row's last block adds in order) and column sums by both paths (one thread per output; row tiles
/// × column strips with the tile sums added in a fixed order) against the
/// CPU's f64 sum of the same inputs, in every float dtype (half inputs sum
/// into f32), on ragged shapes: rows shorter and longer than a block, rows
/// starting off a 16-byte boundary, partial column strips, more rows or
/// strips than the capped grid. The tiled path gives the same bits twice.
#[test]
fn row_and_column_sums_by_every_path_match_the_cpu() {
    use cuda::reduce::{col_sum_plan, col_sum_tiling, row_sum_tiling, SumPath};
    let Some(dev) = gpu("row_and_column_sums_by_every_path_match_the_cpu") else { return };
    // The tiling covers every row once with tiles the grid can hold.
    for (o, n, i) in [(1, 2048, 256), (1, 128, 2), (3, 100_000, 7), (1, 129, 4096), (5, 64, 33), (1, 1, 2), (1, 70, 1)] {
        let (rows, tiles) = col_sum_tiling(o, n, i);
        assert!(rows % 8 == 0 && rows >= 64.min(n.next_multiple_of(8)), "({o}, {n}, {i}): {rows} rows a tile");
        assert!(tiles * rows >= n && (tiles - 1) * rows < n && tiles <= 65_535, "({o}, {n}, {i}): {tiles} tiles of {rows}");
    }
    // The bias gradient of a (2048, 256) activation: 8 strips × 32 tiles of 64 rows.
    assert_eq!((col_sum_plan(1, 2048, 256), col_sum_tiling(1, 2048, 256)), (SumPath::Tiled, (64, 32)));
    assert_eq!(col_sum_plan(1, 100, 256), SumPath::OnePass, "few rows: one pass");
    assert_eq!(col_sum_plan(64, 2048, 512), SumPath::OnePass, "many outputs: one pass");
    // Row tiles cover each row once; a full sum of 2^20 elements takes 64
    // blocks of 16 Ki, not one; short rows and many rows are not tiled.
    for (r, n) in [(1, 1 << 20), (3, 100_003), (1, 32_768), (63, 1 << 22), (2, 9_999_991)] {
        let (tile, tiles) = row_sum_tiling(r, n);
        assert!(tiles * tile >= n && (tiles - 1) * tile < n && (2..=512).contains(&tiles), "({r}, {n}): {tiles} tiles of {tile}");
    }
    assert_eq!(row_sum_tiling(1, 1 << 20), (16_384, 64));
    assert_eq!(row_sum_tiling(1, 32_767), (32_767, 1), "short: one block");
    assert_eq!(row_sum_tiling(64, 1 << 20), (1 << 20, 1), "64 rows fill 64 blocks already");
    // Rows: a warp each up to 256 (400 rows: more blocks of 8 rows than the
    // capped grid), a block each past it (257, 4099), or tiles of a row
    // (every row shape by the forced path; 100 003 and 3 x 70 001 by the
    // host's choice).
    let cases: [(usize, usize, usize); 12] = [
        (400, 3, 1),
        (41, 100, 1),
        (37, 256, 1),
        (5, 257, 1),
        (3, 4099, 1),
        (1, 100_003, 1),
        (3, 70_001, 1),
        (1, 2048, 256),
        (3, 517, 45),
        (7, 200, 300),
        (2, 1000, 2),
        (1, 5, 3),
    ];
    for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for (outer, n, inner) in cases {
            let seed = fresh_seed();
            let v = Rng::new(seed).normal(outer * n * inner);
            let x = tensor(&v, &[outer, n, inner], dt, &Device::Cpu);
            // The reference sums the inputs as the device sees them (rounded to dt).
            let xv = x.to_f64_vec().unwrap();
            let want: Vec<f64> = (0..outer * inner).map(|e| (0..n).map(|k| xv[(e / inner * n + k) * inner + e % inner]).sum()).collect();
            let xg = x.to_device(&dev).unwrap();
            let tol = if dt == DType::F64 { gpu::F64 } else { gpu::F32 };
            let paths: &[SumPath] = if inner == 1 { &[SumPath::Auto, SumPath::OnePass, SumPath::Tiled] } else { &[SumPath::OnePass, SumPath::Tiled] };
            for &path in paths {
                let got = device_sum(&xg, outer, n, inner, path);
                let what = format!("sum over n of ({outer}, {n}, {inner}) {dt:?} {path:?}");
                gpu::assert_close_floor(&what, &got, &want, tol, (n as f64).sqrt(), seed);
                if path == SumPath::Tiled {
                    let again = device_sum(&xg, outer, n, inner, path);
                    let same = got.iter().zip(&again).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{what}: a second run gave other bits (seed {seed})");
                }
            }
        }
    }
}

#[test]
fn matmul_through_cublas() {
    let Some(dev) = gpu("matmul_through_cublas") else { return };
    let cases: Vec<(&[usize], &[usize], bool, bool)> = vec![
        (&[17, 33], &[33, 9], false, false),
        (&[33, 17], &[33, 9], true, false),
        (&[17, 33], &[9, 33], false, true),
        (&[33, 17], &[9, 33], true, true),
        (&[3, 17, 33], &[3, 33, 9], false, false),
        (&[3, 17, 33], &[33, 9], false, false),
        (&[17, 33], &[3, 33, 9], false, false),
        (&[2, 3, 33, 17], &[2, 3, 9, 33], true, true),
    ];
    for (sa, sb, ta, tb) in cases {
        let f = move |x: &[Tensor]| ops::matmul_t(&x[0], &x[1], ta, tb);
        let name = format!("matmul {sa:?}x{sb:?} trans {ta}/{tb}");
        cmp(&name, &f, &[sa, sb], Kind::Normal, true, DType::F32, gpu::F32, &dev);
        cmp(&name, &f, &[sa, sb], Kind::Normal, true, DType::F64, gpu::F64, &dev);
        cmp_half(&name, &f, &[sa, sb], Kind::Normal, DType::F16, gpu::F16, &dev);
        cmp_half(&name, &f, &[sa, sb], Kind::Normal, DType::BF16, gpu::BF16, &dev);
    }
    let lin = |x: &[Tensor]| ops::linear(&x[0], &x[1], Some(&x[2]));
    cmp("linear", &lin, &[&[2, 5, 16], &[8, 16], &[8]], Kind::Normal, true, DType::F32, gpu::F32, &dev);
}

#[test]
fn scaled_products_carry_alpha_and_beta_through_cublas() {
    let Some(dev) = gpu("scaled_products_carry_alpha_and_beta_through_cublas") else { return };
    // Ragged dims; attention's layout (B, H, T, d_k)·(B, H, T2, d_k)ᵀ; a
    // shared operand on either side.
    let cases: Vec<(&[usize], &[usize], bool, bool)> = vec![
        (&[17, 33], &[33, 9], false, false),
        (&[33, 17], &[9, 33], true, true),
        (&[2, 3, 13, 8], &[2, 3, 11, 8], false, true),
        (&[3, 17, 33], &[9, 33], false, true),
        (&[17, 33], &[3, 33, 9], false, false),
        (&[2, 3, 33, 17], &[2, 3, 33, 9], true, false),
    ];
    for (sa, sb, ta, tb) in cases {
        let one = move |x: &[Tensor]| ops::matmul_scaled(&x[0], &x[1], ta, tb, 0.3);
        let pair = move |x: &[Tensor]| ops::matmul_pair_scaled(&x[0], &x[1], &x[2], &x[3], ta, tb, -0.7);
        let name = format!("matmul_scaled {sa:?}x{sb:?} trans {ta}/{tb}");
        let pname = format!("matmul_pair_scaled {sa:?}x{sb:?} trans {ta}/{tb}");
        for dt in [DType::F32, DType::F64] {
            cmp(&name, &one, &[sa, sb], Kind::Normal, true, dt, gpu::tol(dt), &dev);
            cmp(&pname, &pair, &[sa, sb, sa, sb], Kind::Normal, true, dt, gpu::tol(dt), &dev);
        }
        for dt in [DType::F16, DType::BF16] {
            cmp_half(&name, &one, &[sa, sb], Kind::Normal, dt, gpu::tol(dt), &dev);
            // The first product is stored in half before the second is added:
            // one more rounding, within the half tolerance of the sum's scale.
            cmp_half(&pname, &pair, &[sa, sb, sa, sb], Kind::Normal, dt, gpu::tol(dt), &dev);
        }
    }
}

#[test]
fn add_scaled_matches_the_cpu() {
    let Some(dev) = gpu("add_scaled_matches_the_cpu") else { return };
    let f = |x: &[Tensor]| ops::add_scaled(&x[0], &x[1], 0.5);
    let g = |x: &[Tensor]| ops::add_scaled(&x[0], &x[1], -1.75);
    // 1003: not a multiple of any vector width; 70_000: the grid wraps.
    for shape in [&[1003usize][..], &[7, 10_000]] {
        for dt in [DType::F32, DType::F64] {
            cmp("add_scaled 0.5", &f, &[shape, shape], Kind::Normal, true, dt, gpu::tol(dt), &dev);
            cmp("add_scaled -1.75", &g, &[shape, shape], Kind::Normal, true, dt, gpu::tol(dt), &dev);
        }
        for dt in [DType::F16, DType::BF16] {
            cmp_half("add_scaled 0.5", &f, &[shape, shape], Kind::Normal, dt, gpu::tol(dt), &dev);
            cmp_half("add_scaled -1.75", &g, &[shape, shape], Kind::Normal, dt, gpu::tol(dt), &dev);
        }
    }
}

#[test]
fn casts_match_the_cpu_exactly() {
    let Some(dev) = gpu("casts_match_the_cpu_exactly") else { return };
    let seed = fresh_seed();
    let mut v = draw(&mut Rng::new(seed), &[1000], Kind::Normal);
    v.iter_mut().for_each(|x| *x *= 300.0);
    v.extend([0.0, -0.0, 255.5, 256.0, -3.7, 65504.0, 1e-8]);
    let all = [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::U8];
    for from in all {
        let c = tensor(&v, &[v.len()], DType::F64, &Device::Cpu);
        let c = ops::to_dtype(&c, from).unwrap();
        let g = c.clone().to_device(&dev).unwrap();
        for to in all {
            let want = ops::to_dtype(&c, to).unwrap().to_cpu_storage().unwrap();
            let got = ops::to_dtype(&g, to).unwrap().to_cpu_storage().unwrap();
            assert_eq!(got, want, "cast {from:?} -> {to:?} (seed {seed})");
        }
    }
}

#[test]
fn out_of_memory_names_the_size_and_the_pool() {
    let Some(_) = gpu("out_of_memory_names_the_size_and_the_pool") else { return };
    let d = cuda::device(0).unwrap();
    let keep = d.alloc(DType::F32, 1 << 20).unwrap();
    let pib = 1usize << 50;
    let e = d.alloc(DType::U8, pib).unwrap_err().to_string();
    println!("{e}");
    assert!(e.contains(&format!("{pib} bytes")), "the size asked: {e}");
    let s = d.pool_stats();
    assert!(s.in_use >= 4 << 20, "the live 4 MiB buffer counts: {s:?}");
    for part in ["in use", "cached", "reserved", "peak", "out of memory"] {
        assert!(e.contains(part), "{part:?} missing: {e}");
    }
    drop(keep);
}

#[test]
fn a_dtype_without_a_kernel_and_a_buffer_of_another_type_are_named() {
    let Some(_) = gpu("a_dtype_without_a_kernel_and_a_buffer_of_another_type_are_named") else { return };
    let d = cuda::device(0).unwrap();
    let (x, y) = (d.alloc(DType::I64, 16).unwrap(), d.alloc(DType::I64, 16).unwrap());
    // softmax has f32, f64, f16 and bf16 kernels only.
    let e = kernels::softmax::softmax_fwd(&d, DType::I64, LaunchConfig::rows(1, 256), &x, &y, 1, 16).unwrap_err().to_string();
    assert!(e.contains("softmax/softmax_fwd") && e.contains("no kernel for i64") && e.contains("f32, f64, f16, bf16"), "{e}");
    // The f32 kernel given an f64 output buffer.
    let (xf, yd) = (d.alloc(DType::F32, 16).unwrap(), d.alloc(DType::F64, 16).unwrap());
    let e = kernels::softmax::softmax_fwd(&d, DType::F32, LaunchConfig::rows(1, 256), &xf, &yd, 1, 16).unwrap_err().to_string();
    assert!(e.contains("softmax/softmax_fwd_f32") && e.contains("pointer argument 1 expects f32 elements, got a f64 buffer"), "{e}");
}

#[test]
fn poisoned_allocations_read_nan_and_blocks_are_reused() {
    let Some(_) = gpu("poisoned_allocations_read_nan_and_blocks_are_reused") else { return };
    let d = cuda::device(0).unwrap();
    let a = d.alloc(DType::F32, 1000).unwrap();
    assert!(a.to_cpu().unwrap().to_f64_vec().iter().all(|x| x.is_nan()), "poisoned f32 reads NaN");
    let h = d.alloc(DType::BF16, 1000).unwrap();
    assert!(h.to_cpu().unwrap().to_f64_vec().iter().all(|x| x.is_nan()), "poisoned bf16 reads NaN");
    drop((a, h));
    // A size class no other test uses (tests run in parallel threads and
    // could otherwise take the freed block in between).
    let odd = 777_777;
    // The device-wide driver-allocation counter would see the other tests'
    // allocations too, so reuse is shown by the block itself: every
    // allocation of the class gets the address the first one freed.
    let first = d.alloc(DType::U8, odd).unwrap();
    let addr = first.address();
    drop(first);
    for i in 0..10 {
        let b = d.alloc(DType::U8, odd).unwrap();
        assert_eq!(b.address(), addr, "allocation {i}: a freed block of the class is reused, no cuMemAlloc");
        drop(b);
    }
    assert!(d.peak_bytes() >= d.current_bytes());
    let z = d.zeros(DType::F64, 77).unwrap();
    assert_eq!(z.to_cpu().unwrap().to_f64_vec(), vec![0.0; 77]);
}

/// Batches reach the GPU through reused pinned staging buffers: values
/// arrive intact for growing and shrinking sizes and both dtypes a batch has
/// (f32 features, i64 targets), while earlier uploads stay correct after
/// their buffer is reused.
#[test]
fn staged_uploads_arrive_intact_through_reused_pinned_buffers() {
    let Some(dev) = gpu("staged_uploads_arrive_intact_through_reused_pinned_buffers") else { return };
    let mut rng = Rng::new(fresh_seed());
    let mut kept = Vec::new();
    for n in [1usize, 1000, 70_000, 3, 70_001, 500] {
        let v: Vec<f32> = rng.normal(n).into_iter().map(|x| x as f32).collect();
        let t: Vec<i64> = (0..n as i64).map(|i| i * 7 - 3).collect();
        let g = Tensor::from_vec(v.clone(), [n], &Device::Cpu).unwrap().to_device_staged(&dev).unwrap();
        let gi = Tensor::from_vec(t.clone(), [n], &Device::Cpu).unwrap().to_device_staged(&dev).unwrap();
        assert_eq!(g.device(), dev);
        kept.push((g, v, gi, t));
    }
    for (g, v, gi, t) in &kept {
        assert_eq!(&g.to_vec::<f32>().unwrap(), v, "f32 upload of {} elements", v.len());
        assert_eq!(&gi.to_vec::<i64>().unwrap(), t, "i64 upload of {} elements", t.len());
    }
}

/// The multi-tensor cast (autocast's per-layer weight copies and their
/// gradients' way back) equals the per-tensor cast bit for bit, f32 to
/// f16/bf16 and back, on ragged lengths (empty, one element, lengths that
/// are not a multiple of the chunk) with chunks so small that tensors span
/// chunks and the chunks span several tables, under the capped grid. As an
/// op it records one tape node, and its backward converts every gradient
/// that arrived (and only those) back in the input's dtype.
/// `f` of the device storages of `ts` (held while it runs).
fn on_stores<R>(ts: &[&Tensor], f: impl FnOnce(&[&cuda::CudaStorage]) -> R) -> R {
    let guards: Vec<_> = ts.iter().map(|t| t.storage()).collect();
    let stores: Vec<&cuda::CudaStorage> = guards
        .iter()
        .map(|g| match &**g {
            asrforge::backend::Storage::Cuda(c) => c,
            _ => panic!("a device tensor"),
        })
        .collect();
    f(&stores)
}

/// `cast::gather_scalars_f64` of device tensors, read back.
fn gather(ts: &[&Tensor]) -> asrforge::Result<Vec<f64>> {
    on_stores(ts, |s| Ok(cuda::cast::gather_scalars_f64(s)?.to_cpu()?.to_f64_vec()))
}

/// A step's loss values come back with one copy: one-element tensors of
/// mixed float dtypes, gathered as f64 on the GPU (one launch per dtype among
/// them), equal each value read alone bit for bit (every float widens to f64
/// exactly), in order; 64 values at most, and anything else (a longer
/// tensor, an integer, too many values) is refused naming it, while
/// `Tensor::scalars_to_host` still reads those by its general path.
#[test]
fn gathered_scalars_equal_each_value_read_alone() {
    let Some(dev) = gpu("gathered_scalars_equal_each_value_read_alone") else { return };
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    let dts = [DType::F32, DType::BF16, DType::F64, DType::F16];
    for n in [1usize, 4, 7, 64] {
        let xs: Vec<Tensor> = (0..n).map(|i| tensor(&[rng.normal(1)[0] * 1000.0], &[], dts[(i * 7 + n) % 4], &dev)).collect();
        let want: Vec<u64> = xs.iter().map(|t| t.to_scalar().unwrap().to_bits()).collect();
        let got: Vec<u64> = Tensor::scalars_to_host(&xs.iter().collect::<Vec<_>>()).unwrap().iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want, "{n} values (seed {seed})");
        let direct: Vec<u64> = gather(&xs.iter().collect::<Vec<_>>()).unwrap().iter().map(|v| v.to_bits()).collect();
        assert_eq!(direct, want, "{n} values gathered directly (seed {seed})");
    }
    let one = tensor(&[1.5], &[], DType::F32, &dev);
    let pair = tensor(&[1.0, 2.0], &[2], DType::F32, &dev);
    let int = Tensor::from_vec(vec![3i64], [1], &Device::Cpu).unwrap().to_device(&dev).unwrap();
    let refused = |ts: &[&Tensor]| gather(ts).unwrap_err().to_string();
    let e = refused(&[&one, &pair]);
    assert!(e.contains("found 2 F32") && e.contains("value 1"), "{e}");
    let e = refused(&[&one, &int]);
    assert!(e.contains("I64") && e.contains("value 1"), "{e}");
    let many: Vec<&Tensor> = std::iter::repeat_n(&one, 65).collect();
    let e = refused(&many);
    assert!(e.contains("at most 64") && e.contains("65"), "{e}");
    // The general path still reads what the gather refuses.
    assert_eq!(Tensor::scalars_to_host(&[&one, &int]).unwrap(), vec![1.5, 3.0]);
    assert_eq!(Tensor::scalars_to_host(&many).unwrap(), vec![1.5; 65]);
}

#[test]
fn many_tensor_casts_equal_single_casts_bit_for_bit() {
    let Some(dev) = gpu("many_tensor_casts_equal_single_casts_bit_for_bit") else { return };
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    // 70 tensors (more than one by-value table's 64) of ragged lengths.
    let lens: Vec<usize> = (0..70).map(|i| [0, 1, 37, 64, 65, 300, 1031][i % 7] + i).collect();
    let vals: Vec<Vec<f64>> = lens
        .iter()
        .map(|&n| {
            let mut v = draw(&mut rng, &[n], Kind::Normal);
            v.iter_mut().for_each(|x| *x *= 300.0);
            if let Some(x) = v.first_mut() {
                *x = 65504.5;
            }
            if let Some(x) = v.last_mut() {
                *x = 1e-8;
            }
            v
        })
        .collect();
    for half in [DType::F16, DType::BF16] {
        let xs: Vec<Tensor> = vals.iter().zip(&lens).map(|(v, &n)| tensor(v, &[n], DType::F32, &dev)).collect();
        on_stores(&xs.iter().collect::<Vec<_>>(), |all| {
            // All 70 take a table in device memory (more than 64 tensors, or
            // with chunks of 7 and 64 more than 256 chunks); the first 10 in
            // chunks of 2^14 one by-value table, in chunks of 7 the device's.
            for (stores, chunk) in [(all, 7), (all, 64), (all, 1 << 14), (&all[..10], 1 << 14), (&all[..10], 7)] {
                let ys = cuda::cast::to_dtype_many_chunked(stores, half, chunk).unwrap();
                for (i, (y, s)) in ys.iter().zip(stores).enumerate() {
                    let want = cuda::cast::to_dtype(s, half).unwrap().to_cpu().unwrap();
                    assert_eq!(y.to_cpu().unwrap(), want, "{half:?} chunk {chunk} tensor {i} (len {}, seed {seed})", lens[i]);
                }
                let back = cuda::cast::to_dtype_many_chunked(&ys.iter().collect::<Vec<_>>(), DType::F32, chunk).unwrap();
                for (i, (b, y)) in back.iter().zip(&ys).enumerate() {
                    assert_eq!(
                        b.to_cpu().unwrap(),
                        cuda::cast::to_dtype(y, DType::F32).unwrap().to_cpu().unwrap(),
                        "{half:?} -> f32 chunk {chunk} tensor {i} (seed {seed})"
                    );
                }
            }
            // Copies (one dtype) of every tensor side by side into one buffer
            // (the packed weights' concatenation), through both table kinds.
            let halves = cuda::cast::to_dtype_many_chunked(all, half, 1 << 14).unwrap();
            let total: usize = lens.iter().sum();
            for (srcs, dt) in [(all.to_vec(), DType::F32), (halves.iter().collect::<Vec<_>>(), half)] {
                for n in [10, srcs.len()] {
                    let cat = ops::to_dtype(&Tensor::zeros([total], DType::F32, &dev).unwrap(), dt).unwrap();
                    on_stores(&[&cat], |dst| {
                        let mut at = 0;
                        let pieces: Vec<cuda::cast::CastPiece> = srcs[..n]
                            .iter()
                            .map(|s| {
                                let p = cuda::cast::CastPiece { src: s, src_at: 0, dst: dst[0], dst_at: at, len: s.len() };
                                at += s.len();
                                p
                            })
                            .collect();
                        cuda::cast::cast_pieces(&pieces).unwrap();
                        let got = dst[0].to_cpu().unwrap().to_f64_vec();
                        let want: Vec<f64> = srcs[..n].iter().flat_map(|s| s.to_cpu().unwrap().to_f64_vec()).collect();
                        assert_eq!(got[..want.len()], want[..], "{dt:?} copies of {n} tensors (seed {seed})");
                        assert!(got[want.len()..].iter().all(|&x| x == 0.0), "{dt:?} copies of {n} tensors wrote past their pieces");
                    });
                }
            }
        });
        // The op: one node; the gradients of the outputs that were used come back in f32.
        let ps: Vec<Tensor> = xs.iter().take(5).map(|t| t.detach().requires_grad_()).collect();
        let hs = ops::to_dtype_many(&ps, half).unwrap();
        assert_eq!(asrforge::autograd::tape_ops().iter().filter(|&&n| n == "to_dtype_many").count(), 1, "one node: {:?}", asrforge::autograd::tape_ops());
        let used = [1usize, 3, 4];
        let mut loss: Option<Tensor> = None;
        let mut seeds = Vec::new();
        for &i in &used {
            let r = draw(&mut rng, &[lens[i]], Kind::Normal);
            let rt = tensor(&r, &[lens[i]], half, &dev);
            let term = ops::sum_all(&ops::to_dtype(&ops::mul(&hs[i], &rt).unwrap(), DType::F32).unwrap()).unwrap();
            loss = Some(match loss {
                None => term,
                Some(l) => ops::add(&l, &term).unwrap(),
            });
            seeds.push(r);
        }
        asrforge::autograd::backward(&loss.unwrap()).unwrap();
        for (k, &i) in used.iter().enumerate() {
            let g = ps[i].grad().expect("a used output's input has a gradient");
            assert_eq!(g.dtype(), DType::F32);
            // d/dx Σ round(x)·r = r (rounded to the half type, as the product's gradient is half).
            let want = ops::to_dtype(&ops::to_dtype(&tensor(&seeds[k], &[lens[i]], DType::F64, &Device::Cpu), half).unwrap(), DType::F32)
                .unwrap()
                .to_cpu_storage()
                .unwrap();
            assert_eq!(g.to_cpu_storage().unwrap(), want, "{half:?} gradient of tensor {i} (seed {seed})");
        }
        for i in [0usize, 2] {
            assert!(ps[i].grad().is_none(), "{half:?}: tensor {i}'s copy was not used, so it gets no gradient");
        }
    }
}

/// `ops::cat_cast_many` on the GPU (the packed projection weights): every
/// output is the CPU's `to_dtype(cat(parts, 0))` bit for bit, to a half
/// type and f32 to f32 (a copy), with parts crossing the 16384-element
/// chunks and rows of other lengths after them; backward, each part gets
/// its rows of the output's gradient converted back, bit for bit the CPU's
/// narrow and conversion (one launch each way: tests/gpu_profile.rs).
#[test]
fn cat_cast_many_packs_and_splits_like_the_cpu() {
    let Some(dev) = gpu("cat_cast_many_packs_and_splits_like_the_cpu") else { return };
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    let shapes: [&[&[usize]]; 3] = [&[&[70, 300], &[3, 300], &[131, 300]], &[&[70], &[3], &[131]], &[&[5, 7]]];
    for to in [DType::BF16, DType::F16, DType::F32] {
        let vals: Vec<Vec<(Vec<f64>, Vec<usize>)>> =
            shapes.iter().map(|p| p.iter().map(|s| (draw(&mut rng, s, Kind::Normal).iter().map(|x| x * 300.0).collect(), s.to_vec())).collect()).collect();
        let make =
            |d: &Device| -> Vec<Vec<Tensor>> { vals.iter().map(|p| p.iter().map(|(v, s)| tensor(v, s, DType::F32, d).requires_grad_()).collect()).collect() };
        let (gpu_in, cpu_in) = (make(&dev), make(&Device::Cpu));
        let ys = ops::cat_cast_many(&gpu_in, to).unwrap();
        // Gradients seeded on outputs 0 and 2 (output 1 unused: its parts get
        // none); the GPU's backward first (a backward empties the tape).
        let rs: Vec<Vec<f64>> = [0usize, 2].iter().map(|&o| draw(&mut rng, ys[o].dims(), Kind::Normal)).collect();
        let seeds = |ys: &[Tensor], d: &Device| -> Vec<(Tensor, Tensor)> {
            [0usize, 2].iter().zip(&rs).map(|(&o, r)| (ys[o].clone(), tensor(r, ys[o].dims(), to, d))).collect()
        };
        asrforge::autograd::backward_with(&seeds(&ys, &dev)).unwrap();
        let want = ops::cat_cast_many(&cpu_in, to).unwrap();
        for (o, (y, w)) in ys.iter().zip(&want).enumerate() {
            assert_eq!(y.dims(), w.dims(), "{to:?} output {o}");
            assert_eq!(y.to_cpu_storage().unwrap(), w.to_cpu_storage().unwrap(), "{to:?} output {o} (seed {seed})");
        }
        asrforge::autograd::backward_with(&seeds(&want, &Device::Cpu)).unwrap();
        for (o, (pg, pc)) in gpu_in.iter().zip(&cpu_in).enumerate() {
            for (i, (g, c)) in pg.iter().zip(pc).enumerate() {
                if o == 1 {
                    assert!(g.grad().is_none(), "{to:?}: part {i} of the unused output has no gradient");
                    continue;
                }
                let (g, c) = (g.grad().expect("a used part's gradient"), c.grad().expect("a used part's gradient"));
                assert_eq!(g.dtype(), DType::F32);
                assert_eq!(g.to_cpu_storage().unwrap(), c.to_cpu_storage().unwrap(), "{to:?} gradient of part {i} of output {o} (seed {seed})");
            }
        }
    }
}
