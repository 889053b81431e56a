//! The fused Conformer convolution module (`ops::conv_module_core` with the
//! fusion switch's `convmodule` on: cuda/conv_module.cu) against the
//! composition it replaces (the same op with the switch off, on the same
//! GPU) and against the CPU op (the composition in f64): outputs, the
//! gradients of a, the depthwise weight and bias and the norm's weight and
//! bias, and batch norm's running statistics, on fresh random inputs of
//! ragged lengths with frame masks (and without, as `wenet_masking`), causal
//! (valid conv over T + K − 1 frames) and non-causal (padding (K − 1)/2),
//! batch norm in training and eval and layer norm, in f32, f64, f16 and
//! bf16, through the harness of `common::gpu` (its tolerance per dtype).
//! The fusion switch is process-wide, so the tests run one at a time.

mod common;

use asrforge::autograd;
use asrforge::ops::{self, fusion, BatchNormState, ConvCoreNorm};
use asrforge::tensor::Rng;
use asrforge::{DType, Device, Tensor};
use common::fresh_seed;
use common::gpu::{self, assert_close_floor, gpu, serial};

#[derive(Clone, Copy, Debug)]
enum Norm {
    Batch { training: bool },
    Layer,
}

/// One module shape: B sequences of `lens` valid frames, T frames padded, C channels, kernel K.
#[derive(Clone, Debug)]
struct Case {
    lens: Vec<usize>,
    t: usize,
    c: usize,
    k: usize,
    causal: bool,
    masked: bool,
    norm: Norm,
}

impl Case {
    /// Frames fed to the conv: the causal left context, then T.
    fn t_in(&self) -> usize {
        self.t + if self.causal { self.k - 1 } else { 0 }
    }
    fn padding(&self) -> usize {
        if self.causal {
            0
        } else {
            (self.k - 1) / 2
        }
    }
    fn b(&self) -> usize {
        self.lens.len()
    }
    /// The GLU's frame mask (B, T', 1): the left context is never masked.
    fn mask(&self) -> Vec<u8> {
        let left = self.t_in() - self.t;
        self.lens.iter().flat_map(|&l| (0..self.t_in()).map(move |i| u8::from(i >= left + l))).collect()
    }
}

/// The inputs of one case, already rounded to the dtype under test.
struct Inputs {
    a: Vec<f64>,
    w: Vec<f64>,
    wb: Vec<f64>,
    nw: Vec<f64>,
    nb: Vec<f64>,
    r: Vec<f64>,
}

fn round(v: Vec<f64>, dt: DType) -> Vec<f64> {
    let n = v.len();
    common::tensor(&v, &[n], dt, &Device::Cpu).to_f64_vec().unwrap()
}

fn inputs(case: &Case, dt: DType, rng: &mut Rng) -> Inputs {
    let (b, c, k) = (case.b(), case.c, case.k);
    let to = case.t;
    let nw: Vec<f64> = rng.normal(c).into_iter().map(|v| 1.0 + 0.3 * v).collect();
    Inputs {
        a: round(rng.normal(b * case.t_in() * 2 * c), dt),
        w: round(rng.normal(c * k).into_iter().map(|v| v * 0.4).collect(), dt),
        wb: round(rng.normal(c), dt),
        nw: round(nw, dt),
        nb: round(rng.normal(c).into_iter().map(|v| 0.5 * v).collect(), dt),
        // The loss's weights are the output's gradient: rounded to the dtype
        // like every input, so that the half runs and the f64 truth get the same.
        r: round(rng.normal(b * to * c), dt),
    }
}

/// What one run gives: the output, the gradients (a, w, wb, nw, nb), the
/// running mean and variance after it (batch norm).
struct Run {
    y: Vec<f64>,
    grads: Vec<Vec<f64>>,
    stats: Option<(Vec<f64>, Vec<f64>)>,
}

/// The op on `dev` in `dt` (f64 on the CPU for the reference), fused or not.
fn run(case: &Case, x: &Inputs, dt: DType, dev: &Device, fused: bool) -> Run {
    fusion::set_enabled(if fused { &[fusion::Fusion::ConvModule] } else { &[] });
    let (b, t_in, c, k) = (case.b(), case.t_in(), case.c, case.k);
    // The norm's parameters and statistics are f32 for half activations.
    let pdt = if matches!(dt, DType::F16 | DType::BF16) { DType::F32 } else { dt };
    let leaf = |v: &[f64], s: &[usize], d: DType| common::tensor(v, s, d, dev).requires_grad_();
    let a = leaf(&x.a, &[b, t_in, 2 * c], dt);
    let w = leaf(&x.w, &[c, 1, k], dt);
    let wb = leaf(&x.wb, &[c], dt);
    let nw = leaf(&x.nw, &[c], pdt);
    let nb = leaf(&x.nb, &[c], pdt);
    let rm = common::tensor(&vec![0.25; c], &[c], pdt, dev);
    let rv = common::tensor(&vec![1.5; c], &[c], pdt, dev);
    let mask = case.masked.then(|| Tensor::from_vec(case.mask(), [b, t_in, 1], &Device::Cpu).unwrap().to_device(dev).unwrap());
    let norm = match case.norm {
        Norm::Batch { training } => {
            ConvCoreNorm::Batch { weight: &nw, bias: &nb, state: BatchNormState { running_mean: &rm, running_var: &rv, momentum: 0.1, eps: 1e-5, training } }
        }
        Norm::Layer => ConvCoreNorm::Layer { weight: &nw, bias: &nb, eps: 1e-5 },
    };
    let y = ops::conv_module_core(&a, mask.as_ref(), &w, Some(&wb), case.padding(), &norm).expect("conv_module_core");
    fusion::set_enabled(&[]);
    assert_eq!(y.dims(), &[b, case.t, c], "{case:?}");
    assert_eq!(y.dtype(), dt, "{case:?}: the output keeps the input's dtype");
    let yf = if dt == DType::F64 { y.clone() } else { ops::to_dtype(&y, DType::F32).unwrap() };
    let r = common::tensor(&x.r, &[b, case.t, c], yf.dtype(), dev);
    let loss = ops::sum_all(&ops::mul(&yf, &r).unwrap()).unwrap();
    fusion::set_enabled(if fused { &[fusion::Fusion::ConvModule] } else { &[] });
    autograd::backward(&loss).expect("backward");
    fusion::set_enabled(&[]);
    assert_eq!(autograd::tape_len(), 0, "backward empties the tape");
    let grads = [&a, &w, &wb, &nw, &nb].iter().map(|t| t.grad().expect("a gradient reached every input").to_f64_vec().unwrap()).collect();
    let stats = matches!(case.norm, Norm::Batch { .. }).then(|| (rm.to_f64_vec().unwrap(), rv.to_f64_vec().unwrap()));
    Run { y: y.to_f64_vec().unwrap(), grads, stats }
}

const NAMES: [&str; 5] = ["a", "depthwise weight", "depthwise bias", "norm weight", "norm bias"];

impl Run {
    /// Every compared result, named: the output, the gradients, the running statistics.
    fn results(&self) -> Vec<(String, &[f64])> {
        let mut v = vec![("output".to_string(), &self.y[..])];
        v.extend(self.grads.iter().enumerate().map(|(i, g)| (format!("gradient of the {}", NAMES[i]), &g[..])));
        if let Some((m, var)) = &self.stats {
            v.push(("running mean".into(), &m[..]));
            v.push(("running var".into(), &var[..]));
        }
        v
    }
}

/// The absolute floor of each element's tolerance (`gpu::assert_close_floor`),
/// per result in [`Run::results`]' order (empty: none): none but for the
/// depthwise bias's gradient under batch norm in training, which is exactly
/// 0 (the norm removes any per-channel shift of z), so both sides hold only
/// the rounding errors of channel c's sum over the n = B·To frames of dz:
/// its floor is √n·σ_c, σ_c the RMS of channel c's dz (the CPU's, in f64).
fn floors(case: &Case, x: &Inputs) -> Vec<Vec<f64>> {
    let mut f = vec![Vec::new(); 8];
    if let Norm::Batch { training: true } = case.norm {
        // √n·σ_c = (Σ over channel c's n values of dz²)^½.
        let dz = cpu_dz(case, x);
        f[3] = (0..case.c).map(|ch| dz.iter().skip(ch).step_by(case.c).map(|v| v * v).sum::<f64>().sqrt()).collect();
    }
    f
}

/// `gpu::assert_close_floor` with a floor per element (or none).
fn close(what: &str, got: &[f64], want: &[f64], tol: f64, floor: &[f64], seed: u64) {
    if floor.is_empty() {
        return assert_close_floor(what, got, want, tol, 0.0, seed);
    }
    for (i, ((g, w), fl)) in got.iter().zip(want).zip(floor).enumerate() {
        assert_close_floor(&format!("{what} [{i}]"), &[*g], &[*w], tol, *fl, seed);
    }
}

/// The gradient of the loss with respect to z (the depthwise conv's output)
/// on the CPU in f64: the composition up to z, then batch norm and silu on z as a leaf.
fn cpu_dz(case: &Case, x: &Inputs) -> Vec<f64> {
    let (b, t_in, c, k) = (case.b(), case.t_in(), case.c, case.k);
    let cpu = Device::Cpu;
    let z = autograd::no_grad(|| {
        let a = common::tensor(&x.a, &[b, t_in, 2 * c], DType::F64, &cpu);
        let mut h = ops::glu(&a, -1)?;
        if case.masked {
            h = ops::masked_fill(&h, &Tensor::from_vec(case.mask(), [b, t_in, 1], &cpu)?, 0.0)?;
        }
        let (w, wb) = (common::tensor(&x.w, &[c, 1, k], DType::F64, &cpu), common::tensor(&x.wb, &[c], DType::F64, &cpu));
        ops::conv1d_depthwise(&h, &w, Some(&wb), case.padding())
    })
    .unwrap();
    let z = ops::reshape(&z, [b * case.t, c]).unwrap().requires_grad_();
    let (nw, nb) = (common::tensor(&x.nw, &[c], DType::F64, &cpu), common::tensor(&x.nb, &[c], DType::F64, &cpu));
    let (rm, rv) = (common::tensor(&vec![0.25; c], &[c], DType::F64, &cpu), common::tensor(&vec![1.5; c], &[c], DType::F64, &cpu));
    let st = BatchNormState { running_mean: &rm, running_var: &rv, momentum: 0.1, eps: 1e-5, training: true };
    let y = ops::silu(&ops::batch_norm(&z, &nw, &nb, &st).unwrap()).unwrap();
    let r = common::tensor(&x.r, &[b * case.t, c], DType::F64, &cpu);
    autograd::backward(&ops::sum_all(&ops::mul(&y, &r).unwrap()).unwrap()).unwrap();
    z.grad().expect("the gradient of z").to_f64_vec().unwrap()
}

/// The largest |x − t| / (|t| + max(rms(t), floor)) over the elements (NaN
/// or inf: infinite), the floor per element (or none).
fn rel_err(x: &[f64], t: &[f64], floor: &[f64]) -> f64 {
    let rms = (t.iter().map(|v| v * v).sum::<f64>() / t.len().max(1) as f64).sqrt();
    let fl = |i: usize| floor.get(i).copied().unwrap_or(0.0);
    x.iter()
        .zip(t)
        .enumerate()
        .map(|(i, (x, t))| if x.is_finite() { (x - t).abs() / (t.abs() + rms.max(fl(i))).max(f64::MIN_POSITIVE) } else { f64::INFINITY })
        .fold(0.0, f64::max)
}

/// Fused vs the CPU op and vs the composition on the GPU, every dtype. In
/// f32 and f64 all three agree within the dtype's tolerance. In f16 and
/// bf16 the composition rounds the GLU output, the norm's output and their
/// gradients to half between its kernels where the fused kernels keep them
/// in f32, so the two differ by more than one rounding: as for flash
/// attention (tests/cuda_attention.rs `compare_accuracy`), both are
/// measured against the truth (the CPU op in f64 on the same half inputs)
/// and the fused error must be within the tolerance or no larger than the
/// composition's, for the output, every gradient and the running statistics.
fn check(dev: &Device, case: &Case, dtypes: &[DType]) {
    for &dt in dtypes {
        let seed = fresh_seed();
        let mut rng = Rng::new(seed);
        let x = inputs(case, dt, &mut rng);
        let floor = floors(case, &x);
        let cpu = run(case, &x, DType::F64, &Device::Cpu, false);
        let fused = run(case, &x, dt, dev, true);
        let comp = run(case, &x, dt, dev, false);
        let what = format!("{case:?} {dt:?}");
        let tol = gpu::tol(dt);
        for (i, (((name, f), (_, c)), (_, t))) in fused.results().into_iter().zip(comp.results()).zip(cpu.results()).enumerate() {
            let fl = &floor[i];
            if matches!(dt, DType::F32 | DType::F64) {
                close(&format!("{what} fused vs CPU: {name}"), f, t, tol, fl, seed);
                close(&format!("{what} fused vs composition: {name}"), f, c, tol, fl, seed);
            } else {
                let (ef, ec) = (rel_err(f, t, fl), rel_err(c, t, fl));
                close(&format!("{what} fused vs CPU: {name}"), f, t, tol, fl, seed);
                assert!(ef <= ec.max(tol), "{what} {name}: fused error {ef:e} above both the composition's {ec:e} and the tolerance {tol} (seed {seed})");
            }
        }
    }
}

fn case(lens: &[usize], t: usize, c: usize, k: usize, causal: bool, masked: bool, norm: Norm) -> Case {
    Case { lens: lens.to_vec(), t, c, k, causal, masked, norm }
}

const ALL: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

#[test]
fn fused_batch_norm_module_matches_the_composition_and_the_cpu() {
    let Some(dev) = gpu("fused_batch_norm_module_matches_the_composition_and_the_cpu") else { return };
    let _s = serial();
    // 4 x 40 frames x 40 channels: 6400 outputs, past the capped grid's
    // 37 x 256 threads for a's 12800 elements; two channel strips, the
    // second ragged; ragged lengths (one full, one of 1 frame).
    for causal in [false, true] {
        for masked in [true, false] {
            for training in [true, false] {
                check(&dev, &case(&[40, 27, 1, 33], 40, 40, 7, causal, masked, Norm::Batch { training }), &ALL);
            }
        }
    }
}

#[test]
fn fused_layer_norm_module_matches_the_composition_and_the_cpu() {
    let Some(dev) = gpu("fused_layer_norm_module_matches_the_composition_and_the_cpu") else { return };
    let _s = serial();
    for causal in [false, true] {
        for masked in [true, false] {
            check(&dev, &case(&[40, 27, 1, 33], 40, 40, 7, causal, masked, Norm::Layer), &ALL);
        }
    }
}

#[test]
fn fused_module_handles_wide_channels_and_long_kernels() {
    let Some(dev) = gpu("fused_module_handles_wide_channels_and_long_kernels") else { return };
    let _s = serial();
    // C 300: more channels than a block; C 1030: layer norm's block-per-row
    // kernels (rows longer than NN_WARP_ROW_MAX); K 15 longer than the
    // shortest sequence.
    check(&dev, &case(&[9, 4], 9, 300, 15, false, true, Norm::Batch { training: true }), &[DType::F32, DType::BF16]);
    check(&dev, &case(&[9, 4], 9, 300, 15, true, true, Norm::Layer), &[DType::F32, DType::F16]);
    check(&dev, &case(&[5, 3], 5, 1030, 3, false, true, Norm::Layer), &[DType::F32, DType::BF16]);
}

/// A swish `ConvolutionModule` of `c` channels and kernel `k` in f32, its
/// parameters and running statistics on `dev`.
fn module_on(
    dev: &Device,
    c: usize,
    k: usize,
    norm: asrforge::models::config::ConvNorm,
    causal: bool,
    wenet: bool,
    rng: &mut Rng,
) -> asrforge::models::convolution::ConvolutionModule {
    use asrforge::models::config::Activation;
    use asrforge::nn::Module;
    let mut m = asrforge::models::convolution::ConvolutionModule::new(c, k, Activation::Swish, norm, causal, 1e-5, DType::F32, rng).unwrap();
    m.wenet_masking = wenet;
    for nt in m.state_dict() {
        if nt.tensor.dtype() == DType::F32 {
            nt.tensor.move_to_device(dev).unwrap();
        }
    }
    m
}

/// A batch norm module's running statistics, each with a copy of its value now.
fn running_stats(m: &asrforge::models::convolution::ConvolutionModule) -> Vec<(Tensor, Tensor)> {
    match &m.norm {
        asrforge::models::convolution::ConvModuleNorm::Batch(bn) => {
            [&bn.running_mean, &bn.running_var].map(|s| (s.clone(), ops::mul_scalar(s, 1.0).unwrap())).to_vec()
        }
        asrforge::models::convolution::ConvModuleNorm::Layer(_) => Vec::new(),
    }
}

/// One training step of `m` from the running statistics `start` (restored
/// first, its step count set to 0): the forward on x with `pad` and the
/// backward of Σ y·wt, with the `convmodule` fusion on or off. Returns the
/// output, every parameter's gradient and the running statistics with their
/// step count, named, and x's gradient.
fn module_step(
    m: &asrforge::models::convolution::ConvolutionModule,
    start: &[(Tensor, Tensor)],
    x: &Tensor,
    pad: &Tensor,
    wt: &Tensor,
    fused: bool,
) -> (Vec<(String, Vec<f64>)>, Vec<f64>) {
    use asrforge::models::convolution::ConvModuleNorm;
    use asrforge::nn::Module;
    for (live, copy) in start {
        live.assign(copy).unwrap();
    }
    if let ConvModuleNorm::Batch(bn) = &m.norm {
        bn.num_batches_tracked.assign(&Tensor::from_vec(vec![0i64], (), &Device::Cpu).unwrap()).unwrap();
    }
    m.zero_grad();
    let xg = x.detach().requires_grad_();
    fusion::set_enabled(if fused { &[fusion::Fusion::ConvModule] } else { &[] });
    let y = m.forward(&xg, Some(pad)).unwrap();
    autograd::backward(&ops::sum_all(&ops::mul(&y, wt).unwrap()).unwrap()).unwrap();
    fusion::set_enabled(&[]);
    let mut res = vec![("output".to_string(), y.to_f64_vec().unwrap())];
    for (name, p) in m.named_parameters() {
        res.push((format!("gradient of {name}"), p.grad().expect("every parameter has a gradient").to_f64_vec().unwrap()));
    }
    if let ConvModuleNorm::Batch(bn) = &m.norm {
        for (name, s) in [("running mean", &bn.running_mean), ("running var", &bn.running_var), ("batches tracked", &bn.num_batches_tracked)] {
            res.push((name.to_string(), s.to_f64_vec().unwrap()));
        }
    }
    (res, xg.grad().unwrap().to_f64_vec().unwrap())
}

/// The whole `ConvolutionModule` (pointwise convs, frame masks, batch norm's
/// `num_batches_tracked`) with the fusion switch on and off on the GPU, in
/// f32: the same output, input and parameter gradients and running
/// statistics, for batch and layer norm, causal or not, WeNet masking or
/// not; then a causal module's streaming (`forward_cached` over two chunks
/// with the cache) in eval mode gives the same outputs and caches.
#[test]
fn the_convolution_module_is_the_same_fused_and_unfused_streaming_included() {
    use asrforge::models::config::ConvNorm;
    use asrforge::models::encoder::frame_pad_mask;
    use asrforge::nn::Module;
    let Some(dev) = gpu("the_convolution_module_is_the_same_fused_and_unfused_streaming_included") else { return };
    let _s = serial();
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    let (b, t, c, k) = (3, 13, 24, 5);
    let cases =
        [(ConvNorm::BatchNorm, false, false), (ConvNorm::BatchNorm, true, true), (ConvNorm::LayerNorm, true, false), (ConvNorm::LayerNorm, false, true)];
    for (norm, causal, wenet) in cases {
        let mut m = module_on(&dev, c, k, norm, causal, wenet, &mut rng);
        let x = common::tensor(&rng.normal(b * t * c), &[b, t, c], DType::F32, &dev);
        let wt = common::tensor(&rng.normal(b * t * c), &[b, t, c], DType::F32, &dev);
        let pad = frame_pad_mask(&[13, 9, 4], t).unwrap().to_device(&dev).unwrap();
        let start = running_stats(&m);
        let mut runs = Vec::new();
        for fused in [true, false] {
            let (mut res, xg) = module_step(&m, &start, &x, &pad, &wt, fused);
            res.push(("gradient of x".to_string(), xg));
            runs.push(res);
        }
        for ((name, f), (_, u)) in runs[0].iter().zip(&runs[1]) {
            // Under training batch norm the depthwise bias's gradient is
            // exactly 0, both sides rounding noise: the op tests above bound
            // it by its floor (`floors`).
            if matches!(norm, ConvNorm::BatchNorm) && name.contains("depthwise_conv.bias") {
                continue;
            }
            assert_close_floor(&format!("{norm:?} causal={causal} wenet_masking={wenet}: fused vs unfused module: {name}"), f, u, gpu::F32, 0.0, seed);
        }
        if !causal {
            continue;
        }
        // Streaming in eval: two chunks, each continuing from the last cache.
        m.train(false);
        let mut outs = Vec::new();
        for fused in [true, false] {
            fusion::set_enabled(if fused { &[fusion::Fusion::ConvModule] } else { &[] });
            let (y1, c1) = m.forward_cached(&ops::narrow(&x, 1, 0, 7).unwrap(), None, None).unwrap();
            let (y2, c2) = m.forward_cached(&ops::narrow(&x, 1, 7, t - 7).unwrap(), None, c1.as_ref()).unwrap();
            fusion::set_enabled(&[]);
            outs.push([y1, y2, c2.expect("a causal module returns a cache")].map(|v| v.to_f64_vec().unwrap()));
        }
        for (i, (f, u)) in outs[0].iter().zip(&outs[1]).enumerate() {
            assert_close_floor(&format!("{norm:?} streaming chunk result {i}: fused vs unfused"), f, u, gpu::F32, 0.0, seed);
        }
    }
}

/// The whole `ConvolutionModule` ignores what its input holds at padded
/// frames: with those frames of x redrawn (N(4, 9), far from the valid
/// frames'), the output, every parameter gradient, the running statistics
/// and x's gradient at valid frames are the same bits, and x's gradient is 0
/// at padded frames. On the CPU and on the GPU with the fusion switch on and
/// off, in f32, for batch and layer norm, causal or not, WeNet masking or
/// not. (Without WeNet masking the module skips masking its input, the GLU
/// mask making that mask redundant; with it, the input mask does the work.)
#[test]
fn the_convolution_module_ignores_its_inputs_padded_frames() {
    use asrforge::models::config::ConvNorm;
    use asrforge::models::encoder::frame_pad_mask;
    let Some(gdev) = gpu("the_convolution_module_ignores_its_inputs_padded_frames") else { return };
    let _s = serial();
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    let (b, t, c, k) = (3, 13, 24, 5);
    let lens = [13, 9, 4];
    let padded = |row: usize| row % t >= lens[row / t];
    let cases =
        [(ConvNorm::BatchNorm, false, false), (ConvNorm::BatchNorm, true, true), (ConvNorm::LayerNorm, true, false), (ConvNorm::LayerNorm, false, true)];
    for (dev, fused) in [(Device::Cpu, false), (gdev, true), (gdev, false)] {
        for (norm, causal, wenet) in cases {
            let what = format!("{norm:?} causal={causal} wenet_masking={wenet} on {dev:?} fused={fused}");
            let m = module_on(&dev, c, k, norm, causal, wenet, &mut rng);
            let xv = rng.normal(b * t * c);
            let junk: Vec<f64> = rng.normal(b * t * c).into_iter().map(|v| 4.0 + 9.0 * v).collect();
            let xj: Vec<f64> = xv.iter().zip(&junk).enumerate().map(|(i, (&v, &j))| if padded(i / c) { j } else { v }).collect();
            let wt = common::tensor(&rng.normal(b * t * c), &[b, t, c], DType::F32, &dev);
            let pad = frame_pad_mask(&lens, t).unwrap().to_device(&dev).unwrap();
            let start = running_stats(&m);
            let runs: Vec<_> =
                [&xv, &xj].map(|v| module_step(&m, &start, &common::tensor(v, &[b, t, c], DType::F32, &dev), &pad, &wt, fused)).into_iter().collect();
            for ((name, a), (_, j)) in runs[0].0.iter().zip(&runs[1].0) {
                assert!(a == j, "{what}: {name} changed with the padded input frames (seed {seed})");
            }
            let (ga, gj) = (&runs[0].1, &runs[1].1);
            for (i, (a, j)) in ga.iter().zip(gj).enumerate() {
                if padded(i / c) {
                    assert!(*a == 0.0 && *j == 0.0, "{what}: x's gradient at padded element {i} is {a}, {j}, want 0 (seed {seed})");
                } else {
                    assert!(a == j, "{what}: x's gradient at valid element {i} is {a} and {j} with other padded frames (seed {seed})");
                }
            }
        }
    }
}
