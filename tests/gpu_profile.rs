//! The GPU step profile and the launch signature check, on `Cuda(0)` (a GPU,
//! or the emulated one in CI): the profile of a `bench-train` step counts
//! exactly the launches and GEMMs the seam's counters saw in that step; a
//! known kernel's bytes read and written are its tensors' sizes and a
//! product's FLOPs are 2·m·n·k; and a launch whose arguments do not match
//! the kernel's C signature (scanned by build.rs) fails naming the argument.
//!
//! The profile is process-wide while on, so these tests run one at a time.
#![cfg(feature = "cuda")]

mod common;

use asrforge::backend::cpu::CpuStorage;
use asrforge::backend::cuda::{self, kernels, CudaStorage, LaunchConfig};
use asrforge::tensor::Rng;
use asrforge::train::bench::{run_bench_train, BenchTrainArgs};
use asrforge::{DType, Device, Tensor};

use common::fresh_seed as seed;
use common::gpu::serial;

/// conf/tiny.yaml: the build tree's, or the one staged beside the binary on a GPU host (.device/conf).
fn tiny_config() -> std::path::PathBuf {
    let built = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/conf/tiny.yaml"));
    [built.clone(), "conf/tiny.yaml".into(), ".device/conf/tiny.yaml".into()].into_iter().find(|p| p.is_file()).unwrap_or(built)
}

/// Two profiled bench-train steps of the tiny config on the GPU.
fn profiled_bench(dtype: &str, tf32: bool) -> BenchTrainArgs {
    BenchTrainArgs {
        config: tiny_config(),
        override_config: Vec::new(),
        steps: 2,
        device: "cuda".into(),
        dtype: dtype.into(),
        batch_size: 2,
        frames: 64,
        seed: seed() % 1000,
        warmup: 1,
        profile: true,
        tf32,
    }
}

/// What [`fusion_step`] gives: the output, what the forward gave beside
/// it, the named gradients (taken and zeroed) and the launches.
type FusionStep<X> = (Tensor, X, Vec<(String, Vec<f64>)>, u64);

/// One forward with only the fusion `family` switched on (when `on`; every
/// family off otherwise and after), the generator reseeded to `seed` first,
/// and the backward of Σ y·w (w drawn from `seed` in y's shape and dtype):
/// the output, what `forward` gave beside it, the gradients of `params` in
/// order (each taken and zeroed) and the launches on `ord` of both passes.
fn fusion_step<X>(
    ord: usize,
    family: asrforge::ops::fusion::Fusion,
    on: bool,
    seed: u64,
    params: &[(String, Tensor)],
    forward: impl FnOnce() -> asrforge::Result<(Tensor, X)>,
) -> FusionStep<X> {
    use asrforge::ops::{self, fusion};
    let only = [family];
    fusion::set_enabled(if on { &only } else { &[] });
    asrforge::tensor::rng::manual_seed(seed);
    let before = cuda::counters(ord).unwrap();
    let out = forward();
    fusion::set_enabled(&[]);
    let (y, extra) = out.unwrap();
    let w = Tensor::randn(y.dims().to_vec(), 0.0, 1.0, DType::F32, &mut Rng::new(seed ^ 0x5eed), &Device::Cpu).unwrap();
    let w = ops::to_dtype(&w, y.dtype()).unwrap().to_device(&y.device()).unwrap();
    asrforge::autograd::backward(&ops::sum_all(&ops::mul(&y, &w).unwrap()).unwrap()).unwrap();
    let launches = cuda::counters(ord).unwrap().since(&before).launches;
    let grads = params
        .iter()
        .map(|(name, p)| {
            let g = p.grad().unwrap_or_else(|| panic!("{name} has no gradient")).to_f64_vec().unwrap();
            p.zero_grad();
            (name.clone(), g)
        })
        .collect();
    (y, extra, grads, launches)
}

#[test]
fn the_profile_of_a_bench_step_counts_every_launch_the_seam_counted() {
    let Some(_) = common::gpu::gpu("the_profile_of_a_bench_step_counts_every_launch_the_seam_counted") else { return };
    let _s = serial();
    let args = profiled_bench("bf16", false);
    let r = run_bench_train(&args).expect("bench-train --device cuda --profile");
    let (p, step) = r.kernel_profile.expect("a kernel profile on the GPU with --profile");
    assert!(step.launches > 50, "a training step launches many kernels: {step:?}");
    assert_eq!(p.launches(), step.launches, "the profile's launches equal the seam's launch counter for the step\n{}", p.table());
    let gemms: u64 = p.rows.iter().filter(|r| r.family.starts_with("cublas")).map(|r| r.launches).sum();
    assert_eq!(gemms, step.gemms, "the profile's GEMM launches equal the seam's GEMM counter\n{}", p.table());
    assert_eq!(p.unknown_kinds, 0, "every kernel launched has a scanned signature\n{}", p.table());
    for row in &p.rows {
        assert!(row.bytes_read + row.bytes_written > 0, "{} moves bytes", row.family);
        assert!(row.model_ms > 0.0, "{} has a modelled time", row.family);
        assert_eq!(row.flops > 0, row.family.starts_with("cublas"), "{}: FLOPs are the products'", row.family);
        assert!(!row.family.ends_with("_bf16") && !row.family.ends_with("_f32"), "families carry no dtype suffix: {}", row.family);
    }
    // bf16 autocast: the products run in bf16.
    assert!(p.rows.iter().any(|r| r.family == "cublas/gemm bf16"), "bf16 GEMMs under bf16 autocast\n{}", p.table());
    let table = p.table();
    assert!(table.contains("MODEL") && table.contains("total"), "{table}");
    if p.emulated {
        assert!(p.rows.iter().all(|r| r.measured_ms.is_none()), "the emulator measures nothing");
    } else {
        assert!(p.rows.iter().all(|r| r.measured_ms.is_some_and(|m| m >= 0.0)), "a GPU measures every family with events\n{table}");
    }
}

#[test]
fn a_known_kernel_and_a_product_are_counted_from_their_tensors_sizes() {
    let Some(dev) = common::gpu::gpu("a_known_kernel_and_a_product_are_counted_from_their_tensors_sizes") else { return };
    let _s = serial();
    let mut rng = Rng::new(seed());
    let n = 1000 + rng.below(5000);
    let host = |len: usize, rng: &mut Rng| rng.normal(len).into_iter().map(|v| v as f32).collect::<Vec<f32>>();
    let a = Tensor::from_vec(host(n, &mut rng), [n], &dev).unwrap();
    let b = Tensor::from_vec(host(n, &mut rng), [n], &dev).unwrap();
    let (m, k, nn) = (3 + rng.below(40), 5 + rng.below(40), 7 + rng.below(40));
    let x = Tensor::from_vec(host(m * k, &mut rng), [m, k], &dev).unwrap();
    let w = Tensor::from_vec(host(k * nn, &mut rng), [k, nn], &dev).unwrap();
    let Device::Cuda(ord) = dev else { unreachable!("gpu() gives a CUDA device") };
    let before = cuda::counters(ord).unwrap();
    cuda::start_profile(ord).unwrap();
    let ab = asrforge::ops::to_dtype(&a, DType::BF16).unwrap();
    let bb = asrforge::ops::to_dtype(&b, DType::BF16).unwrap();
    let sum = asrforge::ops::add(&ab, &bb).unwrap();
    let prod = asrforge::ops::matmul(&x, &w).unwrap();
    let p = cuda::stop_profile(ord).unwrap();
    let step = cuda::counters(ord).unwrap().since(&before);
    drop((sum, prod));
    assert_eq!(p.launches(), step.launches, "{}", p.table());
    let cast = p.row("cast/cast").unwrap_or_else(|| panic!("the f32 -> bf16 casts ran\n{}", p.table()));
    assert_eq!((cast.launches, cast.bytes_read, cast.bytes_written), (2, 2 * 4 * n as u64, 2 * 2 * n as u64), "two casts of {n} elements");
    let add = p.row("elementwise/add").unwrap_or_else(|| panic!("the bf16 add ran\n{}", p.table()));
    assert_eq!((add.launches, add.bytes_read, add.bytes_written), (1, 2 * 2 * n as u64, 2 * n as u64), "a + b of {n} bf16 elements");
    let g = p.row("cublas/gemm f32").unwrap_or_else(|| panic!("the f32 product ran\n{}", p.table()));
    assert_eq!(g.launches, 1);
    assert_eq!(g.flops, 2 * (m * k * nn) as u64, "({m}, {k}) x ({k}, {nn})");
    assert_eq!((g.bytes_read, g.bytes_written), (4 * (m * k + k * nn) as u64, 4 * (m * nn) as u64));
    assert!(g.model_ms > 0.0 && add.model_ms > 0.0);
}

#[test]
fn a_launch_whose_buffers_do_not_match_the_kernels_c_types_fails_naming_the_argument() {
    let Some(Device::Cuda(ord)) = common::gpu::gpu("a_launch_whose_buffers_do_not_match_the_kernels_c_types_fails_naming_the_argument") else { return };
    let _s = serial();
    // build.rs scanned `cast_f32_bf16(const float* x, bf16* y, i64 n)` and
    // `add_bcast_f32(const T* a, const T* b, T* y, Bcast bc, i64 n)`.
    assert_eq!(kernels::signature("cast", "cast_f32_bf16"), Some("io8"));
    assert_eq!(kernels::signature("elementwise", "add_bcast_f32"), Some("iios8"));
    assert_eq!(kernels::signature("cast", "no_such_kernel"), None);
    let dev = cuda::device(ord).unwrap();
    let n = 300usize;
    let x = CudaStorage::from_cpu(&dev, &CpuStorage::F32((0..n).map(|i| i as f32 * 0.25).collect())).unwrap();
    let y = dev.alloc(DType::BF16, n).unwrap();
    let cfg = LaunchConfig::for_elems(n);
    // A wrong argument count or kind no longer compiles (the launch
    // functions are generated from the signatures); the element types of
    // the buffers are checked at the launch.
    let e = kernels::cast::cast(&dev, DType::F32, DType::BF16, cfg, &x, &x, n as i64).unwrap_err().to_string();
    assert!(e.contains("cast/cast_f32_bf16") && e.contains("pointer argument 1 expects bf16 elements, got a f32 buffer"), "{e}");
    let e = kernels::cast::cast(&dev, DType::F16, DType::BF16, cfg, &x, &y, n as i64).unwrap_err().to_string();
    assert!(e.contains("cast/cast_f16_bf16") && e.contains("pointer argument 0 expects f16 elements, got a f32 buffer"), "{e}");
    // The matching launch runs, and rounds each value to bf16 (exact here: multiples of 1/4 below 75).
    kernels::cast::cast(&dev, DType::F32, DType::BF16, cfg, &x, &y, n as i64).unwrap();
    let CpuStorage::BF16(v) = y.to_cpu().unwrap() else { panic!("bf16 storage") };
    for (i, b) in v.iter().enumerate() {
        assert_eq!(b.to_f32(), half::bf16::from_f32(i as f32 * 0.25).to_f32(), "element {i}");
    }
}

#[test]
fn bench_train_tf32_runs_the_f32_products_as_tf32() {
    let Some(_) = common::gpu::gpu("bench_train_tf32_runs_the_f32_products_as_tf32") else { return };
    let _s = serial();
    let args = profiled_bench("fp32", true);
    let r = run_bench_train(&args);
    // TF32 is process-wide: put it back (off, the default) before anything can fail.
    let allowed = cuda::blas::allow_tf32();
    cuda::blas::set_allow_tf32(false);
    let (p, _) = r.expect("bench-train --tf32").kernel_profile.expect("a kernel profile");
    assert!(allowed, "--tf32 reaches blas::allow_tf32");
    let tf32: u64 = p.rows.iter().filter(|r| r.family.starts_with("cublas") && r.family.contains("tf32")).map(|r| r.launches).sum();
    assert!(tf32 > 0, "f32 products run as TF32\n{}", p.table());
    assert!(p.rows.iter().all(|r| !(r.family.starts_with("cublas") && r.family.ends_with(" f32"))), "no plain f32 product is left\n{}", p.table());
}

/// The fusion switch on a whole training step: `ASRFORGE_FUSION=all`
/// (flash attention, the fused losses) against `none` (the compositions):
/// the same losses within the dtype's tolerance and fewer launches.
#[test]
fn fusion_all_runs_the_same_step_in_fewer_launches() {
    let Some(_) = common::gpu::gpu("fusion_all_runs_the_same_step_in_fewer_launches") else { return };
    let _s = serial();
    // The config's `fusion:` key chooses (bench-train sets the switch from it).
    let text = std::fs::read_to_string(tiny_config()).expect("conf/tiny.yaml");
    let dir = std::env::temp_dir().join(format!("asrforge-fusion-step-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let configs: Vec<std::path::PathBuf> = ["none", "all"]
        .iter()
        .map(|f| {
            let p = dir.join(format!("tiny_fusion_{f}.yaml"));
            std::fs::write(&p, format!("{text}\nfusion: {f}\n")).unwrap();
            p
        })
        .collect();
    for (dtype, tol) in [("fp32", 1e-4), ("bf16", 5e-3)] {
        let mut runs = Vec::new();
        let base = profiled_bench(dtype, false);
        for config in &configs {
            let r = run_bench_train(&BenchTrainArgs { config: config.clone(), ..base.clone() });
            asrforge::ops::fusion::set_enabled(&[]);
            let r = r.expect("bench-train --device cuda --profile");
            let (_, step) = r.kernel_profile.clone().expect("a kernel profile");
            runs.push((r, step));
        }
        let ((none, none_step), (all, all_step)) = (&runs[0], &runs[1]);
        assert_eq!((none.fusion.as_str(), all.fusion.as_str()), ("none", "all"));
        for (i, (a, b)) in all.losses.iter().zip(&none.losses).enumerate() {
            assert!((a - b).abs() <= tol * b.abs(), "{dtype} step {}: fused loss {a} vs composition {b} (tolerance {tol} relative)", i + 1);
        }
        assert!(all_step.launches < none_step.launches, "{dtype}: fused {} launches vs composition {}", all_step.launches, none_step.launches);
        // At 16 frames after subsampling the score matrices the fused path
        // never stores are smaller than its log-sum-exp and stand-in
        // buffers: within 1 % here; tests/attention_memory.rs shows the
        // O(T) against O(T²) at long T.
        assert!(all.peak_bytes <= none.peak_bytes + none.peak_bytes / 100, "{dtype}: fused peak {} vs composition {}", all.peak_bytes, none.peak_bytes);
        eprintln!(
            "{dtype}: fusion=all {} launches, peak {} B, losses {:?}; fusion=none {} launches, peak {} B, losses {:?}",
            all_step.launches, all.peak_bytes, all.losses, none_step.launches, none.peak_bytes, none.losses
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The attention's kernel sets launch alike: one kernel forward, two
/// backward and, with relative positions, `attention_pos_grads` for the
/// gradients of the table and the two biases (it replaced eight launches
/// of a composition), no host synchronisation, for the scalar set and both
/// wmma widths (bf16, rel-pos, key lengths), each named in the profile.
#[test]
fn attention_kernel_sets_launch_one_kernel_forward_and_three_backward_with_positions() {
    use asrforge::backend::cpu::attention::{AttentionDims, AttentionDropout, AttentionRule};
    use asrforge::backend::cuda::attention::{flash_attention, flash_attention_backward, set_kernel_override, AttentionKernel, MaskGpu, QkvGrads, QkvLayout};
    let Some(Device::Cuda(ord)) = common::gpu::gpu("attention_kernel_sets_launch_one_kernel_forward_and_three_backward_with_positions") else { return };
    let _s = serial();
    let dev = cuda::device(ord).unwrap();
    let mut rng = Rng::new(seed());
    let n = AttentionDims { batch: 2, t1: 20, t2: 20, heads: 2, d_k: 64, pos_batch: 1 };
    let bf =
        |len: usize, rng: &mut Rng| CudaStorage::from_cpu(&dev, &CpuStorage::BF16(rng.normal(len).into_iter().map(half::bf16::from_f64).collect())).unwrap();
    let (q, k, v, p, dout) = (bf(n.q_len(), &mut rng), bf(n.k_len(), &mut rng), bf(n.k_len(), &mut rng), bf(n.k_len() / 2, &mut rng), bf(n.q_len(), &mut rng));
    let f32s = |len: usize, rng: &mut Rng| CudaStorage::from_cpu(&dev, &CpuStorage::F32(rng.normal(len).into_iter().map(|v| v as f32).collect())).unwrap();
    let (u, vb) = (f32s(n.heads * n.d_k, &mut rng), f32s(n.heads * n.d_k, &mut rng));
    let lens = CudaStorage::from_cpu(&dev, &CpuStorage::I64(vec![20, 13])).unwrap();
    let rule = AttentionRule::default();
    let m = MaskGpu { lens: Some(&lens), mask: None };
    for (set, fwd, bwd) in [
        (AttentionKernel::Scalar, "attention/attention_fwd", ["attention/attention_bwd_dq", "attention/attention_bwd_dkv", "attention/attention_pos_grads"]),
        (
            AttentionKernel::Wmma,
            "attention/attention_fwd_wmma",
            ["attention/attention_bwd_dq_wmma", "attention/attention_bwd_dkv_wmma", "attention/attention_pos_grads"],
        ),
        (
            AttentionKernel::Wmma64,
            "attention/attention_fwd_wmma64",
            ["attention/attention_bwd_dq_wmma64", "attention/attention_bwd_dkv_wmma64", "attention/attention_pos_grads"],
        ),
    ] {
        set_kernel_override(Some(set));
        let before = cuda::counters(ord).unwrap();
        cuda::start_profile(ord).unwrap();
        let layout = QkvLayout::dense(&n);
        let (o, lse) = flash_attention(&q, &k, &v, &layout, Some((&p, &u, &vb)), &n, &rule, m, &AttentionDropout::NONE).unwrap();
        let pf = cuda::stop_profile(ord).unwrap();
        let cf = cuda::counters(ord).unwrap().since(&before);
        let before = cuda::counters(ord).unwrap();
        cuda::start_profile(ord).unwrap();
        let (dq, dk, dv) = (dev.alloc(DType::BF16, n.q_len()).unwrap(), dev.alloc(DType::BF16, n.k_len()).unwrap(), dev.alloc(DType::BF16, n.k_len()).unwrap());
        let out = QkvGrads { dq: &dq, dk: &dk, dv: &dv };
        let g = flash_attention_backward(&q, &k, &v, &layout, out, Some((&p, &u, &vb)), &o, &lse, &dout, &n, &rule, m, &AttentionDropout::NONE).unwrap();
        let pb = cuda::stop_profile(ord).unwrap();
        let cb = cuda::counters(ord).unwrap().since(&before);
        set_kernel_override(None);
        assert_eq!((cf.launches, cf.host_syncs), (1, 0), "{set:?} forward\n{}", pf.table());
        assert_eq!(pf.row(fwd).map(|r| r.launches), Some(1), "{set:?} forward runs {fwd}\n{}", pf.table());
        assert_eq!((cb.launches, cb.host_syncs), (3, 0), "{set:?} backward\n{}", pb.table());
        for b in bwd {
            assert_eq!(pb.row(b).map(|r| r.launches), Some(1), "{set:?} backward runs {b}\n{}", pb.table());
        }
        assert!(g.is_some());
        let kept = cuda::kept_arrivals(ord).unwrap().expect("attention_pos_grads made the counters");
        assert!(kept.iter().all(|&c| c == 0), "{set:?}: the arrival counters are left at 0: {kept:?}");
    }
}

/// The `norm` fusion on the blocks: a conformer block (pre-norm, macaron,
/// rel-pos attention, the convolution module, norm_final), a post-norm
/// transformer encoder block and a pre-norm decoder block, f32 on the GPU with residual dropout 0.1 (the
/// generator reseeded so both runs draw the same masks), fusion `norm` on
/// against off: the same output and gradients (every parameter and the
/// input) within f32 rounding, in fewer launches (each fused residual add is
/// one launch less forward; backward, the add of the two gradients of the
/// sum and the macaron ½ scale go into the norm's backward).
#[test]
fn norm_fusion_runs_the_blocks_the_same_in_fewer_launches() {
    use asrforge::models::config::{Activation, ConvNorm, EncoderConfig, EncoderType, SelfAttnType};
    use asrforge::models::decoder::DecoderLayer;
    use asrforge::models::encoder::frame_pad_mask;
    use asrforge::models::encoder_layer::EncoderLayer;
    use asrforge::models::ffn::FeedForward;
    use asrforge::nn::{AttentionMask, Dropout, LayerNorm, Module, MultiHeadedAttention};
    use asrforge::ops::fusion::Fusion;
    let Some(dev) = common::gpu::gpu("norm_fusion_runs_encoder_layers_the_same_in_fewer_launches") else { return };
    let Device::Cuda(ord) = dev else { return };
    let _s = serial();
    let s = seed();
    let mut rng = Rng::new(s);
    let (b, t, d, dt) = (2, 13, 32, DType::F32);
    let ln = || LayerNorm::new(d, 1e-5, dt).unwrap();
    let c = EncoderConfig {
        output_size: d,
        attention_heads: 2,
        linear_units: 48,
        cnn_module_kernel: 5,
        cnn_module_norm: ConvNorm::LayerNorm,
        attention_dropout_rate: 0.0,
        ..EncoderConfig::defaults(EncoderType::Conformer).unwrap()
    };
    let conformer = EncoderLayer::new(&c, true, dt, &mut rng).unwrap();
    let plain = EncoderConfig { selfattention_layer_type: SelfAttnType::Plain, normalize_before: false, ..c.clone() };
    let post_norm = EncoderLayer::new(&plain, false, dt, &mut rng).unwrap();
    let x = Tensor::randn(vec![b, t, d], 0.0, 1.0, dt, &mut rng, &Device::Cpu).unwrap().to_device(&dev).unwrap().requires_grad_();
    let pos = Tensor::randn(vec![1, t, d], 0.0, 1.0, dt, &mut rng, &Device::Cpu).unwrap().to_device(&dev).unwrap();
    let mask = AttentionMask::key_padding(&[t, 8], t).unwrap();
    let pad = frame_pad_mask(&[t, 8], t).unwrap().to_device(&dev).unwrap();
    let decoder = DecoderLayer {
        self_attn: MultiHeadedAttention::new(2, d, 0.0, dt, &mut rng).unwrap(),
        src_attn: MultiHeadedAttention::new(2, d, 0.0, dt, &mut rng).unwrap(),
        feed_forward: FeedForward::new(d, 48, 0.0, Activation::Relu, dt, &mut rng).unwrap(),
        norm1: ln(),
        norm2: ln(),
        norm3: ln(),
        dropout: Dropout::new(0.1),
        normalize_before: true,
    };
    let memory = Tensor::randn(vec![b, t + 3, d], 0.0, 1.0, dt, &mut rng, &Device::Cpu).unwrap().to_device(&dev).unwrap();
    let (tgt, mem_mask) = (AttentionMask::causal_padding(&[t, 9], t).unwrap(), AttentionMask::key_padding(&[t + 3, 6], t + 3).unwrap());
    type Forward<'a> = Box<dyn Fn() -> asrforge::Result<Tensor> + 'a>;
    let cases: [(&str, &dyn Module, Forward); 3] = [
        ("conformer", &conformer, Box::new(|| conformer.forward(&x, Some(&mask), &pos, Some(&pad)))),
        ("post-norm transformer", &post_norm, Box::new(|| post_norm.forward(&x, Some(&mask), &pos, Some(&pad)))),
        ("decoder", &decoder, Box::new(|| decoder.forward(&x, &tgt, &memory, &mem_mask))),
    ];
    for (what, layer, forward) in cases {
        for (_, p) in layer.named_parameters() {
            p.move_to_device(&dev).unwrap();
        }
        // Output, gradients (parameters in order, then x) and launches.
        let params: Vec<(String, Tensor)> = layer.named_parameters().into_iter().chain([("input".to_string(), x.clone())]).collect();
        let run = |on: bool| {
            let (y, _, grads, launches) = fusion_step(ord, Fusion::Norm, on, s ^ 7, &params, || forward().map(|y| (y, ())));
            (y.to_f64_vec().unwrap(), grads, launches)
        };
        let (yc, gc, lc) = run(false);
        let (yf, gf, lf) = run(true);
        common::gpu::assert_close(&format!("{what} output"), &yf, &yc, common::gpu::F32, s);
        let rms = |v: &[f64]| (v.iter().map(|x| x * x).sum::<f64>() / v.len().max(1) as f64).sqrt();
        for ((name, a), (_, c)) in gf.iter().zip(&gc) {
            // A bias gradient is a sum over the B·T rows: its rounding is
            // about that of the same layer's weight gradient (unit inputs).
            let floor = match name.strip_suffix(".bias") {
                Some(l) => gc.iter().find(|(n, _)| *n == format!("{l}.weight")).map_or(0.0, |(_, w)| rms(w)),
                None => 0.0,
            };
            common::gpu::assert_close_floor(&format!("{what} gradient of {name}"), a, c, common::gpu::F32, floor, s);
        }
        assert!(lf < lc, "{what}: {lf} launches with the norm fusion vs {lc} without");
        eprintln!("{what}: forward + backward {lc} launches composed, {lf} with the norm fusion");
    }
}

/// A conformer block's convolution module masks its padded frames without a
/// masked_fill launch of its own once the `norm` and `convmodule` fusions
/// are on: its input mask is skipped (the GLU mask makes it redundant), the
/// GLU mask is inside the fused core and its output mask inside the fused
/// residual add (`add_layer_norm_masked`), forward and backward. With
/// `norm` alone, the output mask's two launches go; with neither, the GLU
/// and output masks take a launch each way. Outputs agree (f32).
#[test]
fn a_conformer_blocks_frame_masks_take_no_launch_of_their_own_when_fused() {
    use asrforge::models::config::{ConvNorm, EncoderConfig, EncoderType};
    use asrforge::models::encoder::frame_pad_mask;
    use asrforge::models::encoder_layer::EncoderLayer;
    use asrforge::nn::{AttentionMask, Module};
    use asrforge::ops::{self, fusion, fusion::Fusion};
    let Some(dev) = common::gpu::gpu("a_conformer_blocks_frame_masks_take_no_launch_of_their_own_when_fused") else { return };
    let Device::Cuda(ord) = dev else { return };
    let _s = serial();
    let s = seed();
    let mut rng = Rng::new(s);
    let (b, t, d, dt) = (2, 13, 32, DType::F32);
    let c = EncoderConfig {
        output_size: d,
        attention_heads: 2,
        linear_units: 48,
        cnn_module_kernel: 5,
        cnn_module_norm: ConvNorm::BatchNorm,
        dropout_rate: 0.0,
        attention_dropout_rate: 0.0,
        ..EncoderConfig::defaults(EncoderType::Conformer).unwrap()
    };
    let layer = EncoderLayer::new(&c, true, dt, &mut rng).unwrap();
    // Parameters and batch norm's running statistics (its step count stays).
    for nt in layer.state_dict() {
        if nt.tensor.dtype() == dt {
            nt.tensor.move_to_device(&dev).unwrap();
        }
    }
    let x = Tensor::randn(vec![b, t, d], 0.0, 1.0, dt, &mut rng, &Device::Cpu).unwrap().to_device(&dev).unwrap().requires_grad_();
    let pos = Tensor::randn(vec![1, t, d], 0.0, 1.0, dt, &mut rng, &Device::Cpu).unwrap().to_device(&dev).unwrap();
    let mask = AttentionMask::key_padding(&[t, 8], t).unwrap();
    let pad = frame_pad_mask(&[t, 8], t).unwrap().to_device(&dev).unwrap();
    let w = common::tensor(&rng.normal(b * t * d), &[b, t, d], dt, &dev);
    let mut outs = Vec::new();
    for (families, want) in [(&[][..], 4), (&[Fusion::Norm][..], 2), (&[Fusion::Norm, Fusion::ConvModule][..], 0)] {
        fusion::set_enabled(families);
        cuda::start_profile(ord).unwrap();
        let y = layer.forward(&x, Some(&mask), &pos, Some(&pad)).unwrap();
        asrforge::autograd::backward(&ops::sum_all(&ops::mul(&y, &w).unwrap()).unwrap()).unwrap();
        let p = cuda::stop_profile(ord).unwrap();
        fusion::set_enabled(&[]);
        x.zero_grad();
        layer.zero_grad();
        let fills: u64 = p.rows.iter().filter(|r| r.family.contains("masked_fill")).map(|r| r.launches).sum();
        assert_eq!(fills, want, "fusions {families:?}: masked_fill launches forward + backward\n{}", p.table());
        outs.push(y.to_f64_vec().unwrap());
    }
    for (i, o) in outs.iter().enumerate().skip(1) {
        common::gpu::assert_close(&format!("output with fusion set {i} against none"), o, &outs[0], common::gpu::F32, s);
    }
}

/// The feed-forward block with the `ffn` fusion (its activation and dropout
/// in one launch each way): the same output and gradients bit for bit, two
/// launches fewer forward + backward, for every activation.
#[test]
fn ffn_fusion_runs_the_feed_forward_block_the_same_in_two_launches_fewer() {
    use asrforge::models::config::Activation;
    use asrforge::models::ffn::FeedForward;
    use asrforge::nn::Module;
    use asrforge::ops::fusion::Fusion;
    let Some(dev) = common::gpu::gpu("ffn_fusion_runs_the_feed_forward_block_the_same_in_two_launches_fewer") else { return };
    let Device::Cuda(ord) = dev else { return };
    let _s = serial();
    let s = seed();
    let mut rng = Rng::new(s);
    let (b, t, d) = (2, 13, 16);
    for act in [Activation::Relu, Activation::Swish, Activation::Gelu, Activation::Tanh] {
        let ffn = FeedForward::new(d, 40, 0.2, act, DType::F32, &mut rng).unwrap();
        for (_, p) in ffn.named_parameters() {
            p.move_to_device(&dev).unwrap();
        }
        let x = Tensor::randn(vec![b, t, d], 0.0, 1.0, DType::F32, &mut rng, &Device::Cpu).unwrap().to_device(&dev).unwrap().requires_grad_();
        let params: Vec<(String, Tensor)> = ffn.named_parameters().into_iter().chain([("input".to_string(), x.clone())]).collect();
        let run = |on: bool| {
            let (y, _, grads, launches) = fusion_step(ord, Fusion::Ffn, on, s ^ 3, &params, || ffn.forward(&x).map(|y| (y, ())));
            (std::iter::once(y.to_f64_vec().unwrap()).chain(grads.into_iter().map(|g| g.1)).collect::<Vec<_>>(), launches)
        };
        let (composed, lc) = run(false);
        let (fused, lf) = run(true);
        let bits = |v: &[Vec<f64>]| v.iter().map(|t| t.iter().map(|x| x.to_bits()).collect::<Vec<_>>()).collect::<Vec<_>>();
        assert_eq!(bits(&fused), bits(&composed), "{act:?}: output and gradients (seed {s})");
        assert_eq!(lf + 2, lc, "{act:?}: {lf} launches fused vs {lc} composed");
        eprintln!("feed-forward {act:?}: forward + backward {lc} launches composed, {lf} with the ffn fusion");
    }
}

/// The positional encoding with the `posenc` fusion (its scale, table rows,
/// cast and dropout in one launch each way; the relative rows' narrow,
/// dropout and cast in one): the same output, rows and input gradient bit
/// for bit, and the launches the composition's narrow, affine, add, cast
/// and dropout took, fewer: the encoder's `forward_at` (absolute and
/// relative, with and without autocast to bf16) and the decoder's
/// `encode_at` (no rows returned, so no narrow either).
#[test]
fn posenc_fusion_encodes_the_same_in_fewer_launches() {
    use asrforge::models::config::PosEncType;
    use asrforge::models::pos_enc::PositionalEncoding;
    use asrforge::ops;
    use asrforge::ops::fusion::Fusion;
    let Some(dev) = common::gpu::gpu("posenc_fusion_encodes_the_same_in_fewer_launches") else { return };
    let Device::Cuda(ord) = dev else { return };
    let _s = serial();
    let s = seed();
    let mut rng = Rng::new(s);
    let (b, t, d, off) = (2, 9, 8, 3);
    // (kind, autocast, rows returned, launches saved: forward + backward).
    let cases = [
        (PosEncType::Abs, None, true, 2 + 1),
        (PosEncType::Abs, Some(DType::BF16), true, 3 + 2),
        (PosEncType::Rel, None, true, 2 + 1),
        (PosEncType::Rel, Some(DType::BF16), true, 2 + 1),
        (PosEncType::Abs, None, false, 3 + 1),
        (PosEncType::Abs, Some(DType::BF16), false, 4 + 2),
    ];
    for (kind, half, with_rows, saved) in cases {
        let what = format!("{kind:?} autocast {half:?} rows {with_rows}");
        let pe = PositionalEncoding::new(kind, d, 0.25, DType::F32).unwrap();
        if let Some(tab) = &pe.pe {
            tab.move_to_device(&dev).unwrap();
        }
        let x = Tensor::randn(vec![b, t, d], 0.0, 1.0, DType::F32, &mut rng, &Device::Cpu).unwrap().to_device(&dev).unwrap().requires_grad_();
        let params = [("input".to_string(), x.clone())];
        let run = |on: bool| {
            let (y, rows, grads, launches) = fusion_step(ord, Fusion::PosEnc, on, s ^ 5, &params, || {
                ops::autocast(half, || if with_rows { pe.forward_at(&x, off).map(|(y, p)| (y, Some(p))) } else { pe.encode_at(&x, off).map(|y| (y, None)) })
            });
            let mut v = vec![y.to_f64_vec().unwrap(), grads[0].1.clone()];
            // Relative rows come in the autocast type with the fusion on; the
            // composition's are cast to it where the attention would.
            let row_dtype = if kind == PosEncType::Rel { half.unwrap_or(DType::F32) } else { DType::F32 };
            v.extend(rows.map(|r| ops::to_dtype(&r, row_dtype).unwrap().to_f64_vec().unwrap()));
            (v, launches, y.dtype())
        };
        let (composed, lc, dc) = run(false);
        let (fused, lf, df) = run(true);
        // Autocast casts the absolute encoding's f32 sum (the decoder's embedding); a relative one keeps x's type.
        let want = if kind == PosEncType::Abs { half.unwrap_or(DType::F32) } else { DType::F32 };
        assert_eq!((df, dc), (want, want), "{what}: the output dtype");
        let bits = |v: &[Vec<f64>]| v.iter().map(|t| t.iter().map(|x| x.to_bits()).collect::<Vec<_>>()).collect::<Vec<_>>();
        assert_eq!(bits(&fused), bits(&composed), "{what}: output, input gradient and rows (seed {s})");
        assert!(fused[0].iter().any(|v| *v == 0.0) && fused[0].iter().any(|v| *v != 0.0), "{what}: the dropout dropped some (seed {s})");
        assert_eq!(lf + saved, lc, "{what}: {lf} launches fused vs {lc} composed");
        eprintln!("positional encoding {what}: forward + backward {lc} launches composed, {lf} with the posenc fusion");
    }
}

/// The conv2d subsampling with the `subsampling` fusion (each conv's bias
/// and ReLU in one launch each way, the bias's gradient summed in the
/// backward's launch): the same output and input and weight gradients bit
/// for bit, the biases' gradients within f32 rounding of the composition's
/// (another summation order), three launches fewer per conv in f32 and four
/// under autocast to bf16 (where the composition also casts the bias's
/// summed gradient to the half copy's type).
#[test]
fn subsampling_fusion_runs_the_convolutions_the_same_in_fewer_launches() {
    use asrforge::models::config::{InputLayer, PosEncType};
    use asrforge::models::subsampling::Subsampling;
    use asrforge::nn::Module;
    use asrforge::ops;
    use asrforge::ops::fusion::Fusion;
    let Some(dev) = common::gpu::gpu("subsampling_fusion_runs_the_convolutions_the_same_in_fewer_launches") else { return };
    let Device::Cuda(ord) = dev else { return };
    let _s = serial();
    let s = seed();
    let mut rng = Rng::new(s);
    let sub = Subsampling::new(InputLayer::Conv2d, 20, 8, 0.1, (PosEncType::Rel, 0.1), DType::F32, &mut rng).unwrap();
    for (_, p) in sub.named_parameters() {
        p.move_to_device(&dev).unwrap();
    }
    if let Some(t) = &sub.pos_enc.pe {
        t.move_to_device(&dev).unwrap();
    }
    let x = Tensor::randn(vec![2, 31, 20], 0.0, 1.0, DType::F32, &mut rng, &Device::Cpu).unwrap().to_device(&dev).unwrap().requires_grad_();
    for (half, saved) in [(None, 2 * 3), (Some(DType::BF16), 2 * 4)] {
        let params: Vec<(String, Tensor)> = sub.named_parameters().into_iter().chain([("input".to_string(), x.clone())]).collect();
        let run = |on: bool| {
            let (y, _, grads, launches) =
                fusion_step(ord, Fusion::Subsampling, on, s ^ 9, &params, || ops::autocast(half, || sub.forward(&x, &[31, 24]).map(|r| (r.0, ()))));
            (std::iter::once(("output".to_string(), y.to_f64_vec().unwrap())).chain(grads).collect::<Vec<_>>(), launches)
        };
        let (composed, lc) = run(false);
        let (fused, lf) = run(true);
        for ((name, f), (_, c)) in fused.iter().zip(&composed) {
            if name.starts_with("conv.") && name.ends_with(".bias") {
                common::gpu::assert_close(&format!("{half:?} gradient of {name}"), f, c, common::gpu::F32, s);
            } else {
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(f), bits(c), "{half:?}: {name} (seed {s})");
            }
        }
        assert_eq!(lf + saved, lc, "{half:?}: {lf} launches fused vs {lc} composed");
        eprintln!("conv2d subsampling, autocast {half:?}: forward + backward {lc} launches composed, {lf} with the subsampling fusion");
    }
}

/// Layer norm's backward, plain and with the residual add (and its
/// dropout), by warp rows and by block rows, is one launch and asks for no
/// memset: the last block folds the weight and bias gradients on the
/// device's kept arrival counters (tests/cuda_ops_nn.rs checks the values
/// and that the counters are left at 0).
#[test]
fn layer_norm_backward_is_one_launch_and_no_memset() {
    use asrforge::backend::cuda::dropout::DropoutDraw;
    let Some(dev) = common::gpu::gpu("layer_norm_backward_is_one_launch_and_no_memset") else { return };
    let _s = serial();
    let Device::Cuda(ord) = dev else { unreachable!("gpu() gives a CUDA device") };
    let cdev = cuda::device(ord).unwrap();
    let mut rng = Rng::new(seed());
    let up = |v: Vec<f64>| CudaStorage::from_cpu(&cdev, &CpuStorage::F32(v.into_iter().map(|x| x as f32).collect())).unwrap();
    // The harness poisons every new buffer (a memset each); nothing else may memset.
    let poison = std::env::var("ASRFORGE_CUDA_POISON").is_ok_and(|v| v == "1");
    let fills = |c: &cuda::Counters| if poison { c.driver_allocs + c.pool_reuses } else { 0 };
    for (rows, n) in [(300usize, 7usize), (67, 1025), (2400, 5)] {
        let (x, y, w, g) = (up(rng.normal(rows * n)), up(rng.normal(rows * n)), up(rng.normal(n)), up(rng.normal(rows * n)));
        let (_, mean, rstd) = cuda::norm::layer_norm(&x, Some(&w), None, n, 1e-5).unwrap();
        // Twice: the first call may make the kept counters (one memset per device).
        for _ in 0..2 {
            let before = cuda::counters(ord).unwrap();
            cuda::norm::layer_norm_backward(&x, Some(&w), &mean, &rstd, &g, n).unwrap();
            let c = cuda::counters(ord).unwrap().since(&before);
            assert_eq!((c.launches, c.memsets), (1, fills(&c)), "layer_norm_backward ({rows}, {n}): {c:?}");
        }
        let drop = Some(DropoutDraw { seed: 5, offset: 0, p: 0.1 });
        let (s, _, mean, rstd) = cuda::norm::add_layer_norm(&x, &y, 0.5, drop, None, Some(&w), None, n, 1e-5).unwrap();
        let before = cuda::counters(ord).unwrap();
        cuda::norm::add_layer_norm_backward(&s, Some(&w), &mean, &rstd, &g, Some(&g), 0.5, drop, None, n).unwrap();
        let c = cuda::counters(ord).unwrap().since(&before);
        assert_eq!((c.launches, c.memsets), (1, fills(&c)), "add_layer_norm_backward ({rows}, {n}): {c:?}");
    }
}

/// A step's loss values (here four, of two dtypes) come back in one launch
/// per dtype and one copy to the host (`Tensor::scalars_to_host`), with one
/// host wait for that copy (on the emulator the compute stream is held, so
/// the copy is still running as far as the host can tell, as on a GPU).
#[test]
fn loss_values_come_back_in_a_launch_per_dtype_and_one_copy() {
    let Some(dev) = common::gpu::gpu("loss_values_come_back_in_a_launch_per_dtype_and_one_copy") else { return };
    let _s = serial();
    let Device::Cuda(ord) = dev else { unreachable!("gpu() gives a CUDA device") };
    let v = |x: f64, dt: DType| asrforge::ops::to_dtype(&Tensor::from_vec(vec![x], [1], &Device::Cpu).unwrap(), dt).unwrap().to_device(&dev).unwrap();
    let xs = [v(1.25, DType::F32), v(-2.5, DType::F32), v(0.75, DType::F64), v(4.0, DType::F32)];
    let held = cuda::device(ord).unwrap().emu_hold_stream(0, true).is_ok();
    let before = cuda::counters(ord).unwrap();
    let got = Tensor::scalars_to_host(&xs.iter().collect::<Vec<_>>()).unwrap();
    let c = cuda::counters(ord).unwrap().since(&before);
    assert_eq!(got, vec![1.25, -2.5, 0.75, 4.0]);
    assert_eq!((c.launches, c.dtoh_copies), (2, 1), "{c:?}");
    // A GPU may have finished the copy before the host asks: then no wait.
    assert!(if held { c.host_syncs == 1 } else { c.host_syncs <= 1 }, "one wait at most (held: {held}): {c:?}");
}

/// The fused conformer convolution module (`ASRFORGE_FUSION=convmodule`)
/// launches fewer kernels than its composition, forward and backward, with
/// batch norm (training) and layer norm: forward it is the GLU + depthwise
/// conv, batch norm's statistics and the norm + swish (three launches; two
/// with layer norm), with no host synchronisation.
#[test]
fn the_fused_convolution_module_launches_fewer_kernels_than_its_composition() {
    use asrforge::ops::fusion::{set_enabled, Fusion};
    use asrforge::ops::{BatchNormState, ConvCoreNorm};
    let Some(dev) = common::gpu::gpu("the_fused_convolution_module_launches_fewer_kernels_than_its_composition") else { return };
    let _s = serial();
    let Device::Cuda(ord) = dev else { unreachable!("gpu() gives a CUDA device") };
    let mut rng = Rng::new(seed());
    let (b, t, c, k) = (3, 20, 40, 7);
    let leaf = |shape: &[usize], rng: &mut Rng| Tensor::randn(shape.to_vec(), 0.0, 1.0, DType::F32, rng, &dev).unwrap().requires_grad_();
    let mask = Tensor::from_vec((0..b * t).map(|i| u8::from(i % t >= t - 4 * (i / t))).collect::<Vec<u8>>(), [b, t, 1], &Device::Cpu)
        .unwrap()
        .to_device(&dev)
        .unwrap();
    for batch in [true, false] {
        let mut counts = Vec::new();
        for fused in [true, false] {
            let (a, w, wb, nw, nb) =
                (leaf(&[b, t, 2 * c], &mut rng), leaf(&[c, 1, k], &mut rng), leaf(&[c], &mut rng), leaf(&[c], &mut rng), leaf(&[c], &mut rng));
            let (rm, rv) = (Tensor::zeros([c], DType::F32, &dev).unwrap(), Tensor::ones([c], DType::F32, &dev).unwrap());
            let norm = if batch {
                ConvCoreNorm::Batch {
                    weight: &nw,
                    bias: &nb,
                    state: BatchNormState { running_mean: &rm, running_var: &rv, momentum: 0.1, eps: 1e-5, training: true },
                }
            } else {
                ConvCoreNorm::Layer { weight: &nw, bias: &nb, eps: 1e-5 }
            };
            set_enabled(if fused { &[Fusion::ConvModule] } else { &[] });
            let before = cuda::counters(ord).unwrap();
            let y = asrforge::ops::conv_module_core(&a, Some(&mask), &w, Some(&wb), (k - 1) / 2, &norm);
            let fwd = cuda::counters(ord).unwrap().since(&before);
            set_enabled(&[]);
            let loss = asrforge::ops::sum_all(&y.unwrap()).unwrap();
            let before = cuda::counters(ord).unwrap();
            asrforge::autograd::backward(&loss).unwrap();
            let bwd = cuda::counters(ord).unwrap().since(&before);
            assert!(nw.grad().is_some() && a.grad().is_some());
            counts.push((fwd.launches, bwd.launches, fwd.host_syncs));
        }
        let ((ff, fb, fs), (cf, cb, _)) = (counts[0], counts[1]);
        eprintln!("convolution module, batch norm {batch}: fused {ff} + {fb} launches, composition {cf} + {cb}");
        assert_eq!((ff, fs), (if batch { 3 } else { 2 }, 0), "batch norm {batch}: the fused forward's launches and host syncs");
        assert!(ff < cf && fb < cb, "batch norm {batch}: fused {ff} + {fb} launches vs composition {cf} + {cb}");
    }
}

/// Products reading one activation add their gradients for it inside their
/// GEMMs (autograd offers what the activation has gathered; beta 1): after
/// the first, each of q, k, v (linear), a plain and a scaled product of
/// `h = tanh(x)` launches no add, in f32 and bf16. When `h`'s gradient
/// is shared (`s = h + z` hands both one buffer) the next product adds
/// once, as before, and z's gradient is left whole. Gradients equal the CPU's.
#[test]
fn products_reading_one_activation_add_its_gradient_in_their_gemms() {
    use asrforge::{autograd, ops};
    let Some(dev) = common::gpu::gpu("products_reading_one_activation_add_its_gradient_in_their_gemms") else { return };
    let _s = serial();
    let Device::Cuda(ord) = dev else { unreachable!("gpu() gives a CUDA device") };
    let s = seed();
    let mut rng = Rng::new(s);
    let (b, t, d) = (2, 7, 16);
    let draw = |shape: &[usize], sd: f64, rng: &mut Rng| (rng.normal(shape.iter().product()).into_iter().map(|v| sd * v).collect(), shape.to_vec());
    // x and z at half scale: tanh's backward in bf16 (1 − y²) loses its
    // digits where y is near ±1.
    let vals = [
        draw(&[b, t, d], 0.5, &mut rng),
        draw(&[b, t, d], 0.5, &mut rng),
        draw(&[d, d], 1.0, &mut rng),
        draw(&[d], 1.0, &mut rng),
        draw(&[8, d], 1.0, &mut rng),
    ];
    let r = rng.normal(6 * b * t * d);
    for dt in [DType::F32, DType::BF16] {
        for shared in [false, true] {
            // (x grad, z grad, GEMM launches, add launches in the backward)
            let run = |dev: &Device| {
                let t_of = |(v, sh): &(Vec<f64>, Vec<usize>)| common::tensor(v, sh, if *dev == Device::Cpu { DType::F64 } else { dt }, dev);
                let (x, z) = (t_of(&vals[0]).requires_grad_(), t_of(&vals[1]).requires_grad_());
                let (w, bias, w8) = (t_of(&vals[2]), t_of(&vals[3]), t_of(&vals[4]));
                // tz is recorded before the products, so its backward runs
                // after theirs: until then it holds the gradient it shares with h.
                let (h, tz) = (ops::tanh(&x).unwrap(), ops::tanh(&z).unwrap());
                let mut ys = vec![
                    ops::linear(&h, &w, Some(&bias)).unwrap(),
                    ops::linear(&h, &w, Some(&bias)).unwrap(),
                    ops::linear(&h, &w, Some(&bias)).unwrap(),
                    ops::matmul_t(&h, &w, false, true).unwrap(),
                    ops::matmul_scaled(&h, &w8, false, true, 0.5).unwrap(),
                ];
                if shared {
                    // Recorded last, so its backward runs first.
                    ys.push(ops::add(&h, &tz).unwrap());
                }
                let y = ops::cat(&ys.iter().collect::<Vec<_>>(), -1).unwrap();
                let rt = common::tensor(&r[..y.elem_count()], y.dims(), y.dtype(), dev);
                let loss = ops::sum_all(&ops::mul(&ops::to_dtype(&y, DType::F32).unwrap(), &ops::to_dtype(&rt, DType::F32).unwrap()).unwrap()).unwrap();
                let (mut gemms, mut adds, mut table) = (0, 0, String::new());
                if let Device::Cuda(_) = dev {
                    cuda::start_profile(ord).unwrap();
                    autograd::backward(&loss).unwrap();
                    let p = cuda::stop_profile(ord).unwrap();
                    // cuBLAS's and cuBLASLt's products.
                    gemms = p.rows.iter().filter(|r| r.family.starts_with("cublas")).map(|r| r.launches).sum();
                    adds = p.row("elementwise/add").map_or(0, |r| r.launches);
                    table = p.table();
                } else {
                    autograd::backward(&loss).unwrap();
                }
                let zg = if shared { z.grad().unwrap().to_f64_vec().unwrap() } else { Vec::new() };
                (x.grad().unwrap().to_f64_vec().unwrap(), zg, gemms, adds, table)
            };
            let (xc, zc, ..) = run(&Device::Cpu);
            let (xg, zg, gemms, adds, table) = run(&dev);
            // bf16 rounds x's gradient six times, not once: the gathered
            // sum after each of five products (in either way of adding) and
            // tanh's backward; random rounding errors grow as √6 ≈ 2.5.
            let tol = if dt == DType::BF16 { 3.0 * common::gpu::BF16 } else { common::gpu::tol(dt) };
            common::gpu::assert_close(&format!("{dt:?} shared {shared}: gradient of x"), &xg, &xc, tol, s);
            common::gpu::assert_close(&format!("{dt:?} shared {shared}: gradient of z"), &zg, &zc, tol, s);
            // The weights take no gradient here: each product's dx GEMM.
            assert_eq!(gemms, 5, "{dt:?} shared {shared}: the backward's GEMMs\n{table}");
            assert_eq!(adds, u64::from(shared), "{dt:?} shared {shared}: adds of x's gathered gradients\n{table}");
        }
    }
}

/// A pre-norm residual `h + linear(layer_norm(h))`: the gradient h gathered
/// through the skip is added in the norm's backward launch (add_layer_norm's
/// backward with it as the sum's direct gradient), so the backward launches
/// no add, in f32 and bf16; the gradients of x, w and b equal the CPU's.
#[test]
fn layer_norm_backward_adds_the_skip_gradient_in_its_launch() {
    use asrforge::{autograd, ops};
    let Some(dev) = common::gpu::gpu("layer_norm_backward_adds_the_skip_gradient_in_its_launch") else { return };
    let _s = serial();
    let Device::Cuda(ord) = dev else { unreachable!("gpu() gives a CUDA device") };
    let s = seed();
    let mut rng = Rng::new(s);
    let (rows, n) = (45, 24);
    // The norm's weight about 1, as trained norms' are: its backward scales
    // the bf16-rounded gradient it is handed by w/σ, and a weight drawn
    // N(0, 1) (the product of two normals, heavy-tailed) made that rounding
    // alone 2.5 % of the gradient's RMS at one element in a hundred runs.
    let wv: Vec<f64> = rng.normal(n).into_iter().map(|v| 1.0 + 0.2 * v).collect();
    let (xv, bv, lv, r) = (rng.normal(rows * n), rng.normal(n), rng.normal(n * n), rng.normal(rows * n));
    for dt in [DType::F32, DType::BF16] {
        // (gradients of x, w, b; add launches, layer-norm backward launches)
        let run = |dev: &Device| {
            let (xt, pt) = if *dev == Device::Cpu { (DType::F64, DType::F64) } else { (dt, DType::F32) };
            let x = common::tensor(&xv, &[rows, n], xt, dev).requires_grad_();
            let (w, b) = (common::tensor(&wv, &[n], pt, dev).requires_grad_(), common::tensor(&bv, &[n], pt, dev).requires_grad_());
            let lw = common::tensor(&lv, &[n, n], xt, dev);
            // h = x/2, not tanh(x): tanh's backward (1 − h²) near |h| = 1
            // magnifies bf16's rounding of h twentyfold (x = 1.84: 5 % of
            // the gradient), which would test tanh, not the norm's skip.
            let h = ops::mul_scalar(&x, 0.5).unwrap();
            let y = ops::add(&h, &ops::linear(&ops::layer_norm(&h, Some(&w), Some(&b), 1e-5).unwrap(), &lw, None).unwrap()).unwrap();
            let rt = common::tensor(&r, &[rows, n], DType::F32, dev);
            let loss = ops::sum_all(&ops::mul(&ops::to_dtype(&y, DType::F32).unwrap(), &rt).unwrap()).unwrap();
            let (mut adds, mut norms, mut table) = (0, 0, String::new());
            if let Device::Cuda(_) = dev {
                cuda::start_profile(ord).unwrap();
                autograd::backward(&loss).unwrap();
                let p = cuda::stop_profile(ord).unwrap();
                adds = p.row("elementwise/add").map_or(0, |r| r.launches);
                norms = p.rows.iter().filter(|r| r.family.contains("layer_norm_bwd")).map(|r| r.launches).sum();
                table = p.table();
            } else {
                autograd::backward(&loss).unwrap();
            }
            let g = |t: &Tensor| t.grad().unwrap().to_f64_vec().unwrap();
            ([g(&x), g(&w), g(&b)], adds, norms, table)
        };
        let (want, ..) = run(&Device::Cpu);
        let (got, adds, norms, table) = run(&dev);
        // bf16: x's gradient is rounded after the product, after the norm's
        // backward with the skip added, and after the scaling.
        let tol = if dt == DType::BF16 { 2.0 * common::gpu::BF16 } else { common::gpu::tol(dt) };
        for (what, (a, b)) in ["x", "w", "b"].iter().zip(got.iter().zip(&want)) {
            common::gpu::assert_close(&format!("{dt:?}: gradient of {what}"), a, b, tol, s);
        }
        assert_eq!((adds, norms), (0, 1), "{dt:?}: add launches and layer-norm backward launches\n{table}");
    }
}

/// `ops::cat_cast_many` (the packed projection weights): one `cast_many`
/// launch forward for every output however many parts, and one backward
/// for every part's gradient, f32 to bf16 and f32 to f32 (a copy).
#[test]
fn cat_cast_many_launches_once_each_way() {
    use asrforge::ops;
    let Some(dev) = common::gpu::gpu("cat_cast_many_launches_once_each_way") else { return };
    let Device::Cuda(ord) = dev else { return };
    let _s = serial();
    let mut rng = Rng::new(seed());
    for to in [DType::BF16, DType::F32] {
        let mut t =
            |shape: &[usize]| Tensor::randn(shape.to_vec(), 0.0, 1.0, DType::F32, &mut rng, &Device::Cpu).unwrap().to_device(&dev).unwrap().requires_grad_();
        let parts = vec![vec![t(&[300, 64]), t(&[3, 64]), t(&[64, 64])], vec![t(&[300]), t(&[3]), t(&[64])], vec![t(&[5, 7])]];
        let before = cuda::counters(ord).unwrap();
        let ys = ops::cat_cast_many(&parts, to).unwrap();
        assert_eq!(cuda::counters(ord).unwrap().since(&before).launches, 1, "{to:?}: one launch forward");
        let seeds: Vec<(Tensor, Tensor)> = ys.iter().map(|y| (y.clone(), ops::to_dtype(&y.detach(), to).unwrap())).collect();
        let before = cuda::counters(ord).unwrap();
        asrforge::autograd::backward_with(&seeds).unwrap();
        assert_eq!(cuda::counters(ord).unwrap().since(&before).launches, 1, "{to:?}: one launch backward");
        for (i, p) in parts.iter().flatten().enumerate() {
            assert_eq!(
                p.grad().expect("every part has a gradient").to_f64_vec().unwrap(),
                ops::to_dtype(&ops::to_dtype(p, to).unwrap(), DType::F32).unwrap().to_f64_vec().unwrap(),
                "{to:?} part {i}"
            );
        }
    }
}

/// Conversions of many tensors are one launch however many: within one
/// by-value table (64 tensors, 256 chunks) with no copy up, beyond it one
/// launch from a table in device memory and one copy up (a model's weights
/// under autocast: 615 tensors, 46 M elements at the AISHELL conformer's
/// size, took a launch per 64 tensors or 4 Mi elements before); the values
/// equal one cast per tensor.
#[test]
fn many_tensor_conversions_are_one_launch_with_either_table() {
    let Some(dev) = common::gpu::gpu("many_tensor_conversions_are_one_launch_with_either_table") else { return };
    let Device::Cuda(ord) = dev else { return };
    let _s = serial();
    let mut rng = Rng::new(seed());
    // (tensors, elements each, copies up): one by-value table; more than
    // 64 tensors; more than 256 chunks of 2^14.
    for (n, len, copies) in [(40usize, 1000usize, 0u64), (130, 300, 1), (3, 1_500_000, 1)] {
        let xs: Vec<Tensor> =
            (0..n).map(|i| Tensor::randn(vec![len + i], 0.0, 1.0, DType::F32, &mut rng, &Device::Cpu).unwrap().to_device(&dev).unwrap()).collect();
        let guards: Vec<_> = xs.iter().map(|t| t.storage()).collect();
        let stores: Vec<&CudaStorage> = guards
            .iter()
            .map(|g| match &**g {
                asrforge::backend::Storage::Cuda(c) => c,
                _ => panic!("a device tensor"),
            })
            .collect();
        let before = cuda::counters(ord).unwrap();
        let ys = cuda::cast::to_dtype_many(&stores, DType::BF16).unwrap();
        let cost = cuda::counters(ord).unwrap().since(&before);
        assert_eq!((cost.launches, cost.htod_copies, cost.host_syncs), (1, copies, 0), "{n} tensors of {len}: {cost:?}");
        for (i, (y, x)) in ys.iter().zip(&stores).enumerate() {
            assert_eq!(y.to_cpu().unwrap(), cuda::cast::to_dtype(x, DType::BF16).unwrap().to_cpu().unwrap(), "{n} tensors: tensor {i}");
        }
    }
}

/// The `qkv` fusion (with `attention`): self-attention (plain and rel-pos)
/// projects q, k, v in one GEMM and cross-attention k, v in one, read in
/// place by the fused kernel. In f32 the packed weights and biases cost one
/// `cat_cast_many` launch each way: 4 launches fewer per self-attention
/// (forward 3 products → 1 + the pack; backward 6 → 2 + the split) and 1
/// per cross-attention. Under autocast with the packs declared the layer's
/// one weight cast makes them: 6 and 3 fewer. Outputs and gradients within
/// the dtype's tolerance of the attention fusion alone. An input read by n
/// projections is the one result the packing computes differently: apart,
/// its gradient takes n products each rounded to the dtype (each GEMM adds
/// into the gradient and rounds); packed, one product over the n·d
/// concatenated columns rounded once. n + 1 independent roundings separate
/// the two sides, so that gradient's tolerance is √(n + 1) of one rounding's
/// (with one reader nothing changes: √1).
#[test]
fn qkv_fusion_projects_attention_inputs_in_one_gemm_with_fewer_launches() {
    use asrforge::nn::{AttentionMask, Module, MultiHeadedAttention, RelPositionMultiHeadedAttention};
    use asrforge::ops::{self, fusion, fusion::Fusion};
    let Some(dev) = common::gpu::gpu("qkv_fusion_projects_attention_inputs_in_one_gemm_with_fewer_launches") else { return };
    let Device::Cuda(ord) = dev else { return };
    let _s = serial();
    let s = seed();
    let mut rng = Rng::new(s);
    let (b, t, ts, d, h) = (2, 21, 13, 64, 4);
    let plain = MultiHeadedAttention::new(h, d, 0.1, DType::F32, &mut rng).unwrap();
    let rel = RelPositionMultiHeadedAttention::new(h, d, 0.1, DType::F32, &mut rng).unwrap();
    for (_, p) in plain.named_parameters().into_iter().chain(rel.named_parameters()) {
        p.move_to_device(&dev).unwrap();
    }
    let input = |shape: &[usize], rng: &mut Rng| {
        Tensor::randn(shape.to_vec(), 0.0, 1.0, DType::F32, rng, &Device::Cpu).unwrap().to_device(&dev).unwrap().requires_grad_()
    };
    let (x, mem, pos) = (input(&[b, t, d], &mut rng), input(&[b, ts, d], &mut rng), input(&[1, t, d], &mut rng));
    let causal = AttentionMask::causal_padding(&[t, 9], t).unwrap();
    let pad = AttentionMask::key_padding(&[ts, 4], ts).unwrap();
    let rel_pad = AttentionMask::key_padding(&[t, 12], t).unwrap();
    type Run<'a> = Box<dyn Fn() -> asrforge::Result<Tensor> + 'a>;
    type Packs<'a> = Box<dyn Fn() -> Vec<Vec<Tensor>> + 'a>;
    // The layers' inputs as in a model: outputs of an op (their gradients
    // gathered by the tape, not accumulated into leaves launch by launch).
    let inner = |t: &Tensor| ops::mul_scalar(t, 1.0);
    // (what, layer, the packs it declares, inputs and how many projections
    // read each, run, launches saved in f32, under bf16)
    let cases: Vec<(&str, &dyn Module, Packs, Vec<(Tensor, usize)>, Run, u64, u64)> = vec![
        (
            "self-attention",
            &plain,
            Box::new(|| plain.packs(true)),
            vec![(x.clone(), 3)],
            Box::new(|| {
                let h = inner(&x)?;
                plain.forward(&h, &h, &h, Some(&causal))
            }),
            4,
            6,
        ),
        (
            "cross-attention",
            &plain,
            Box::new(|| plain.packs(false)),
            vec![(x.clone(), 1), (mem.clone(), 2)],
            Box::new(|| {
                let (h, m) = (inner(&x)?, inner(&mem)?);
                plain.forward(&h, &m, &m, Some(&pad))
            }),
            1,
            3,
        ),
        (
            "rel-pos self-attention",
            &rel,
            Box::new(|| rel.base.packs(true)),
            vec![(x.clone(), 3), (pos.clone(), 1)],
            Box::new(|| {
                let h = inner(&x)?;
                rel.forward(&h, &h, &h, Some(&rel_pad), &pos)
            }),
            4,
            6,
        ),
    ];
    for (what, layer, packs, inputs, run, saved_f32, saved_half) in &cases {
        for half in [None, Some(DType::BF16)] {
            // Every tensor whose gradient is compared, with its number of roundings.
            let params: Vec<(String, Tensor, usize)> = layer
                .named_parameters()
                .into_iter()
                .map(|(name, p)| (name, p, 1))
                .chain(inputs.iter().enumerate().map(|(i, (t, readers))| (format!("input {i}"), t.clone(), readers + 1)))
                .collect();
            let group = vec![layer.parameters()];
            let step = |on: &[Fusion]| {
                fusion::set_enabled(on);
                // The packs the layer declares with these families on (none without qkv).
                let packs = packs();
                asrforge::tensor::rng::manual_seed(s ^ 3);
                let before = cuda::counters(ord).unwrap();
                let y = ops::autocast_params_packed(half, &group, &packs, run).unwrap();
                fusion::set_enabled(&[]);
                let w = Tensor::randn(y.dims().to_vec(), 0.0, 1.0, DType::F32, &mut Rng::new(s ^ 5), &Device::Cpu).unwrap();
                let w = ops::to_dtype(&w, y.dtype()).unwrap().to_device(&dev).unwrap();
                asrforge::autograd::backward(&ops::sum_all(&ops::mul(&y, &w).unwrap()).unwrap()).unwrap();
                let launches = cuda::counters(ord).unwrap().since(&before).launches;
                let mut out = vec![("output".to_string(), 1, y.to_f64_vec().unwrap())];
                for (name, p, roundings) in &params {
                    out.push((name.clone(), *roundings, p.grad().unwrap_or_else(|| panic!("{name} has no gradient")).to_f64_vec().unwrap()));
                    p.zero_grad();
                }
                (out, launches)
            };
            let (apart, la) = step(&[Fusion::Attention]);
            let (packed, lp) = step(&[Fusion::Attention, Fusion::Qkv]);
            let tol = half.map_or(common::gpu::F32, common::gpu::tol);
            for ((name, roundings, p), (_, _, a)) in packed.iter().zip(&apart) {
                common::gpu::assert_close(&format!("{what} {half:?}: {name}"), p, a, tol * (*roundings as f64).sqrt(), s);
            }
            let saved = if half.is_some() { *saved_half } else { *saved_f32 };
            assert_eq!(lp + saved, la, "{what} {half:?}: {lp} launches with qkv vs {la} without");
            eprintln!("{what}, autocast {half:?}: forward + backward {la} launches with the attention fusion, {lp} with qkv too");
        }
    }
}

/// Autocast converts every group's weights in one launch at the first use
/// and records each group's tape node where the group is first used: a
/// stack of three linear layers (a group each) launches one `cast_many`
/// forward (and the input's cast and the three products), each layer's
/// gradients are final (the leaf hook) as soon as that layer's backward is
/// done, the last layer first, and they equal a run whose weights are
/// converted one group at a time (`ops::to_dtype_many` per layer, by hand).
#[test]
fn autocast_converts_every_layer_in_one_launch_and_keeps_gradients_final_per_layer() {
    use asrforge::nn::{Linear, Module};
    use asrforge::ops;
    let Some(dev) = common::gpu::gpu("autocast_converts_every_layer_in_one_launch_and_keeps_gradients_final_per_layer") else { return };
    let Device::Cuda(ord) = dev else { return };
    let _s = serial();
    let s = seed();
    let mut rng = Rng::new(s);
    let layers: Vec<Linear> = (0..3).map(|_| Linear::new(24, 24, true, DType::F32, &mut rng).unwrap()).collect();
    for l in &layers {
        for (_, p) in l.named_parameters() {
            p.move_to_device(&dev).unwrap();
        }
    }
    let x = Tensor::randn(vec![5, 24], 0.0, 1.0, DType::F32, &mut rng, &Device::Cpu).unwrap().to_device(&dev).unwrap();
    let groups: Vec<Vec<Tensor>> = layers.iter().map(|l| l.parameters()).collect();
    let half = Some(DType::BF16);
    // The region: one launch for every group.
    let before = cuda::counters(ord).unwrap();
    let y = ops::autocast_params(half, &groups, || layers.iter().try_fold(x.clone(), |h, l| l.forward(&h))).unwrap();
    assert_eq!(cuda::counters(ord).unwrap().since(&before).launches, 1 + 1 + 3, "one weight conversion, the input's cast, three products");
    assert_eq!(asrforge::autograd::tape_ops().iter().filter(|&&n| n == "cat_cast_many").count(), 3, "a node per group: {:?}", asrforge::autograd::tape_ops());
    let loss = ops::sum_all(&ops::to_dtype(&y, DType::F32).unwrap()).unwrap();
    let ids: Vec<Vec<_>> = groups.iter().map(|g| g.iter().map(|t| t.id()).collect()).collect();
    // (group, launches of the backward so far) as each parameter's gradient becomes final.
    let mut order = Vec::new();
    let start = cuda::counters(ord).unwrap();
    asrforge::autograd::backward_with_hooks(&loss, &mut |t: &Tensor| {
        if let Some(g) = ids.iter().position(|g| g.contains(&t.id())) {
            order.push((g, cuda::counters(ord).unwrap().since(&start).launches));
        }
        Ok(())
    })
    .unwrap();
    let groups_in_order: Vec<usize> = order.iter().map(|o| o.0).collect();
    assert_eq!(groups_in_order, vec![2, 2, 1, 1, 0, 0], "each layer's gradients final after its own backward, the last layer first");
    // Between the last and the first layer's gradients becoming final, the
    // two earlier layers' backward ran (a product each at least, and their
    // conversions): with every node recorded up front only the conversions would.
    assert!(order[4].1 >= order[0].1 + 4, "the layers' products run between their gradients becoming final: {order:?}");
    let got: Vec<Vec<f64>> = groups.iter().flatten().map(|p| p.grad().unwrap().to_f64_vec().unwrap()).collect();
    groups.iter().flatten().for_each(|p| p.zero_grad());
    // The reference: each layer's weights converted by their own node.
    let y = ops::autocast(half, || {
        layers.iter().try_fold(x.clone(), |h, l| {
            let c = ops::to_dtype_many(&l.parameters(), DType::BF16)?;
            ops::linear(&h, &c[0], Some(&c[1]))
        })
    })
    .unwrap();
    asrforge::autograd::backward(&ops::sum_all(&ops::to_dtype(&y, DType::F32).unwrap()).unwrap()).unwrap();
    for (i, (p, g)) in groups.iter().flatten().zip(&got).enumerate() {
        assert_eq!(&p.grad().unwrap().to_f64_vec().unwrap(), g, "parameter {i} (seed {s})");
        p.zero_grad();
    }
}

/// Without autocast a region with packs copies only the packs, every
/// layer's in one launch, and records each layer's node at its first use:
/// three linear layers whose weight and bias are each declared a pack (as
/// the qkv fusion declares its projections) launch one conversion and three
/// products forward, their gradients are final per layer, last layer first,
/// and equal plain f32 linear layers' bit for bit (the copies are exact).
#[test]
fn full_precision_regions_copy_every_layers_packs_in_one_launch() {
    use asrforge::nn::{Linear, Module};
    use asrforge::ops;
    let Some(dev) = common::gpu::gpu("full_precision_regions_copy_every_layers_packs_in_one_launch") else { return };
    let Device::Cuda(ord) = dev else { return };
    let _s = serial();
    let s = seed();
    let mut rng = Rng::new(s);
    let layers: Vec<Linear> = (0..3).map(|_| Linear::new(24, 24, true, DType::F32, &mut rng).unwrap()).collect();
    for (_, p) in layers.iter().flat_map(|l| l.named_parameters()) {
        p.move_to_device(&dev).unwrap();
    }
    let x = Tensor::randn(vec![5, 24], 0.0, 1.0, DType::F32, &mut rng, &Device::Cpu).unwrap().to_device(&dev).unwrap();
    let groups: Vec<Vec<Tensor>> = layers.iter().map(|l| l.parameters()).collect();
    let packs: Vec<Vec<Tensor>> = groups.iter().flat_map(|g| g.iter().map(|t| vec![t.clone()])).collect();
    let before = cuda::counters(ord).unwrap();
    let y = ops::autocast_params_packed(None, &groups, &packs, || {
        layers.iter().try_fold(x.clone(), |h, l| {
            let w = ops::packed_params(&[&l.weight])?.expect("a declared pack on the GPU");
            let b = ops::packed_params(&[l.bias.as_ref().expect("a bias")])?.expect("a declared pack on the GPU");
            ops::linear(&h, &w, Some(&b))
        })
    })
    .unwrap();
    assert_eq!(cuda::counters(ord).unwrap().since(&before).launches, 1 + 3, "one copy of every pack, three products");
    let ids: Vec<Vec<_>> = groups.iter().map(|g| g.iter().map(|t| t.id()).collect()).collect();
    let mut order = Vec::new();
    asrforge::autograd::backward_with_hooks(&ops::sum_all(&y).unwrap(), &mut |t: &Tensor| {
        order.extend(ids.iter().position(|g| g.contains(&t.id())));
        Ok(())
    })
    .unwrap();
    assert_eq!(order, vec![2, 2, 1, 1, 0, 0], "each layer's gradients final after its own backward, the last layer first");
    let got: Vec<Vec<f64>> = groups.iter().flatten().map(|p| p.grad().unwrap().to_f64_vec().unwrap()).collect();
    groups.iter().flatten().for_each(|p| p.zero_grad());
    let y = layers.iter().try_fold(x.clone(), |h, l| l.forward(&h)).unwrap();
    asrforge::autograd::backward(&ops::sum_all(&y).unwrap()).unwrap();
    for (i, (p, g)) in groups.iter().flatten().zip(&got).enumerate() {
        assert_eq!(&p.grad().unwrap().to_f64_vec().unwrap(), g, "parameter {i} (seed {s})");
        p.zero_grad();
    }
}

/// The masks go up to the GPU once per forward, not once per layer that
/// reads them: the encoder's frame padding mask is moved there before the
/// blocks, an attention mask keeps one copy of its tensor (the composition)
/// and of its key lengths (the fused kernels, which take the padding, the
/// causal rule and WeNet's chunks from the rule and never read the (B, 1,
/// T, T) tensor). So a steady step's host→device copies do not grow with
/// depth: the tiny config with 2 and 4 encoder blocks (and 2 and 3 decoder
/// blocks) copies as often, with the fusion off and on, for a plain
/// conformer and a causal one trained with dynamic chunks (whose
/// convolution modules widen the mask on the device).
#[test]
fn host_to_device_copies_of_a_step_do_not_grow_with_depth() {
    use serde_yaml_ng::Value;
    let Some(_) = common::gpu::gpu("host_to_device_copies_of_a_step_do_not_grow_with_depth") else { return };
    let _s = serial();
    let text = std::fs::read_to_string(tiny_config()).expect("conf/tiny.yaml");
    let dir = std::env::temp_dir().join(format!("asrforge-htod-depth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for causal in [false, true] {
        for fusion in ["none", "all"] {
            let copies: Vec<u64> = [(2u64, 2u64), (4, 3)]
                .iter()
                .map(|&(enc, dec)| {
                    let mut root: Value = serde_yaml_ng::from_str(&text).unwrap();
                    let set = |root: &mut Value, section: &str, key: &str, v: Value| {
                        root.get_mut(section).and_then(Value::as_mapping_mut).expect("a section of conf/tiny.yaml").insert(key.into(), v);
                    };
                    set(&mut root, "encoder_conf", "num_blocks", enc.into());
                    set(&mut root, "decoder_conf", "num_blocks", dec.into());
                    set(&mut root, "encoder_conf", "causal", causal.into());
                    set(&mut root, "encoder_conf", "use_dynamic_chunk", causal.into());
                    root.as_mapping_mut().unwrap().insert("fusion".into(), fusion.into());
                    let config = dir.join(format!("tiny_{causal}_{fusion}_{enc}.yaml"));
                    std::fs::write(&config, serde_yaml_ng::to_string(&root).unwrap()).unwrap();
                    let r = run_bench_train(&BenchTrainArgs { config, steps: 3, warmup: 2, ..profiled_bench("fp32", false) });
                    asrforge::ops::fusion::set_enabled(&[]);
                    let (_, step) = r.expect("bench-train --device cuda --profile").kernel_profile.expect("a kernel profile");
                    step.htod_copies
                })
                .collect();
            assert_eq!(copies[0], copies[1], "causal {causal}, fusion {fusion}: copies up per step at 2 and at 4 encoder blocks");
            eprintln!("causal {causal}, fusion {fusion}: {} copies up per step at either depth", copies[0]);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
