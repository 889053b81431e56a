//! Kernels added for the fast GPU step, on `Cuda(0)` at AISHELL-conformer
//! shapes: layer norm (forward + backward), the convolution module's
//! channels-last batch norm, depthwise conv and GLU (forward + backward),
//! and softmax (forward + backward) in f32 and in bf16 (half activations: f32 statistics and sums),
//! attention's masked softmax and dropout (one kernel each way), the
//! log-softmax of the 4233-word output layer (a block per row), the
//! label-smoothing loss reduced on the device (`rows_total`) and token
//! accuracy (`token_hits`) over a 4233-word vocabulary; the reductions and
//! index math of the hardware-shaped kernels: a (2048, 256) bias gradient
//! by the one-pass and the tiled column sum, row sums with 16-byte loads,
//! and broadcast and permute by the u32 (host divisors) and 64-bit kernels;
//! the scaled attention-score pair and `add_scaled` against their unfused
//! launches; relative-position flash attention and the fused conformer
//! convolution module against their compositions.
//! It prints the launches of one (2048, 256) bias-gradient reduction, and
//! the host-side cost of one launch (`gpu_launch`).
//!
//! Without a GPU it prints why and benches nothing; under
//! `ASRFORGE_CUDA_EMU=1` it runs on the emulator, which only shows that it
//! runs: its timings mean something on a GPU.

use asrforge::autograd::backward;
use asrforge::ops;
use asrforge::tensor::{DType, Device, Rng, Tensor};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn gpu_kernels(c: &mut Criterion) {
    let gpu = match Device::cuda(0) {
        Ok(d) => d,
        Err(e) => {
            println!("gpu_kernels benches: skipped, no usable GPU: {e}");
            return;
        }
    };
    let mut rng = Rng::new(11);
    let mut group = c.benchmark_group("gpu_kernels");
    group.sample_size(10);
    // 16 utterances × 128 frames after subsampling, d = 256; 4 heads of 128 keys.
    for dt in [DType::F32, DType::BF16] {
        let x = ops::to_dtype(&Tensor::randn([2048, 256], 0.0, 1.0, DType::F32, &mut rng, &gpu).unwrap(), dt).unwrap().requires_grad_();
        let w = Tensor::randn([256], 1.0, 0.1, DType::F32, &mut rng, &gpu).unwrap().requires_grad_();
        let b = Tensor::randn([256], 0.0, 0.1, DType::F32, &mut rng, &gpu).unwrap().requires_grad_();
        group.bench_function(format!("layer_norm_fwd_bwd_2048x256_{}", dt.as_str()), |bn| {
            bn.iter(|| {
                let y = ops::layer_norm(&x, Some(&w), Some(&b), 1e-5).unwrap();
                backward(&ops::sum_all(&ops::to_dtype(&y, DType::F32).unwrap()).unwrap()).unwrap();
                gpu_sync(&w)
            })
        });
        // The macaron residual add and the next pre-norm (fusion family
        // `norm`): x + ½·y then layer_norm as two launches each way (the
        // composition) against add_layer_norm's one, both outputs used (the
        // sum carries on as the residual stream).
        let yr = ops::to_dtype(&Tensor::randn([2048, 256], 0.0, 1.0, DType::F32, &mut rng, &gpu).unwrap(), dt).unwrap().requires_grad_();
        // With the branch's dropout (p 0.1, training): the composition adds
        // dropout's launch each way, the fused kernels draw the mask inside.
        for (fused, p) in [(false, 0.0), (true, 0.0), (false, 0.1), (true, 0.1)] {
            let name = match (fused, p > 0.0) {
                (true, false) => "add_layer_norm_fused_fwd_bwd_2048x256",
                (false, false) => "add_scaled_layer_norm_fwd_bwd_2048x256",
                (true, true) => "dropout_add_layer_norm_fused_fwd_bwd_2048x256",
                (false, true) => "dropout_add_scaled_layer_norm_fwd_bwd_2048x256",
            };
            group.bench_function(format!("{name}_{}", dt.as_str()), |bn| {
                bn.iter(|| {
                    let (s, h) = if fused {
                        ops::add_layer_norm(&x, &yr, 0.5, p, Some(&w), Some(&b), 1e-5).unwrap()
                    } else {
                        let s = ops::add_scaled(&x, &ops::dropout(&yr, p, true).unwrap(), 0.5).unwrap();
                        let h = ops::layer_norm(&s, Some(&w), Some(&b), 1e-5).unwrap();
                        (s, h)
                    };
                    let l = ops::add(
                        &ops::sum_all(&ops::to_dtype(&s, DType::F32).unwrap()).unwrap(),
                        &ops::sum_all(&ops::to_dtype(&h, DType::F32).unwrap()).unwrap(),
                    )
                    .unwrap();
                    backward(&l).unwrap();
                    gpu_sync(&w)
                })
            });
        }
        // The feed-forward block's swish and dropout (p 0.1) over its
        // 2048 x 2048 hidden activations (AISHELL: 16 x 128 frames, 2048
        // units): one launch each way (fusion family `ffn`) against the
        // activation's and dropout's two.
        let hx = ops::to_dtype(&Tensor::randn([2048, 2048], 0.0, 1.0, DType::F32, &mut rng, &gpu).unwrap(), dt).unwrap().requires_grad_();
        for fused in [false, true] {
            let name = if fused { "silu_dropout_fused_fwd_bwd_2048x2048" } else { "silu_dropout_composition_fwd_bwd_2048x2048" };
            group.bench_function(format!("{name}_{}", dt.as_str()), |bn| {
                bn.iter(|| {
                    let y = if fused {
                        ops::activation_dropout(&hx, asrforge::backend::cpu::elementwise::Unary::Silu, 0.1, true).unwrap()
                    } else {
                        ops::dropout(&ops::silu(&hx).unwrap(), 0.1, true).unwrap()
                    };
                    backward(&ops::sum_all(&ops::to_dtype(&y, DType::F32).unwrap()).unwrap()).unwrap();
                    gpu_sync(&w)
                })
            });
        }
        // The decoder's positional encoding (fusion family `posenc`): the
        // f32 token embeddings of 32 x 40 tokens, d 256, times √d plus the
        // table's rows, cast to the step's dtype, dropout 0.1: one launch
        // each way against the narrow, affine, add, cast and dropout
        // forward and three backward.
        let xe = Tensor::randn([32, 40, 256], 0.0, 1.0, DType::F32, &mut rng, &gpu).unwrap().requires_grad_();
        let table = Tensor::randn([1, 5000, 256], 0.0, 1.0, DType::F32, &mut rng, &gpu).unwrap();
        for fused in [false, true] {
            let name = if fused { "pos_enc_dropout_fused_fwd_bwd_32x40x256" } else { "pos_enc_dropout_composition_fwd_bwd_32x40x256" };
            group.bench_function(format!("{name}_{}", dt.as_str()), |bn| {
                bn.iter(|| {
                    let y = if fused {
                        ops::pos_enc_dropout(&xe, 16.0, Some((&table, 0)), dt, 0.1, true).unwrap()
                    } else {
                        let y = ops::add(&ops::mul_scalar(&xe, 16.0).unwrap(), &ops::narrow(&table, 1, 0, 40).unwrap()).unwrap();
                        ops::dropout(&ops::to_dtype(&y, dt).unwrap(), 0.1, true).unwrap()
                    };
                    backward(&ops::sum_all(&ops::to_dtype(&y, DType::F32).unwrap()).unwrap()).unwrap();
                    gpu_sync(&w)
                })
            });
        }
        // The subsampling's first convolution and ReLU (fusion family
        // `subsampling`), AISHELL's shapes: 16 utterances of 400 frames of
        // 80 features into 256 channels of 199 x 39, 3x3 stride 2 (a small
        // product, the largest activations of the step): the bias and the
        // ReLU in one launch each way (the bias's gradient summed in the
        // backward's) against the add, relu and their backwards.
        let xs = ops::to_dtype(&Tensor::randn([16, 1, 400, 80], 0.0, 1.0, DType::F32, &mut rng, &gpu).unwrap(), dt).unwrap().requires_grad_();
        let ws = ops::to_dtype(&Tensor::randn([256, 1, 3, 3], 0.0, 0.3, DType::F32, &mut rng, &gpu).unwrap(), dt).unwrap().requires_grad_();
        let bs = ops::to_dtype(&Tensor::randn([256], 0.0, 0.1, DType::F32, &mut rng, &gpu).unwrap(), dt).unwrap().requires_grad_();
        for fused in [false, true] {
            let name = if fused { "conv2d_relu_fused_fwd_bwd_16x1x400x80_to_256" } else { "conv2d_relu_composition_fwd_bwd_16x1x400x80_to_256" };
            group.bench_function(format!("{name}_{}", dt.as_str()), |bn| {
                bn.iter(|| {
                    let y = if fused {
                        ops::conv2d_relu(&xs, &ws, Some(&bs), 2, 0).unwrap()
                    } else {
                        ops::relu(&ops::conv2d(&xs, &ws, Some(&bs), 2, 0).unwrap()).unwrap()
                    };
                    backward(&ops::sum_all(&ops::to_dtype(&y, DType::F32).unwrap()).unwrap()).unwrap();
                    gpu_sync(&w)
                })
            });
        }
        // The convolution module, channels last: batch norm over (B·T, C)
        // with f32 statistics (training: the running update in the stats
        // launch), the depthwise conv (k = 15) and GLU, forward + backward.
        let (rm, rv) = (Tensor::zeros([256], DType::F32, &gpu).unwrap(), Tensor::ones([256], DType::F32, &gpu).unwrap());
        group.bench_function(format!("batch_norm_fwd_bwd_2048x256_{}", dt.as_str()), |bn| {
            bn.iter(|| {
                let st = ops::BatchNormState { running_mean: &rm, running_var: &rv, momentum: 0.1, eps: 1e-5, training: true };
                let y = ops::batch_norm(&x, &w, &b, &st).unwrap();
                backward(&ops::sum_all(&ops::to_dtype(&y, DType::F32).unwrap()).unwrap()).unwrap();
                gpu_sync(&w)
            })
        });
        let xc = ops::reshape(&x.detach(), [16, 128, 256]).unwrap().requires_grad_();
        let wd = ops::to_dtype(&Tensor::randn([256, 1, 15], 0.0, 0.3, DType::F32, &mut rng, &gpu).unwrap(), dt).unwrap().requires_grad_();
        group.bench_function(format!("conv1d_depthwise_fwd_bwd_16x128x256_k15_{}", dt.as_str()), |bn| {
            bn.iter(|| {
                let y = ops::conv1d_depthwise(&xc, &wd, None, 7).unwrap();
                backward(&ops::sum_all(&ops::to_dtype(&y, DType::F32).unwrap()).unwrap()).unwrap();
                gpu_sync(&wd)
            })
        });
        let xg = ops::to_dtype(&Tensor::randn([16, 128, 512], 0.0, 1.0, DType::F32, &mut rng, &gpu).unwrap(), dt).unwrap().requires_grad_();
        group.bench_function(format!("glu_fwd_bwd_16x128x512_{}", dt.as_str()), |bn| {
            bn.iter(|| {
                let y = ops::glu(&xg, -1).unwrap();
                backward(&ops::sum_all(&ops::to_dtype(&y, DType::F32).unwrap()).unwrap()).unwrap();
                gpu_sync(&w)
            })
        });
        let s = ops::to_dtype(&Tensor::randn([16 * 4 * 128, 128], 0.0, 1.0, DType::F32, &mut rng, &gpu).unwrap(), dt).unwrap().requires_grad_();
        group.bench_function(format!("softmax_fwd_bwd_8192x128_{}", dt.as_str()), |bn| {
            bn.iter(|| {
                let y = ops::softmax(&s).unwrap();
                backward(&ops::sum_all(&ops::to_dtype(&y, DType::F32).unwrap()).unwrap()).unwrap();
                gpu_sync(&w)
            })
        });
        // Attention's probabilities under a key-padding mask (B, 1, 1, T2), then dropout.
        let m: Vec<u8> = (0..16 * 128).map(|i| u8::from(i % 128 >= 96 + i / 128)).collect();
        let mask = Tensor::from_vec(m, [16, 1, 1, 128], &Device::Cpu).unwrap().to_device(&gpu).unwrap();
        let sc = ops::reshape(&s, [16, 4, 128, 128]).unwrap();
        group.bench_function(format!("masked_softmax_dropout_fwd_bwd_16x4x128x128_{}", dt.as_str()), |bn| {
            bn.iter(|| {
                let y = ops::dropout(&ops::masked_softmax(&sc, &mask).unwrap(), 0.1, true).unwrap();
                backward(&ops::sum_all(&ops::to_dtype(&y, DType::F32).unwrap()).unwrap()).unwrap();
                gpu_sync(&w)
            })
        });
        // Relative-position scores of 16 utterances × 4 heads × 128 frames,
        // d_k = 64: the scaled pair (two GEMMs, alpha and beta inside)
        // against the products, add and scale as separate launches.
        let qk: Vec<Tensor> =
            (0..4).map(|_| ops::to_dtype(&Tensor::randn([16, 4, 128, 64], 0.0, 1.0, DType::F32, &mut rng, &gpu).unwrap(), dt).unwrap()).collect();
        group.bench_function(format!("rel_scores_scaled_pair_16x4x128x64_{}", dt.as_str()), |bn| {
            bn.iter(|| gpu_sync(&ops::matmul_pair_scaled(&qk[0], &qk[1], &qk[2], &qk[3], false, true, 0.125).unwrap()))
        });
        group.bench_function(format!("rel_scores_unfused_16x4x128x64_{}", dt.as_str()), |bn| {
            bn.iter(|| {
                let ac = ops::matmul_t(&qk[0], &qk[1], false, true).unwrap();
                let bd = ops::matmul_t(&qk[2], &qk[3], false, true).unwrap();
                gpu_sync(&ops::mul_scalar(&ops::add(&ac, &bd).unwrap(), 0.125).unwrap())
            })
        });
        // The macaron residual x + ½·ff(x) over (2048, 256): one launch against two.
        let r = ops::to_dtype(&Tensor::randn([2048, 256], 0.0, 1.0, DType::F32, &mut rng, &gpu).unwrap(), dt).unwrap();
        group.bench_function(format!("add_scaled_2048x256_{}", dt.as_str()), |bn| bn.iter(|| gpu_sync(&ops::add_scaled(&x, &r, 0.5).unwrap())));
        group.bench_function(format!("add_mul_scalar_2048x256_{}", dt.as_str()), |bn| {
            bn.iter(|| gpu_sync(&ops::add(&x, &ops::mul_scalar(&r, 0.5).unwrap()).unwrap()))
        });
    }
    // The CTC head's log-probabilities: 16 × 128 frames over 4233 symbols.
    let lp = Tensor::randn([2048, 4233], 0.0, 2.0, DType::F32, &mut rng, &gpu).unwrap().requires_grad_();
    group.bench_function("log_softmax_fwd_bwd_2048x4233", |bn| {
        bn.iter(|| {
            backward(&ops::sum_all(&ops::log_softmax(&lp).unwrap()).unwrap()).unwrap();
            gpu_sync(&lp)
        })
    });
    // The decoder's logits: 16 sequences of 32 tokens over 4233 words.
    let logits = Tensor::randn([16, 32, 4233], 0.0, 2.0, DType::F32, &mut rng, &gpu).unwrap().requires_grad_();
    let tg: Vec<i64> = (0..16 * 32).map(|i| if i % 7 == 6 { -1 } else { (i * 131 % 4233) as i64 }).collect();
    let target = Tensor::from_vec(tg, [16, 32], &Device::Cpu).unwrap();
    // The reference (gradient written by the forward) and the fused kernels
    // (log-sum-exp kept, gradient written by the backward): the fusion
    // switch's `loss` family against its composition.
    type Loss = fn(&Tensor, &Tensor, f64, i64, bool) -> asrforge::Result<Tensor>;
    let impls: [(&str, Loss); 2] = [
        ("label_smoothing_fwd_bwd_512x4233", ops::label_smoothing_loss_reference),
        ("label_smoothing_fused_fwd_bwd_512x4233", ops::label_smoothing_loss_fused),
    ];
    // The fewest bytes a loss's forward + backward moves: the logits read
    // by the forward and the backward, the gradient written once
    // (criterion's bytes/s; the H200 copies 4.11 TB/s).
    group.throughput(Throughput::Bytes(3 * 16 * 32 * 4233 * 4));
    for (name, loss) in impls {
        group.bench_function(name, |bn| {
            bn.iter(|| {
                let l = loss(&logits, &target, 0.1, -1, false).unwrap();
                backward(&l).unwrap();
                gpu_sync(&l)
            })
        });
    }
    group.throughput(Throughput::Bytes(16 * 32 * 4233 * 4));
    group.bench_function("token_accuracy_512x4233", |bn| bn.iter(|| ops::token_accuracy(&logits, &target, -1).unwrap().to_scalar().unwrap()));
    // CTC over the encoder's logits: 16 sequences of 128 frames (512 after
    // 4x subsampling), 20 labels each; the composition
    // ctc_loss(log_softmax(x)) against the fused kernels.
    let ctc_x = Tensor::randn([16, 128, 4233], 0.0, 2.0, DType::F32, &mut rng, &gpu).unwrap().requires_grad_();
    let labels: Vec<i64> = (0..16 * 20).map(|i| 1 + (i * 37 % 4232) as i64).collect();
    let ctc_tg = Tensor::from_vec(labels, [16, 20], &Device::Cpu).unwrap();
    let (il, tl) = (vec![128usize; 16], vec![20usize; 16]);
    group.throughput(Throughput::Bytes(3 * 16 * 128 * 4233 * 4));
    for fused in [false, true] {
        let name = if fused { "ctc_fused_fwd_bwd_16x128x4233" } else { "ctc_log_softmax_fwd_bwd_16x128x4233" };
        group.bench_function(name, |bn| {
            bn.iter(|| {
                let l = if fused {
                    ops::ctc_loss_fused(&ctc_x, &ctc_tg, &il, &tl, 0, ops::Reduction::Sum, true).unwrap()
                } else {
                    ops::ctc_loss(&ops::log_softmax(&ctc_x).unwrap(), &ctc_tg, &il, &tl, 0, ops::Reduction::Sum, true).unwrap()
                };
                backward(&l).unwrap();
                gpu_sync(&l)
            })
        });
    }
    group.finish();
}

/// Waits for the queued work (a one-element read), so a sample times the kernels.
/// The kernel lab (cuda/lab_<family>.cu): every variant of the fused
/// label-smoothing forward against the production kernel, on the decoder's
/// logits (512 rows of 4233), and of the fused CTC's recursion;
/// tests/kernel_lab.rs checks them first.
fn kernel_lab(c: &mut Criterion) {
    use asrforge::backend::cpu::CpuStorage;
    use asrforge::backend::cuda::{self, lab, loss, CudaStorage};
    let Ok(Device::Cuda(ordinal)) = Device::cuda(0) else {
        println!("kernel_lab benches: skipped, no usable GPU");
        return;
    };
    let dev = cuda::device(ordinal).unwrap();
    let mut rng = Rng::new(13);
    let (rows, v) = (512, 4233);
    let x: Vec<f32> = rng.normal(rows * v).into_iter().map(|z| (2.0 * z) as f32).collect();
    let tg: Vec<i64> = (0..rows).map(|i| if i % 7 == 6 { -1 } else { (i * 131 % v) as i64 }).collect();
    let xg = CudaStorage::from_cpu(&dev, &CpuStorage::F32(x)).unwrap();
    let mut group = c.benchmark_group("kernel_lab/label_smoothing_fused_fwd_512x4233");
    group.sample_size(10);
    group.bench_function("production", |bn| bn.iter(|| loss::label_smoothing_fused_fwd(&xg, &tg, v, 0.1, -1).unwrap().0.to_cpu().unwrap()));
    for variant in lab::LABEL_SMOOTHING_FUSED_FWD {
        group.bench_function(*variant, |bn| bn.iter(|| lab::label_smoothing_fused_fwd(variant, &xg, &tg, v, 0.1, -1).unwrap().0.to_cpu().unwrap()));
    }
    group.finish();
    // The fused CTC's recursion (with its row log-sum-exps and dense
    // gradient, as production runs them): 16 sequences of 128 frames over
    // 4233 symbols, 20 labels each, production's block per sequence against
    // the lab's variants.
    use asrforge::backend::cpu::ctc::CtcDims;
    let (b, t, v, s) = (16, 128, 4233, 20);
    let x: Vec<f32> = rng.normal(b * t * v).into_iter().map(|z| (2.0 * z) as f32).collect();
    let xg = CudaStorage::from_cpu(&dev, &CpuStorage::F32(x)).unwrap();
    let labels: Vec<i64> = (0..b * s).map(|i| 1 + (i * 37 % (v - 1)) as i64).collect();
    let (il, tl, d) = (vec![t; b], vec![s; b], CtcDims { b, t, v, s, blank: 0 });
    let mut group = c.benchmark_group("kernel_lab/ctc_loss_fused_16x128x4233_s20");
    group.sample_size(10);
    group.bench_function("production", |bn| bn.iter(|| cuda::ctc::ctc_loss_fused(&xg, &labels, &il, &tl, &d, true).unwrap().0.to_cpu().unwrap()));
    for variant in lab::CTC_LOSS_FUSED {
        group.bench_function(*variant, |bn| bn.iter(|| lab::ctc_loss_fused(variant, &xg, &labels, &il, &tl, &d, true).unwrap().0.to_cpu().unwrap()));
    }
    group.finish();
}

fn gpu_sync(t: &Tensor) -> f64 {
    ops::sum_all(&ops::to_dtype(t, DType::F32).unwrap()).unwrap().to_scalar().unwrap()
}

/// The kernels of the hardware-shaped reductions and index math, each path.
fn reduce_and_index(c: &mut Criterion) {
    use asrforge::backend::cpu::elementwise::Binary;
    use asrforge::backend::cuda::{self, elementwise::broadcast_binary_with, fastdiv::IndexWidth, layout, reduce};
    use asrforge::backend::Storage;
    let Ok(gpu) = Device::cuda(0) else { return };
    let mut rng = Rng::new(12);
    let dev = cuda::device(0).unwrap();
    // Waits for the queued kernel, so a sample times it.
    let sync = |y: cuda::CudaStorage| {
        dev.synchronize().unwrap();
        y
    };
    let mut group = c.benchmark_group("gpu_reduce_index");
    group.sample_size(10);
    for dt in [DType::F32, DType::BF16] {
        let g = ops::to_dtype(&Tensor::randn([2048, 256], 0.0, 1.0, DType::F32, &mut rng, &gpu).unwrap(), dt).unwrap();
        let st = g.storage();
        let Storage::Cuda(cg) = &*st else { return };
        for (name, path) in [("one_pass", reduce::SumPath::OnePass), ("tiled", reduce::SumPath::Tiled)] {
            if dt == DType::F32 {
                let before = cuda::counters(0).unwrap();
                drop(reduce::sum_dim_acc_with(cg, 1, 2048, 256, path).unwrap());
                let d = cuda::counters(0).unwrap().since(&before);
                println!("bias gradient (2048, 256) {name}: {} launch(es), {} host sync(s), {} driver alloc(s)", d.launches, d.host_syncs, d.driver_allocs);
            }
            group.bench_function(format!("bias_grad_sum_2048x256_{name}_{}", dt.as_str()), |bn| {
                bn.iter(|| sync(reduce::sum_dim_acc_with(cg, 1, 2048, 256, path).unwrap()))
            });
        }
        group.bench_function(format!("sum_rows_2048x256_{}", dt.as_str()), |bn| bn.iter(|| sync(reduce::sum_dim_acc(cg, 2048, 256, 1).unwrap())));
        // A full sum of 2048 x 4233 logits (8.7 M elements): one block, or
        // row tiles (the host's choice).
        let big = ops::to_dtype(&Tensor::randn([2048 * 4233], 0.0, 1.0, DType::F32, &mut rng, &gpu).unwrap(), dt).unwrap();
        let sbig = big.storage();
        let Storage::Cuda(cbig) = &*sbig else { return };
        for (name, path) in [("one_block", reduce::SumPath::OnePass), ("row_tiles", reduce::SumPath::Auto)] {
            group.bench_function(format!("sum_all_8669184_{name}_{}", dt.as_str()), |bn| {
                bn.iter(|| sync(reduce::sum_dim_acc_with(cbig, 1, 2048 * 4233, 1, path).unwrap()))
            });
        }
        // (16, 128, 256) + (256): the bias add of a linear's output; (16, 128, 4, 64) -> (16, 4, 128, 64): heads.
        let b = ops::to_dtype(&Tensor::randn([256], 0.0, 1.0, DType::F32, &mut rng, &gpu).unwrap(), dt).unwrap();
        let sb = b.storage();
        let Storage::Cuda(cb) = &*sb else { return };
        for (name, w) in [("u32", IndexWidth::Auto), ("i64", IndexWidth::Wide)] {
            group.bench_function(format!("bcast_add_16x128x256_{name}_{}", dt.as_str()), |bn| {
                bn.iter(|| sync(broadcast_binary_with(Binary::Add, cg, &[16, 128, 256], cb, &[256], w).unwrap()))
            });
            group.bench_function(format!("permute_16x128x4x64_{name}_{}", dt.as_str()), |bn| {
                bn.iter(|| sync(layout::permute_with(cg, &[16, 128, 4, 64], &[0, 2, 1, 3], w).unwrap()))
            });
        }
    }
    // The subsampling's second conv2d (3×3, stride 2) at 16 × 512 frames of
    // 80 mels: x (16, 256, 255, 39), columns (16, 2304, 127·19), f32; the
    // image copies by both index widths.
    let g = asrforge::backend::cpu::conv::Conv2d { b: 16, ci: 256, h: 255, w: 39, co: 256, kh: 3, kw: 3, stride: 2, pad: 0 };
    let (ho, wo) = g.out_hw();
    let x = Tensor::randn([g.b * g.ci * g.h * g.w], 0.0, 1.0, DType::F32, &mut rng, &gpu).unwrap();
    let cols = Tensor::randn([g.b * g.ci * 9 * ho * wo], 0.0, 1.0, DType::F32, &mut rng, &gpu).unwrap();
    let (sx, sc) = (x.storage(), cols.storage());
    let (Storage::Cuda(cx), Storage::Cuda(cc)) = (&*sx, &*sc) else { return };
    for (name, w) in [("u32", IndexWidth::Auto), ("i64", IndexWidth::Wide)] {
        group.bench_function(format!("im2col_16x256x255x39_k3s2_{name}_f32"), |bn| bn.iter(|| sync(cuda::conv::im2col_with(cx, &g, w).unwrap())));
        group.bench_function(format!("col2im_16x256x255x39_k3s2_{name}_f32"), |bn| bn.iter(|| sync(cuda::conv::col2im_with(cc, &g, w).unwrap())));
    }
    group.finish();
}

/// Relative-position attention forward + backward with key padding:
/// `ops::flash_attention` (three kernels, no (B, H, T, T) tensor) against
/// the composition it replaces (bias adds, permutes, `matmul_pair_scaled`,
/// `masked_softmax`, `matmul`), in f32 and bf16, at the AISHELL conformer's
/// shapes (B 16, T 128 and B 32, T 400 after subsampling, 4 heads of 64) and
/// a larger model's (B 8, T 1500, d 512 as 8 heads of 64). Criterion's
/// throughput is the attention's useful FLOPs, reported as elements/s
/// (so Gelem/s reads as GFLOP/s): 6·B·H·T²·d forward ((q+u)kᵀ, (q+v)pᵀ,
/// P·V) and 12·B·H·T²·d backward (dV, dP, dq's two products, dk, dp), the
/// same count for both; compare with the H200's 758 TFLOP/s bf16 (GPU.md).
/// In f16 and bf16 the fused op runs with each kernel set, forced through
/// `set_kernel_override`: `fused_wmma64_*` (tensor-core tiles sized for
/// head dims up to 64, the default pick at these shapes; their two-pass
/// forward does 1.5x the forward's score products, not counted),
/// `fused_wmma_*` (the same tiles sized for head dims up to 128, which
/// give the same bits with more registers) and `fused_scalar_*`; f32 has
/// only the scalar set (`fused_f32`). On the emulated device only the
/// first shape, f32/bf16 and the 64-wide and scalar sets run (CI proves
/// they run).
fn flash_attention_vs_composition(c: &mut Criterion) {
    use asrforge::backend::cuda::attention::{set_kernel_override, AttentionKernel};
    let Ok(gpu) = Device::cuda(0) else {
        println!("flash attention benches: skipped, no usable GPU");
        return;
    };
    let emulated = asrforge::backend::cuda::device(0).map(|d| d.is_emulated()).unwrap_or(true);
    let shapes: &[(usize, usize, usize, usize)] = if emulated { &[(16, 128, 4, 64)] } else { &[(16, 128, 4, 64), (32, 400, 4, 64), (8, 1500, 8, 64)] };
    let mut rng = Rng::new(13);
    let mut group = c.benchmark_group("flash_attention");
    group.sample_size(10);
    for &(b, t, h, d) in shapes {
        let lens: Vec<usize> = (0..b).map(|i| t - i * (t / (2 * b))).collect();
        let m: Vec<u8> = lens.iter().flat_map(|&l| (0..t).map(move |j| u8::from(j >= l))).collect();
        let mask = Tensor::from_vec(m, [b, 1, 1, t], &Device::Cpu).unwrap().to_device(&gpu).unwrap();
        group.throughput(Throughput::Elements((18 * b * h * t * t * d) as u64));
        let scale = 1.0 / (d as f64).sqrt();
        let dtypes: &[DType] = if emulated { &[DType::F32, DType::BF16] } else { &[DType::F32, DType::F16, DType::BF16] };
        for &dt in dtypes {
            let mk =
                |s: &[usize], rng: &mut Rng| ops::to_dtype(&Tensor::randn(s.to_vec(), 0.0, 1.0, DType::F32, rng, &gpu).unwrap(), dt).unwrap().requires_grad_();
            let (q, k, v, p) = (mk(&[b, t, h, d], &mut rng), mk(&[b, t, h, d], &mut rng), mk(&[b, t, h, d], &mut rng), mk(&[1, t, h, d], &mut rng));
            let u = Tensor::randn([h, d], 0.0, 0.1, DType::F32, &mut rng, &gpu).unwrap().requires_grad_();
            let vb = Tensor::randn([h, d], 0.0, 0.1, DType::F32, &mut rng, &gpu).unwrap().requires_grad_();
            let fm = ops::FlashMask { key_lengths: Some(lens.clone()), ..Default::default() };
            let shape = format!("{b}x{t}x{h}x{d}");
            let sets: &[(&str, AttentionKernel)] = match (dt, emulated) {
                (DType::F32, _) => &[("", AttentionKernel::Scalar)],
                (_, true) => &[("wmma64_", AttentionKernel::Wmma64), ("scalar_", AttentionKernel::Scalar)],
                (_, false) => &[("wmma64_", AttentionKernel::Wmma64), ("wmma_", AttentionKernel::Wmma), ("scalar_", AttentionKernel::Scalar)],
            };
            for &(set, kernel) in sets {
                set_kernel_override(Some(kernel));
                group.bench_function(format!("relpos_fwd_bwd_{shape}_fused_{set}{}", dt.as_str()), |bn| {
                    bn.iter(|| {
                        let o = ops::flash_attention(&q, &k, &v, Some(ops::RelPos { p: &p, u: &u, vb: &vb }), &fm, 0.1, true).unwrap();
                        backward(&ops::sum_all(&ops::to_dtype(&o, DType::F32).unwrap()).unwrap()).unwrap();
                        gpu_sync(&u)
                    })
                });
                set_kernel_override(None);
            }
            group.bench_function(format!("relpos_fwd_bwd_{shape}_composition_{}", dt.as_str()), |bn| {
                bn.iter(|| {
                    let heads = |x: &Tensor| ops::permute(x, &[0, 2, 1, 3]).unwrap();
                    let (qu, qv) = (ops::add(&q, &ops::to_dtype(&u, dt).unwrap()).unwrap(), ops::add(&q, &ops::to_dtype(&vb, dt).unwrap()).unwrap());
                    let pb = ops::broadcast_to(&p, &[b, t, h, d]).unwrap();
                    let s = ops::matmul_pair_scaled(&heads(&qu), &heads(&k), &heads(&qv), &heads(&pb), false, true, scale).unwrap();
                    let a = ops::dropout(&ops::masked_softmax(&s, &mask).unwrap(), 0.1, true).unwrap();
                    let o = heads(&ops::matmul(&a, &heads(&v)).unwrap());
                    backward(&ops::sum_all(&ops::to_dtype(&o, DType::F32).unwrap()).unwrap()).unwrap();
                    gpu_sync(&u)
                })
            });
        }
    }
    group.finish();
}

/// The conformer convolution module between its two GEMMs
/// (`ops::conv_module_core`: GLU, frame mask, depthwise conv k 15, batch
/// norm in training, swish), forward + backward, fused (`convmodule` on)
/// against the composition, at B 16, T 100 after subsampling, C 256, ragged
/// lengths, f32 and bf16 (the norm's parameters and statistics f32).
fn conv_module_vs_composition(c: &mut Criterion) {
    use asrforge::ops::fusion::{set_enabled, Fusion};
    let Ok(gpu) = Device::cuda(0) else { return };
    let mut rng = Rng::new(13);
    let mut group = c.benchmark_group("conv_module");
    group.sample_size(10);
    let (b, t, ch, k) = (16, 100, 256, 15);
    let m: Vec<u8> = (0..b * t).map(|i| u8::from(i % t >= t - 3 * (i / t))).collect();
    let mask = Tensor::from_vec(m, [b, t, 1], &Device::Cpu).unwrap().to_device(&gpu).unwrap();
    for dt in [DType::F32, DType::BF16] {
        let a = ops::to_dtype(&Tensor::randn([b, t, 2 * ch], 0.0, 1.0, DType::F32, &mut rng, &gpu).unwrap(), dt).unwrap().requires_grad_();
        let w = ops::to_dtype(&Tensor::randn([ch, 1, k], 0.0, 0.3, DType::F32, &mut rng, &gpu).unwrap(), dt).unwrap().requires_grad_();
        let wb = ops::to_dtype(&Tensor::randn([ch], 0.0, 0.1, DType::F32, &mut rng, &gpu).unwrap(), dt).unwrap().requires_grad_();
        let nw = Tensor::randn([ch], 1.0, 0.1, DType::F32, &mut rng, &gpu).unwrap().requires_grad_();
        let nb = Tensor::randn([ch], 0.0, 0.1, DType::F32, &mut rng, &gpu).unwrap().requires_grad_();
        let (rm, rv) = (Tensor::zeros([ch], DType::F32, &gpu).unwrap(), Tensor::ones([ch], DType::F32, &gpu).unwrap());
        group.throughput(Throughput::Bytes((a.size_in_bytes() * 3) as u64));
        for (name, fams) in [("fused", &[Fusion::ConvModule][..]), ("composition", &[][..])] {
            group.bench_function(format!("bn_swish_fwd_bwd_16x100x256_k15_{name}_{}", dt.as_str()), |bn| {
                bn.iter(|| {
                    set_enabled(fams);
                    let st = ops::BatchNormState { running_mean: &rm, running_var: &rv, momentum: 0.1, eps: 1e-5, training: true };
                    let norm = ops::ConvCoreNorm::Batch { weight: &nw, bias: &nb, state: st };
                    let y = ops::conv_module_core(&a, Some(&mask), &w, Some(&wb), (k - 1) / 2, &norm).unwrap();
                    backward(&ops::sum_all(&ops::to_dtype(&y, DType::F32).unwrap()).unwrap()).unwrap();
                    set_enabled(&[]);
                    gpu_sync(&nw)
                })
            });
        }
    }
    group.finish();
}

/// Host-side cost of one launch: a one-element `affine_f32` (one block of
/// 32 threads) launched 10 000 times per sample through the generated
/// typed function, then one synchronisation. On the emulator the kernel
/// itself runs inside the launch (its fiber scheduler, about a microsecond),
/// so the number is the emulated launch; the wrapper's own share is what
/// the typed path removed (string formatting, a mutex and map lookup, an
/// environment read and three Vecs per launch before). It also prints the
/// fastest and median of 30 runs of 10 000 launches timed by hand.
fn launch_overhead(c: &mut Criterion) {
    use asrforge::backend::cuda;
    let Ok(_) = Device::cuda(0) else { return };
    let dev = cuda::device(0).unwrap();
    let x = dev.zeros(DType::F32, 1).unwrap();
    let y = dev.alloc(DType::F32, 1).unwrap();
    let cfg = cuda::LaunchConfig { grid: (1, 1, 1), block: (32, 1, 1), shared_bytes: 0 };
    const N: usize = 10_000;
    let run = || {
        for _ in 0..N {
            cuda::kernels::elementwise::affine(&dev, DType::F32, cfg, &x, &y, 2.0, 1.0, 1).unwrap();
        }
        dev.synchronize().unwrap();
    };
    run();
    // The fastest and the median of 30 timed runs (the fastest is the least
    // disturbed by other work on a shared machine).
    // Wall time, and this thread's CPU time (which other processes on a
    // shared machine do not inflate; the emulator runs a one-block launch
    // on the launching thread).
    let cpu = || {
        let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).unwrap();
        t.tv_sec() as f64 * 1e6 + t.tv_nsec() as f64 * 1e-3
    };
    let (mut wall, mut thread): (Vec<f64>, Vec<f64>) = (0..30)
        .map(|_| {
            let (t, c) = (std::time::Instant::now(), cpu());
            run();
            (t.elapsed().as_secs_f64() * 1e6 / N as f64, (cpu() - c) / N as f64)
        })
        .unzip();
    wall.sort_by(f64::total_cmp);
    thread.sort_by(f64::total_cmp);
    let kind = if dev.is_emulated() { "emulated" } else { "GPU" };
    println!(
        "launch overhead ({kind}, 30 x 10 000 launches of a 1-element affine_f32): wall {:.3} us fastest, {:.3} median; thread CPU {:.3} us fastest, {:.3} median",
        wall[0], wall[15], thread[0], thread[15]
    );
    let mut group = c.benchmark_group("gpu_launch");
    group.sample_size(10);
    group.bench_function("launch_affine_f32_1elem_x10000", |bn| bn.iter(run));
    group.finish();
}

criterion_group!(benches, gpu_kernels, reduce_and_index, flash_attention_vs_composition, conv_module_vs_composition, launch_overhead, kernel_lab);
criterion_main!(benches);
