//! CPU op benchmarks. `cargo bench --bench ops`; GFLOP/s for the products
//! is criterion's throughput in "elements" (= floating-point operations).
//!
//! The matmul group also times `matrixmultiply` on the same shapes: the
//! comparison that chose `gemm` for the CPU backend.

use asrforge::backend::cpu::conv::{self, Conv2d};
use asrforge::backend::cpu::optim::{self, AdamStep};
use asrforge::backend::cpu::CpuStorage;
use asrforge::backend::Storage;
use asrforge::ops::{self, Reduction};
use asrforge::tensor::Rng;
use asrforge::{autograd, DType, Device, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;

fn randn(shape: &[usize], rng: &mut Rng) -> Tensor {
    Tensor::randn(shape.to_vec(), 0.0, 1.0, DType::F32, rng, &Device::Cpu).unwrap()
}

fn matmul(c: &mut Criterion) {
    let mut g = c.benchmark_group("matmul");
    g.sample_size(10);
    let mut rng = Rng::new(1);
    for n in [512usize, 1024] {
        g.throughput(Throughput::Elements((2 * n * n * n) as u64));
        let (a, b) = (randn(&[n, n], &mut rng), randn(&[n, n], &mut rng));
        g.bench_with_input(BenchmarkId::new("gemm", n), &n, |bch, _| bch.iter(|| black_box(ops::matmul(&a, &b).unwrap())));
        let (av, bv) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        let mut cv = vec![0f32; n * n];
        g.bench_with_input(BenchmarkId::new("matrixmultiply", n), &n, |bch, _| {
            bch.iter(|| {
                // SAFETY: av, bv, cv hold n·n elements each, row-major with
                // row stride n and column stride 1, exactly what is passed.
                unsafe {
                    matrixmultiply::sgemm(n, n, n, 1.0, av.as_ptr(), n as isize, 1, bv.as_ptr(), n as isize, 1, 0.0, cv.as_mut_ptr(), n as isize, 1);
                }
                black_box(cv[0])
            })
        });
    }
    g.finish();
}

fn kernels(c: &mut Criterion) {
    let mut rng = Rng::new(2);
    let mut g = c.benchmark_group("kernels");
    g.sample_size(20);
    let x = randn(&[256, 4000], &mut rng);
    g.throughput(Throughput::Elements(x.elem_count() as u64));
    g.bench_function("softmax 256x4000", |b| b.iter(|| black_box(ops::softmax(&x).unwrap())));
    let h = randn(&[16 * 200, 256], &mut rng);
    let (w, bias) = (randn(&[256], &mut rng), randn(&[256], &mut rng));
    g.throughput(Throughput::Elements(h.elem_count() as u64));
    g.bench_function("layer_norm 3200x256", |b| b.iter(|| black_box(ops::layer_norm(&h, Some(&w), Some(&bias), 1e-5).unwrap())));
    let xc = randn(&[8, 200, 256], &mut rng);
    let wc = randn(&[256, 1, 15], &mut rng);
    g.throughput(Throughput::Elements(xc.elem_count() as u64));
    g.bench_function("conv1d_depthwise 8x200x256 k15", |b| b.iter(|| black_box(ops::conv1d_depthwise(&xc, &wc, None, 7).unwrap())));
    g.finish();

    let mut g = c.benchmark_group("ctc_loss");
    g.sample_size(10);
    let (bs, t, v, u) = (8, 200, 4000, 30);
    let lp = ops::log_softmax(&randn(&[bs, t, v], &mut rng)).unwrap();
    let tg: Vec<i64> = (0..bs * u).map(|i| 1 + (i as i64 * 7919) % (v as i64 - 1)).collect();
    let tg = Tensor::from_vec(tg, [bs, u], &Device::Cpu).unwrap();
    let (il, tl) = (vec![t; bs], vec![u; bs]);
    g.bench_function("forward B8 T200 V4000 U30", |b| b.iter(|| black_box(ops::ctc_loss(&lp, &tg, &il, &tl, 0, Reduction::Sum, true).unwrap())));
    let lpg = lp.requires_grad_();
    g.bench_function("forward+backward B8 T200 V4000 U30", |b| {
        b.iter(|| {
            let l = ops::ctc_loss(&lpg, &tg, &il, &tl, 0, Reduction::Sum, true).unwrap();
            autograd::backward(&l).unwrap();
            lpg.zero_grad();
        })
    });
    g.finish();
}

fn mlp(c: &mut Criterion) {
    let mut rng = Rng::new(3);
    let x = randn(&[64, 256], &mut rng);
    let w1 = randn(&[1024, 256], &mut rng).requires_grad_();
    let b1 = randn(&[1024], &mut rng).requires_grad_();
    let w2 = randn(&[10, 1024], &mut rng).requires_grad_();
    let mut g = c.benchmark_group("mlp");
    g.sample_size(20);
    g.bench_function("forward+backward 64x256-1024-10", |b| {
        b.iter(|| {
            let h = ops::relu(&ops::linear(&x, &w1, Some(&b1)).unwrap()).unwrap();
            let y = ops::log_softmax(&ops::linear(&h, &w2, None).unwrap()).unwrap();
            let l = ops::mean_all(&y).unwrap();
            autograd::backward(&l).unwrap();
            for p in [&w1, &b1, &w2] {
                p.zero_grad();
            }
        })
    });
    g.finish();
}

/// Forward + backward of the training step's heaviest kernels at the shapes
/// of the 4x144 conformer (B 16, T 300; the conv2d at a quarter batch).
fn train_kernels(c: &mut Criterion) {
    let mut rng = Rng::new(4);
    let mut g = c.benchmark_group("train_kernels");
    g.sample_size(10);
    let x = randn(&[4, 144, 149, 39], &mut rng).requires_grad_();
    let w = randn(&[144, 144, 3, 3], &mut rng).requires_grad_();
    let bias = randn(&[144], &mut rng).requires_grad_();
    let gy = randn(&[4, 144, 74, 19], &mut rng);
    g.throughput(Throughput::Elements(2 * 4 * 144 * 74 * 19 * 144 * 9u64));
    g.bench_function("conv2d fwd B4 144x149x39 k3 s2", |b| b.iter(|| black_box(autograd::no_grad(|| ops::conv2d(&x, &w, Some(&bias), 2, 0).unwrap()))));
    g.throughput(Throughput::Elements(3 * 2 * 4 * 144 * 74 * 19 * 144 * 9u64));
    g.bench_function("conv2d fwd+bwd B4 144x149x39 k3 s2", |b| {
        b.iter(|| {
            let y = ops::conv2d(&x, &w, Some(&bias), 2, 0).unwrap();
            autograd::backward_with(&[(y, gy.clone())]).unwrap();
            for p in [&x, &w, &bias] {
                p.zero_grad();
            }
        })
    });
    // The backward kernel alone, for both subsampling convs: the first reads
    // the features (one channel) and needs no input gradient.
    for (name, ci, h, wd, need_gx) in
        [("conv2d bwd B4 1x300x80 k3 s2 (no gx)", 1usize, 300usize, 80usize, false), ("conv2d bwd B4 144x149x39 k3 s2", 144, 149, 39, true)]
    {
        let geo = Conv2d { b: 4, ci, h, w: wd, co: 144, kh: 3, kw: 3, stride: 2, pad: 0 };
        let (ho, wo) = geo.out_hw();
        let (x, w, gy) = (randn(&[4, ci, h, wd], &mut rng), randn(&[144, ci, 3, 3], &mut rng), randn(&[4, 144, ho, wo], &mut rng));
        let n_gemm = if need_gx { 2 } else { 1 };
        g.throughput(Throughput::Elements((n_gemm * 2 * 4 * 144 * ho * wo * ci * 9) as u64));
        g.bench_function(name, |b| {
            let (xs, ws, gs) = (x.storage(), w.storage(), gy.storage());
            let (Storage::Cpu(xs), Storage::Cpu(ws), Storage::Cpu(gs)) = (&*xs, &*ws, &*gs) else { unreachable!("CPU tensors") };
            b.iter(|| black_box(conv::conv2d_backward(xs, ws, gs, &geo, need_gx).unwrap()))
        });
    }
    for (name, n) in [("relu", 1usize << 22), ("silu", 1 << 20), ("dropout", 1 << 22)] {
        let x = randn(&[n], &mut rng).requires_grad_();
        let gy = randn(&[n], &mut rng);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(format!("{name} fwd+bwd {n}"), |b| {
            b.iter(|| {
                let y = match name {
                    "relu" => ops::relu(&x).unwrap(),
                    "silu" => ops::silu(&x).unwrap(),
                    _ => ops::dropout(&x, 0.1, true).unwrap(),
                };
                autograd::backward_with(&[(y, gy.clone())]).unwrap();
                x.zero_grad();
            })
        });
    }
    let (x, w) = (randn(&[16 * 75, 144], &mut rng).requires_grad_(), randn(&[576, 144], &mut rng).requires_grad_());
    let bias = randn(&[576], &mut rng).requires_grad_();
    let gy = randn(&[16 * 75, 576], &mut rng);
    g.throughput(Throughput::Elements(3 * 2 * 16 * 75 * 144 * 576u64));
    g.bench_function("linear fwd+bwd 1200x144 -> 576", |b| {
        b.iter(|| {
            let y = ops::linear(&x, &w, Some(&bias)).unwrap();
            autograd::backward_with(&[(y, gy.clone())]).unwrap();
            for p in [&x, &w, &bias] {
                p.zero_grad();
            }
        })
    });
    // The model's linears take (B, T, D): the weight's gradient sums over B and T.
    let x3 = randn(&[16, 75, 144], &mut rng).requires_grad_();
    let gy3 = randn(&[16, 75, 576], &mut rng);
    g.bench_function("linear fwd+bwd 16x75x144 -> 576", |b| {
        b.iter(|| {
            let y = ops::linear(&x3, &w, Some(&bias)).unwrap();
            autograd::backward_with(&[(y, gy3.clone())]).unwrap();
            for p in [&x3, &w, &bias] {
                p.zero_grad();
            }
        })
    });
    g.finish();
}

/// The AISHELL conformer's heaviest kernels at its shapes (B 8, T 500: 124
/// frames after subsampling, ~14 tokens per utterance): the feed-forward
/// linears, the output layer over 4233 words, silu and dropout over the
/// feed-forward's hidden activations, forward and forward + backward.
fn aishell_kernels(c: &mut Criterion) {
    let mut rng = Rng::new(5);
    let mut g = c.benchmark_group("aishell_kernels");
    g.sample_size(10);
    for (name, rows, din, dout) in
        [("ffn1 8x124x256 -> 2048", 124usize, 256usize, 2048usize), ("ffn2 8x124x2048 -> 256", 124, 2048, 256), ("output 8x14x256 -> 4233", 14, 256, 4233)]
    {
        let x = randn(&[8, rows, din], &mut rng).requires_grad_();
        let w = randn(&[dout, din], &mut rng).requires_grad_();
        let bias = randn(&[dout], &mut rng).requires_grad_();
        let gy = randn(&[8, rows, dout], &mut rng);
        let flops = (2 * 8 * rows * din * dout) as u64;
        g.throughput(Throughput::Elements(flops));
        g.bench_function(format!("linear fwd {name}"), |b| b.iter(|| black_box(autograd::no_grad(|| ops::linear(&x, &w, Some(&bias)).unwrap()))));
        g.throughput(Throughput::Elements(3 * flops));
        g.bench_function(format!("linear fwd+bwd {name}"), |b| {
            b.iter(|| {
                let y = ops::linear(&x, &w, Some(&bias)).unwrap();
                autograd::backward_with(&[(y, gy.clone())]).unwrap();
                for p in [&x, &w, &bias] {
                    p.zero_grad();
                }
            })
        });
    }
    let n = 8 * 124 * 2048;
    let x = randn(&[n], &mut rng).requires_grad_();
    let gy = randn(&[n], &mut rng);
    g.throughput(Throughput::Elements(n as u64));
    for name in ["silu", "dropout"] {
        let f = |x: &Tensor| if name == "silu" { ops::silu(x).unwrap() } else { ops::dropout(x, 0.1, true).unwrap() };
        g.bench_function(format!("{name} fwd {n}"), |b| b.iter(|| black_box(autograd::no_grad(|| f(&x)))));
        g.bench_function(format!("{name} fwd+bwd {n}"), |b| {
            b.iter(|| {
                autograd::backward_with(&[(f(&x), gy.clone())]).unwrap();
                x.zero_grad();
            })
        });
    }
    // Attention's head split (the last dim stays last) and the conv module's (B, T, D) -> (B, D, T).
    for (name, shape, perm) in
        [("permute 8x124x4x64 [0,2,1,3]", vec![8usize, 124, 4, 64], vec![0usize, 2, 1, 3]), ("permute 8x124x512 [0,2,1]", vec![8, 124, 512], vec![0, 2, 1])]
    {
        let x = randn(&shape, &mut rng);
        g.throughput(Throughput::Elements(x.elem_count() as u64));
        g.bench_function(name, |b| b.iter(|| black_box(autograd::no_grad(|| ops::permute(&x, &perm).unwrap()))));
    }
    // Adam over the output layer's weight (4233 x 256), and the global
    // gradient norm over a gradient of that size.
    let n = 4233 * 256;
    let (mut p, gr, mut m, mut v) =
        (CpuStorage::F32(vec![0.5; n]), CpuStorage::F32(vec![1e-3; n]), CpuStorage::F32(vec![0.0; n]), CpuStorage::F32(vec![0.0; n]));
    let h = AdamStep { lr: 1e-3, beta1: 0.9, beta2: 0.98, eps: 1e-9, weight_decay: 1e-6, decoupled: false, t: 1 };
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function(format!("adam step {n}"), |b| b.iter(|| optim::adam(&mut p, &gr, &mut m, &mut v, &h).unwrap()));
    let w = randn(&[4233, 256], &mut rng).requires_grad_();
    autograd::backward_with(&[(ops::relu(&w).unwrap(), randn(&[4233, 256], &mut rng))]).unwrap();
    let params = vec![("w".to_string(), w)];
    g.bench_function(format!("grad_norm {n}"), |b| b.iter(|| black_box(asrforge::optim::grad_norm(&params).unwrap())));
    g.finish();
}

criterion_group!(benches, matmul, kernels, mlp, train_kernels, aishell_kernels);
criterion_main!(benches);
