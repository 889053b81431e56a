//! Flash attention (`ops::flash_attention`, `cuda/attention.cu`) against
//! the composition it replaces (`ops::matmul_pair_scaled` or
//! `ops::matmul_scaled`, `ops::masked_softmax` with a dense (B, 1, T1, T2)
//! mask built here from WeNet's definitions, `ops::dropout`, `ops::matmul`)
//! and the CUDA kernel against the CPU op: outputs and every gradient
//! (q, k, v, p, u, vb), on fresh random inputs, ragged key lengths (one of
//! 0: fully masked rows), every mask kind (key lengths, chunk with all or
//! limited left context, causal, a mask tensor with a fully masked row),
//! dropout on and off (the same Philox words as ops::dropout draws over
//! the weights), d_k 64 and 128 and small ones, T not a multiple of the
//! 16-row tile, and more (sequence, head, tile) units than the capped grid.
//! The CPU tests run without a GPU; the GPU ones on the emulator.

mod common;

use asrforge::models::mask::subsequent_chunk_mask;
use asrforge::ops::{self, FlashMask, RelPos};
use asrforge::tensor::{rng, Rng};
use asrforge::{DType, Device, Result, Tensor};
use common::gpu::{self, assert_close as close, gpu};
use common::{draw, fresh_seed, run_with_grads, Kind, OpFn};
use std::rc::Rc;

/// One attention problem.
#[derive(Clone, Debug)]
struct Case {
    b: usize,
    t1: usize,
    t2: usize,
    h: usize,
    d: usize,
    /// The positional table's batch (1 or b), if rel-pos.
    pos: Option<usize>,
    lens: Option<Vec<usize>>,
    chunk: Option<(usize, i64)>,
    causal: bool,
    /// A random (B, 1, T1, T2) mask tensor (first query of the first sequence fully masked).
    tensor_mask: bool,
    dropout: f64,
}

impl Case {
    fn shapes(&self) -> Vec<Vec<usize>> {
        let mut s = vec![vec![self.b, self.t1, self.h, self.d], vec![self.b, self.t2, self.h, self.d], vec![self.b, self.t2, self.h, self.d]];
        if let Some(pb) = self.pos {
            s.extend([vec![pb, self.t2, self.h, self.d], vec![self.h, self.d], vec![self.h, self.d]]);
        }
        s
    }

    /// The random mask tensor's bytes (1 = masked), from `seed`.
    fn random_mask(&self, seed: u64) -> Vec<u8> {
        let n = self.b * self.t1 * self.t2;
        let mut m: Vec<u8> = Rng::new(seed).uniform(n).into_iter().map(|u| u8::from(u < 0.3)).collect();
        m[..self.t2].iter_mut().for_each(|v| *v = 1);
        m
    }

    /// The dense mask of every rule, built from the definitions (WeNet's
    /// subsequent_chunk_mask for chunks), (B, 1, T1, T2), 1 = masked.
    fn dense_mask(&self, seed: u64) -> Vec<u8> {
        let (t1, t2) = (self.t1, self.t2);
        let chunk = self.chunk.map(|(c, l)| subsequent_chunk_mask(t1.max(t2), c, l).unwrap());
        let rand = self.tensor_mask.then(|| self.random_mask(seed));
        let mut m = vec![0u8; self.b * t1 * t2];
        for b in 0..self.b {
            for i in 0..t1 {
                for j in 0..t2 {
                    let e = (b * t1 + i) * t2 + j;
                    let mut off = self.lens.as_ref().is_some_and(|l| j >= l[b]) || (self.causal && j > i);
                    if let Some(c) = &chunk {
                        off |= !c[i * t1.max(t2) + j];
                    }
                    if let Some(r) = &rand {
                        off |= r[e] != 0;
                    }
                    m[e] = u8::from(off);
                }
            }
        }
        m
    }

    fn flash_mask(&self, seed: u64) -> FlashMask {
        FlashMask {
            key_lengths: self.lens.clone(),
            chunk: self.chunk,
            causal: self.causal,
            mask: self.tensor_mask.then(|| Tensor::from_vec(self.random_mask(seed), [self.b, 1, self.t1, self.t2], &Device::Cpu).unwrap()),
            ..Default::default()
        }
    }
}

/// The fused op on `x` (q, k, v[, p, u, vb]); the generator seeded first so
/// the dropout words are those of the composition.
fn fused(c: &Case, seed: u64) -> Rc<OpFn> {
    let (c, m) = (c.clone(), c.flash_mask(seed));
    Rc::new(move |x: &[Tensor]| {
        rng::manual_seed(seed);
        let pos = c.pos.map(|_| RelPos { p: &x[3], u: &x[4], vb: &x[5] });
        ops::flash_attention(&x[0], &x[1], &x[2], pos, &m, c.dropout, c.dropout > 0.0)
    })
}

/// The composition the fused op replaces, in the (B, T, H, d_k) layout.
fn composed(c: &Case, seed: u64) -> Rc<OpFn> {
    let c = c.clone();
    let mask = Tensor::from_vec(c.dense_mask(seed), [c.b, 1, c.t1, c.t2], &Device::Cpu).unwrap();
    Rc::new(move |x: &[Tensor]| -> Result<Tensor> {
        rng::manual_seed(seed);
        let heads = |t: &Tensor| ops::permute(t, &[0, 2, 1, 3]);
        let scale = 1.0 / (c.d as f64).sqrt();
        let scores = match c.pos {
            Some(_) => {
                let p = if x[3].dims()[0] == c.b { x[3].clone() } else { ops::broadcast_to(&x[3], &[c.b, c.t2, c.h, c.d])? };
                let (qu, qv) = (ops::add(&x[0], &x[4])?, ops::add(&x[0], &x[5])?);
                ops::matmul_pair_scaled(&heads(&qu)?, &heads(&x[1])?, &heads(&qv)?, &heads(&p)?, false, true, scale)?
            }
            None => ops::matmul_scaled(&heads(&x[0])?, &heads(&x[1])?, false, true, scale)?,
        };
        let a = ops::masked_softmax(&scores, &mask)?;
        let a = ops::dropout(&a, c.dropout, c.dropout > 0.0)?;
        heads(&ops::matmul(&a, &heads(&x[2])?)?)
    })
}

/// Input values and shapes.
type Vals = Vec<(Vec<f64>, Vec<usize>)>;

/// Fresh inputs of `c` and the output weights, rounded to `dtype` once.
fn inputs(c: &Case, dtype: DType, seed: u64) -> (Vals, Vec<f64>) {
    let mut r = Rng::new(seed);
    let vals: Vec<(Vec<f64>, Vec<usize>)> = c
        .shapes()
        .into_iter()
        .map(|s| {
            let v = draw(&mut r, &s, Kind::Normal);
            (common::tensor(&v, &s, dtype, &Device::Cpu).to_f64_vec().unwrap(), s)
        })
        .collect();
    // The output weights (the output gradient) rounded to the dtype too, so
    // a half run's gradient and an f64 run's start from the same numbers.
    let n = c.b * c.t1 * c.h * c.d;
    let weights = common::tensor(&r.normal(n), &[n], dtype, &Device::Cpu).to_f64_vec().unwrap();
    (vals, weights)
}

const NAMES: [&str; 6] = ["q", "k", "v", "p", "u", "vb"];

/// The output then every gradient of `f` on `dev` in `dtype`.
fn results(f: &OpFn, vals: &[(Vec<f64>, Vec<usize>)], weights: &[f64], dtype: DType, dev: &Device) -> Vec<Vec<f64>> {
    let (out, grads) = run_with_grads(f, vals, &vec![true; vals.len()], weights, dtype, dev);
    std::iter::once(out).chain(grads.into_iter().map(|g| g.expect("a gradient"))).collect()
}

fn label(i: usize) -> String {
    if i == 0 {
        "output".into()
    } else {
        format!("gradient of {}", NAMES[i - 1])
    }
}

/// Runs `f` on `fd` and `g` on `gd` in `dtype` with the same fresh inputs
/// (rounded to the dtype once) and compares the output and every gradient.
#[allow(clippy::too_many_arguments)]
fn compare(name: &str, c: &Case, f: &OpFn, fd: &Device, g: &OpFn, gd: &Device, dtype: DType, tol: f64, seed: u64) {
    let (vals, weights) = inputs(c, dtype, seed);
    let a = results(f, &vals, &weights, dtype, fd);
    let b = results(g, &vals, &weights, dtype, gd);
    for (i, (a, b)) in a.iter().zip(&b).enumerate() {
        close(&format!("{name} {dtype:?} {c:?} {}", label(i)), a, b, tol, seed);
    }
}

/// The largest |x − t| / (|t| + rms(t)) over the elements.
fn rel_err(x: &[f64], t: &[f64]) -> f64 {
    let rms = (t.iter().map(|v| v * v).sum::<f64>() / t.len().max(1) as f64).sqrt();
    x.iter().zip(t).map(|(x, t)| if x.is_finite() { (x - t).abs() / (t.abs() + rms).max(f64::MIN_POSITIVE) } else { f64::INFINITY }).fold(0.0, f64::max)
}

/// In a half dtype the composition rounds its scores, weights and their
/// gradients to half between its kernels while the fused kernel keeps them
/// in f32, so the two differ by more than one rounding. Both are measured
/// against the truth (the CPU op in f64 on the same half inputs): the
/// fused kernel's error must be within `tol` (the dtype's for the scalar
/// kernels, `wmma_tol` for the wmma ones) or no larger than the
/// composition's, for the output and every gradient.
fn compare_accuracy(c: &Case, dev: &Device, dtype: DType, tol: f64, seed: u64) {
    let (vals, weights) = inputs(c, dtype, seed);
    let fusedr = results(&*fused(c, seed), &vals, &weights, dtype, dev);
    let comp = results(&*composed(c, seed), &vals, &weights, dtype, dev);
    let truth = results(&*fused(c, seed), &vals, &weights, DType::F64, &Device::Cpu);
    for i in 0..truth.len() {
        let (ef, ec) = (rel_err(&fusedr[i], &truth[i]), rel_err(&comp[i], &truth[i]));
        println!("{dtype:?} {:?} {}: fused error {ef:.3e}, composition error {ec:.3e}", kernel_for(dtype, c.d), label(i));
        assert!(
            ef <= ec.max(tol),
            "{dtype:?} {:?} {c:?} {}: fused error {ef:e} above both the composition's {ec:e} and the tolerance {tol} (seed {seed})",
            kernel_for(dtype, c.d),
            label(i),
        );
    }
}

fn case(b: usize, t1: usize, t2: usize, h: usize, d: usize) -> Case {
    Case { b, t1, t2, h, d, pos: None, lens: None, chunk: None, causal: false, tensor_mask: false, dropout: 0.0 }
}

/// Every mask kind, rel-pos and plain, dropout on and off; T not a
/// multiple of 16 and ragged lengths (a 0 gives fully masked rows).
fn cases(d: usize) -> Vec<Case> {
    vec![
        // Rel-pos, one shared table, key padding.
        Case { pos: Some(1), lens: Some(vec![21, 9, 1]), ..case(3, 21, 21, 2, d) },
        // Rel-pos, a table per sequence, a chunk of 4 with 1 left chunk, dropout.
        Case { pos: Some(2), lens: Some(vec![18, 11]), chunk: Some((4, 1)), dropout: 0.2, ..case(2, 18, 18, 2, d) },
        // Rel-pos, chunk of 5 with every left chunk and a sequence of length 0.
        Case { pos: Some(1), lens: Some(vec![0, 17]), chunk: Some((5, -1)), ..case(2, 17, 17, 2, d) },
        // Decoder self-attention: causal with padding, dropout.
        Case { lens: Some(vec![19, 6]), causal: true, dropout: 0.1, ..case(2, 19, 19, 2, d) },
        // Cross attention (T1 != T2) with a per-query mask tensor and dropout.
        Case { tensor_mask: true, dropout: 0.3, ..case(2, 7, 33, 2, d) },
    ]
}

#[test]
fn flash_attention_matches_the_composition_on_the_cpu() {
    let cpu = Device::Cpu;
    for d in [8, 64] {
        for c in cases(d) {
            let seed = fresh_seed();
            compare("cpu fused vs composition", &c, &*fused(&c, seed), &cpu, &*composed(&c, seed), &cpu, DType::F64, 1e-10, seed);
            compare("cpu fused vs composition", &c, &*fused(&c, seed), &cpu, &*composed(&c, seed), &cpu, DType::F32, kernel_tol(DType::F32), seed);
        }
    }
}

#[test]
fn flash_attention_rejects_bad_shapes_and_masks() {
    let t = |s: &[usize]| Tensor::zeros(s.to_vec(), DType::F32, &Device::Cpu).unwrap();
    let (q, k) = (t(&[2, 5, 2, 4]), t(&[2, 6, 2, 4]));
    let m = FlashMask::default();
    let e = ops::flash_attention(&q, &t(&[2, 6, 2, 3]), &k, None, &m, 0.0, false).unwrap_err().to_string();
    assert!(e.contains("(2, T2, 2, 4)"), "{e}");
    let e = ops::flash_attention(&q, &k, &k, None, &FlashMask { key_lengths: Some(vec![1]), ..Default::default() }, 0.0, false).unwrap_err().to_string();
    assert!(e.contains("2 key lengths") && e.contains('1'), "{e}");
    let e = ops::flash_attention(&q, &k, &k, None, &FlashMask { chunk: Some((0, -1)), ..Default::default() }, 0.0, false).unwrap_err().to_string();
    assert!(e.contains("chunk size"), "{e}");
    let (p, u) = (t(&[3, 6, 2, 4]), t(&[2, 4]));
    let e = ops::flash_attention(&q, &k, &k, Some(RelPos { p: &p, u: &u, vb: &u }), &m, 0.0, false).unwrap_err().to_string();
    assert!(e.contains("1 or 2"), "{e}");
    let e = ops::flash_attention(&q, &k, &k, None, &m, 1.5, true).unwrap_err().to_string();
    assert!(e.contains("dropout"), "{e}");
}

/// The tolerance of `dt` for the kernel against the CPU op or the f32
/// composition: the harness's, three times over in f32, where the
/// gradients are sums over T of recomputed probabilities (exp of a d_k-term
/// dot product) times differences (dout·v − D) that cancel, a longer chain
/// of f32 roundings than one reduction (measured: up to 1.006 × 1e-5 in
/// 60 runs); half results are dominated by their one final rounding.
fn kernel_tol(dt: DType) -> f64 {
    if dt == DType::F32 {
        3.0 * gpu::F32
    } else {
        gpu::tol(dt)
    }
}

#[test]
fn flash_attention_kernel_matches_the_cpu_op() {
    let Some(dev) = gpu("flash_attention_kernel_matches_the_cpu_op") else { return };
    // The scalar kernels, at the tolerances derived for them (f16/bf16 would
    // otherwise run the wmma set, tested at its own below).
    set_kernel_override(Some(AttentionKernel::Scalar));
    let cpu = Device::Cpu;
    for c in cases(64) {
        let seed = fresh_seed();
        for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            compare("kernel vs cpu op", &c, &*fused(&c, seed), &dev, &*fused(&c, seed), &cpu, dt, kernel_tol(dt), seed);
        }
    }
    // d_k 128, and more (sequence, head, tile) units (4·4·3 = 48) than the
    // capped grid of 37 blocks, so the kernels' unit loops wrap.
    let big = [
        Case { pos: Some(1), lens: Some(vec![20, 33, 7]), chunk: Some((8, 2)), dropout: 0.1, ..case(3, 33, 33, 2, 128) },
        Case { pos: Some(1), lens: Some(vec![37, 30, 21, 2]), ..case(4, 37, 37, 4, 16) },
    ];
    for c in big {
        let seed = fresh_seed();
        for dt in [DType::F32, DType::BF16] {
            compare("kernel vs cpu op", &c, &*fused(&c, seed), &dev, &*fused(&c, seed), &cpu, dt, kernel_tol(dt), seed);
        }
    }
    set_kernel_override(None);
}

#[test]
fn flash_attention_kernel_matches_the_composition_on_the_gpu() {
    let Some(dev) = gpu("flash_attention_kernel_matches_the_composition_on_the_gpu") else { return };
    for c in cases(64) {
        let seed = fresh_seed();
        compare("kernel vs composition", &c, &*fused(&c, seed), &dev, &*composed(&c, seed), &dev, DType::F32, kernel_tol(DType::F32), seed);
        for dt in [DType::F16, DType::BF16] {
            for (k, tol) in [(AttentionKernel::Scalar, gpu::tol(dt)), (AttentionKernel::Wmma64, wmma_tol(dt)), (AttentionKernel::Wmma, wmma_tol(dt))] {
                set_kernel_override(Some(k));
                compare_accuracy(&c, &dev, dt, tol, seed);
            }
            set_kernel_override(None);
        }
    }
}

// ---- the layers with the fusion switch on and off ----

use asrforge::nn::{AttentionMask, Module, MultiHeadedAttention, RelPositionMultiHeadedAttention};
use asrforge::ops::fusion::{self, Fusion};

/// Output and gradients (every parameter in `named_parameters` order, then
/// the inputs) of `run` with the fusion families `on`, the generator
/// reseeded so dropout draws the same words either way.
fn layer_run(m: &dyn Module, inputs: &[Tensor], on: &[Fusion], seed: u64, run: &dyn Fn() -> Result<Tensor>) -> (Vec<f64>, Vec<(String, Vec<f64>)>) {
    fusion::set_enabled(on);
    rng::manual_seed(seed);
    let y = run().unwrap();
    fusion::set_enabled(&[]);
    let w = Tensor::randn(y.dims().to_vec(), 0.0, 1.0, DType::F32, &mut Rng::new(seed ^ 1), &Device::Cpu).unwrap().to_device(&y.device()).unwrap();
    let loss = ops::sum_all(&ops::mul(&ops::to_dtype(&y, DType::F32).unwrap(), &w).unwrap()).unwrap();
    asrforge::autograd::backward(&loss).unwrap();
    let mut grads = vec![];
    let mut leaves = m.named_parameters();
    leaves.extend(inputs.iter().enumerate().map(|(i, t)| (format!("input {i}"), t.clone())));
    for (name, t) in leaves {
        let g = t.grad().unwrap_or_else(|| panic!("{name} has no gradient"));
        grads.push((name, g.to_f64_vec().unwrap()));
        t.zero_grad();
    }
    (y.to_f64_vec().unwrap(), grads)
}

fn input_on(shape: &[usize], dev: &Device, rng: &mut Rng) -> Tensor {
    Tensor::randn(shape.to_vec(), 0.0, 1.0, DType::F32, rng, &Device::Cpu).unwrap().to_device(dev).unwrap().requires_grad_()
}

fn move_layer(m: &dyn Module, dev: &Device) {
    for (_, t) in m.named_parameters() {
        t.move_to_device(dev).unwrap();
    }
}

/// The layer with the attention fusion on, and with the `qkv` fusion too
/// (one packed projection), against the composition (every fusion off).
fn layer_compare(what: &str, m: &dyn Module, inputs: &[Tensor], seed: u64, run: &dyn Fn() -> Result<Tensor>) {
    let (yc, gc) = layer_run(m, inputs, &[], seed, run);
    for on in [&[Fusion::Attention][..], &[Fusion::Attention, Fusion::Qkv]] {
        let (yf, gf) = layer_run(m, inputs, on, seed, run);
        layer_close(&format!("{what} with {on:?}"), (&yf, &gf), (&yc, &gc), seed);
    }
}

fn layer_close(what: &str, (yf, gf): (&[f64], &[(String, Vec<f64>)]), (yc, gc): (&[f64], &[(String, Vec<f64>)]), seed: u64) {
    close(&format!("{what} output"), yf, yc, kernel_tol(DType::F32), seed);
    let rms = |v: &[f64]| (v.iter().map(|x| x * x).sum::<f64>() / v.len().max(1) as f64).sqrt();
    for ((name, a), (_, b)) in gf.iter().zip(gc) {
        // A bias gradient is Σ over the B·T rows of the layer's output
        // gradient, and linear_k's is 0 in exact arithmetic (softmax ignores
        // a constant added to every score of a row): its rounding scales
        // with the terms, √(B·T)·rms(rows) ≈ rms of the same layer's weight
        // gradient (inputs of unit variance), the floor used here.
        let floor = match name.strip_suffix(".bias") {
            Some(l) => gc.iter().find(|(n, _)| *n == format!("{l}.weight")).map_or(0.0, |(_, w)| rms(w)),
            None => 0.0,
        };
        common::gpu::assert_close_floor(&format!("{what} gradient of {name}"), a, b, kernel_tol(DType::F32), floor, seed);
    }
}

/// The encoder's rel-pos self-attention (key padding), the decoder's causal
/// self-attention and its cross attention (T1 != T2), d = 128 with 2 heads
/// (d_k 64), dropout 0.1, in f32 on the CPU and on the GPU: the fusion
/// switch (attention, and attention with qkv) changes outputs and
/// gradients by no more than f32 rounding.
#[test]
fn attention_layers_match_with_the_fusion_on_and_off() {
    let mut devs = vec![Device::Cpu];
    devs.extend(gpu("attention_layers_match_with_the_fusion_on_and_off"));
    for dev in devs {
        let seed = fresh_seed();
        let mut rng = Rng::new(seed);
        let (b, t, ts, d, h) = (2, 19, 23, 128, 2);
        let rel = RelPositionMultiHeadedAttention::new(h, d, 0.1, DType::F32, &mut rng).unwrap();
        let plain = MultiHeadedAttention::new(h, d, 0.1, DType::F32, &mut rng).unwrap();
        move_layer(&rel, &dev);
        move_layer(&plain, &dev);
        let x = input_on(&[b, t, d], &dev, &mut rng);
        let pos = input_on(&[1, t, d], &dev, &mut rng);
        let mem = input_on(&[b, ts, d], &dev, &mut rng);
        let pad = AttentionMask::key_padding(&[t, 11], t).unwrap();
        let causal = AttentionMask::causal_padding(&[t, 7], t).unwrap();
        let src = AttentionMask::key_padding(&[ts, 5], ts).unwrap();
        let name = |s: &str| format!("{s} on {dev:?}");
        layer_compare(&name("rel-pos self-attention"), &rel, &[x.clone(), pos.clone()], seed, &|| rel.forward(&x, &x, &x, Some(&pad), &pos));
        layer_compare(&name("causal self-attention"), &plain, std::slice::from_ref(&x), seed, &|| plain.forward(&x, &x, &x, Some(&causal)));
        layer_compare(&name("cross attention"), &plain, &[x.clone(), mem.clone()], seed, &|| plain.forward(&x, &mem, &mem, Some(&src)));
    }
}

// ---- the tensor-core (wmma) kernels: f16 and bf16, d_k a multiple of 16 ----

use asrforge::backend::cuda::attention::{kernel_for, set_kernel_override, AttentionKernel};

/// The output then every gradient of the fused op on `dev` with kernel set
/// `k` forced on this thread.
/// `got` and `want` (output, then every gradient) hold the same values bit
/// for bit, and as many.
fn same_bits(what: &str, got: &[Vec<f64>], want: &[Vec<f64>], seed: u64) {
    assert_eq!(got.len(), want.len(), "{what}: results");
    for i in 0..want.len() {
        assert_eq!(got[i].len(), want[i].len(), "{what}: {} length (seed {seed})", label(i));
        let bad = got[i].iter().zip(&want[i]).position(|(a, b)| a.to_bits() != b.to_bits());
        assert!(bad.is_none(), "{what} {}: element {bad:?}, {:?}, differs from {:?} (seed {seed})", label(i), bad.map(|e| got[i][e]), bad.map(|e| want[i][e]));
    }
}

fn results_with(k: AttentionKernel, c: &Case, vals: &Vals, weights: &[f64], dtype: DType, dev: &Device, seed: u64) -> Vec<Vec<f64>> {
    set_kernel_override(Some(k));
    let r = results(&*fused(c, seed), vals, weights, dtype, dev);
    set_kernel_override(None);
    r
}

/// The wmma kernels' tolerance against the truth (the CPU op in f64 on the
/// same half inputs), per element relative to |truth| + rms(truth) as
/// everywhere here. u is the dtype's unit roundoff (2⁻¹¹ f16, 2⁻⁸ bf16;
/// `gpu::tol` is 2u: the result's one rounding plus as much again). Beyond
/// the scalar kernels' roundings, each product of the wmma kernels rounds
/// one operand to the dtype: k + p (scores), P (output), dS and P·Z
/// (gradients), independent relative errors of ≤ u (σ = u/√3) per term of
/// a sum in f32, so each sum's error is a random walk of about σ·√2 times
/// the terms' root-sum-square, itself about rms(result) as the terms have
/// random signs (dq's terms cancel: Σ_j dS_ij = 0 without dropout). The
/// score's error (u·|q|·|k + p|·scale ≈ u for unit inputs, same walk) moves
/// every P, dS of its row by as much again. Together σ ≈ 1.5-2u per
/// element, and the maximum over the up to 90k elements of a case lies
/// further out than a Gaussian's 4.5σ (the cancelling dq and the dropout
/// factors give heavier tails): measured over 18 runs of the cases below,
/// at most 9.7u = 4.87 × gpu::tol (gradient of q, bf16, the 70-key case;
/// typical run maxima 3-4 × gpu::tol), where the scalar kernels stay
/// within 0.6 × gpu::tol. The tolerance is that measured maximum with a
/// margin of 1.6: 16u = 8 × gpu::tol (an error of 1/8 of an f16 or bf16
/// mantissa step sized to the result's rms would still fail it).
fn wmma_tol(dt: DType) -> f64 {
    8.0 * gpu::tol(dt)
}

/// Every mask kind and positions (PB 1 and B) or none, dropout on and
/// off, d_k 64 and 128, T1/T2 not multiples of the tiles (64 query rows,
/// 32 keys) and ragged, and 4·5·2 = 40 query units (4·5·3 = 60 key
/// units), more than the capped grid of 37 blocks.
fn wmma_cases() -> Vec<Case> {
    let mut v = cases(64);
    v.extend([
        Case { pos: Some(2), lens: Some(vec![45, 30]), chunk: Some((8, -1)), dropout: 0.1, ..case(2, 45, 45, 2, 128) },
        Case { tensor_mask: true, ..case(2, 33, 70, 2, 128) },
        Case { lens: Some(vec![50, 3]), causal: true, ..case(2, 50, 50, 1, 128) },
        Case { pos: Some(1), lens: Some(vec![70, 41, 9, 1]), chunk: Some((8, 2)), dropout: 0.1, ..case(4, 70, 70, 5, 64) },
    ]);
    v
}

#[test]
fn attention_wmma_kernels_are_picked_for_half_and_multiples_of_16() {
    set_kernel_override(None);
    if std::env::var_os("ASRFORGE_ATTENTION_KERNEL").is_none() {
        for dt in [DType::F16, DType::BF16] {
            for d in [16, 32, 48, 64] {
                assert_eq!(kernel_for(dt, d), AttentionKernel::Wmma64, "{dt:?} d_k {d}: the 64-wide set");
            }
            for d in [80, 96, 112, 128] {
                assert_eq!(kernel_for(dt, d), AttentionKernel::Wmma, "{dt:?} d_k {d}: the 128-wide set");
            }
        }
    }
    for (dt, d) in [(DType::F32, 64), (DType::F64, 64), (DType::F16, 24), (DType::BF16, 8), (DType::F16, 144)] {
        assert_eq!(kernel_for(dt, d), AttentionKernel::Scalar, "{dt:?} d_k {d}");
    }
    set_kernel_override(Some(AttentionKernel::Scalar));
    assert_eq!(kernel_for(DType::F16, 64), AttentionKernel::Scalar);
    set_kernel_override(Some(AttentionKernel::Wmma));
    assert_eq!(kernel_for(DType::BF16, 64), AttentionKernel::Wmma, "forced, the 128-wide set runs a 64-wide head");
    assert_eq!(kernel_for(DType::F32, 64), AttentionKernel::Scalar);
    set_kernel_override(Some(AttentionKernel::Wmma64));
    assert_eq!(kernel_for(DType::F16, 64), AttentionKernel::Wmma64);
    assert_eq!(kernel_for(DType::F16, 80), AttentionKernel::Wmma, "a head wider than 64 falls back to the 128-wide set");
    assert_eq!(kernel_for(DType::F32, 64), AttentionKernel::Scalar);
    set_kernel_override(None);
}

/// The 64-wide wmma set (`attention_*_wmma64`, its fragments and shared
/// tiles sized for head dims up to 64) gives the 128-wide set's output and
/// every gradient bit for bit, f16 and bf16, on head dims 16 to 64 (fewer
/// 16-column fragments than either width holds) with every mask kind,
/// positions and dropout: only the registers and the shared tiles' row
/// stride differ.
#[test]
fn attention_wmma64_kernels_give_the_wmma_kernels_bits() {
    let Some(dev) = gpu("attention_wmma64_kernels_give_the_wmma_kernels_bits") else { return };
    let mut cs: Vec<Case> = wmma_cases().into_iter().filter(|c| c.d <= 64).collect();
    cs.push(Case { pos: Some(1), lens: Some(vec![40, 13]), chunk: Some((8, 1)), dropout: 0.1, ..case(2, 40, 40, 2, 16) });
    cs.push(Case { pos: Some(2), lens: Some(vec![33, 30]), dropout: 0.1, ..case(2, 33, 33, 3, 48) });
    cs.push(Case { lens: Some(vec![29, 5]), causal: true, ..case(2, 29, 29, 2, 32) });
    for c in cs {
        let seed = fresh_seed();
        for dt in [DType::F16, DType::BF16] {
            let (vals, weights) = inputs(&c, dt, seed);
            let narrow = results_with(AttentionKernel::Wmma64, &c, &vals, &weights, dt, &dev, seed);
            let wide = results_with(AttentionKernel::Wmma, &c, &vals, &weights, dt, &dev, seed);
            same_bits(&format!("{dt:?} {c:?}, the 64-wide set vs the 128-wide set's"), &narrow, &wide, seed);
        }
    }
}

/// The wmma kernels that run (the 64-wide set for head dims up to 64, the
/// 128-wide set above) against the truth (the CPU op in f64 on the same
/// half inputs) within `wmma_tol`, and against the scalar kernels on the
/// device within the sum of both kernels' tolerances, output and every
/// gradient.
#[test]
fn attention_wmma_kernels_match_the_cpu_op_and_the_scalar_kernels() {
    let Some(dev) = gpu("attention_wmma_kernels_match_the_cpu_op_and_the_scalar_kernels") else { return };
    let cpu = Device::Cpu;
    for c in wmma_cases() {
        let seed = fresh_seed();
        for dt in [DType::F16, DType::BF16] {
            let (vals, weights) = inputs(&c, dt, seed);
            let truth = results(&*fused(&c, seed), &vals, &weights, DType::F64, &cpu);
            let set = if c.d <= 64 { AttentionKernel::Wmma64 } else { AttentionKernel::Wmma };
            let wmma = results_with(set, &c, &vals, &weights, dt, &dev, seed);
            let scalar = results_with(AttentionKernel::Scalar, &c, &vals, &weights, dt, &dev, seed);
            for i in 0..truth.len() {
                let (ew, es) = (rel_err(&wmma[i], &truth[i]), rel_err(&scalar[i], &truth[i]));
                println!("{dt:?} d_k {} {set:?} {}: wmma error {ew:.3e} ({:.2} tol), scalar error {es:.3e}", c.d, label(i), ew / gpu::tol(dt));
                close(&format!("wmma vs f64 cpu op {dt:?} {c:?} {}", label(i)), &wmma[i], &truth[i], wmma_tol(dt), seed);
                close(&format!("wmma vs scalar kernel {dt:?} {c:?} {}", label(i)), &wmma[i], &scalar[i], wmma_tol(dt) + kernel_tol(dt), seed);
            }
        }
    }
}

// ---- packed operands: q, k, v as column blocks of one projection ----

/// The fused op with q, k and v packed into one (B, T, 3·H·d) projection
/// (`qkv`, self-attention: T1 = T2) or k and v into one (B, T2, 2·H·d)
/// (`kv`), from the same dense inputs as [`fused`]: the concatenation's
/// backward hands each block's gradient back to q, k, v.
fn packed(c: &Case, seed: u64, qkv: bool) -> Rc<OpFn> {
    let (c, m) = (c.clone(), c.flash_mask(seed));
    Rc::new(move |x: &[Tensor]| {
        rng::manual_seed(seed);
        let pos = c.pos.map(|_| RelPos { p: &x[3], u: &x[4], vb: &x[5] });
        let flat = |t: &Tensor| ops::reshape(t, [t.dims()[0], t.dims()[1], c.h * c.d]);
        if qkv {
            let all = ops::cat(&[&flat(&x[0])?, &flat(&x[1])?, &flat(&x[2])?], 2)?;
            ops::flash_attention_qkv(&all, c.h, pos, &m, c.dropout, c.dropout > 0.0)
        } else {
            let kv = ops::cat(&[&flat(&x[1])?, &flat(&x[2])?], 2)?;
            ops::flash_attention_q_kv(&x[0], &kv, pos, &m, c.dropout, c.dropout > 0.0)
        }
    })
}

/// The packed ops read and write the same numbers as the dense op: the
/// output and every gradient bit for bit, on the CPU (the narrows) and on
/// the GPU (the kernels in place, each kernel set, f32, f16 and bf16).
#[test]
fn packed_qkv_and_kv_operands_give_the_dense_op_bit_for_bit() {
    let mut runs = vec![(Device::Cpu, DType::F64, None), (Device::Cpu, DType::F32, None)];
    if let Some(dev) = gpu("packed_qkv_and_kv_operands_give_the_dense_op_bit_for_bit") {
        runs.push((dev.clone(), DType::F32, Some(AttentionKernel::Scalar)));
        for dt in [DType::F16, DType::BF16] {
            for k in [AttentionKernel::Scalar, AttentionKernel::Wmma64, AttentionKernel::Wmma] {
                runs.push((dev.clone(), dt, Some(k)));
            }
        }
    }
    let mut cs = cases(16);
    cs.push(Case { pos: Some(1), lens: Some(vec![70, 41]), dropout: 0.1, ..case(2, 70, 70, 3, 32) });
    for c in cs {
        let seed = fresh_seed();
        for (dev, dt, k) in &runs {
            set_kernel_override(*k);
            let (vals, weights) = inputs(&c, *dt, seed);
            let dense = results(&*fused(&c, seed), &vals, &weights, *dt, dev);
            let mut packings = vec![false];
            if c.t1 == c.t2 {
                packings.push(true);
            }
            for qkv in packings {
                let got = results(&*packed(&c, seed, qkv), &vals, &weights, *dt, dev);
                same_bits(&format!("{} {dev:?} {dt:?} {k:?} {c:?} vs the dense op's", if qkv { "qkv" } else { "kv" }), &got, &dense, seed);
            }
        }
        set_kernel_override(None);
    }
}

#[test]
fn packed_operands_are_checked() {
    let cpu = Device::Cpu;
    let x = |s: &[usize]| Tensor::zeros(s, DType::F32, &cpu).unwrap();
    let m = FlashMask::default();
    // 3·H·d_k must divide the width.
    let err = ops::flash_attention_qkv(&x(&[2, 5, 20]), 3, None, &m, 0.0, false).unwrap_err().to_string();
    assert!(err.contains("qkv") && err.contains("3·3·d_k"), "{err}");
    let err = ops::flash_attention_qkv(&x(&[2, 5, 3, 4]), 1, None, &m, 0.0, false).unwrap_err().to_string();
    assert!(err.contains("(B, T, 3·1·d_k)"), "{err}");
    // kv: 2·H·d_k columns and q's batch.
    let err = ops::flash_attention_q_kv(&x(&[2, 5, 2, 4]), &x(&[2, 7, 8]), None, &m, 0.0, false).unwrap_err().to_string();
    assert!(err.contains("kv") && err.contains("(2, T2, 16)"), "{err}");
    let err = ops::flash_attention_q_kv(&x(&[2, 5, 2, 4]), &x(&[3, 7, 16]), None, &m, 0.0, false).unwrap_err().to_string();
    assert!(err.contains("(2, T2, 16)"), "{err}");
    assert_eq!(ops::flash_attention_q_kv(&x(&[2, 5, 2, 4]), &x(&[2, 7, 16]), None, &m, 0.0, false).unwrap().dims(), &[2, 5, 2, 4]);
    assert_eq!(ops::flash_attention_qkv(&x(&[2, 5, 24]), 2, None, &m, 0.0, false).unwrap().dims(), &[2, 5, 2, 4]);
}
