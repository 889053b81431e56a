//! The nn-family CUDA kernels (softmax, norm, conv, index, layout, dropout)
//! against the CPU ops on fresh random inputs, forward and backward, through
//! the harness of `common::gpu` (tolerance per dtype, per element with the
//! tensor's RMS as the floor; poisoned outputs; NaN or inf never passes;
//! the grid capped so grid-stride loops wrap); f16/bf16 copies exact. Row
//! lengths that are not multiples of 32, shorter than half a block, between
//! half a block and a block (200) and longer than a block (300, 1000, 4097),
//! and more rows than the capped grid. Dropout masks equal the CPU's bit for
//! bit. Without a GPU every test says why it skips.

mod common;

use asrforge::ops::{self, BatchNormState};
use asrforge::tensor::{rng, Rng};
use asrforge::{DType, Device, Error, Result, Tensor};
use common::gpu::{self, assert_close as close, gpu};
use common::{draw, fresh_seed, run_with_grads, Kind, Kind::*, OpFn};

/// One input: shape, how to draw it, whether it is differentiated.
type Input = (&'static [usize], Kind, bool);

/// Runs `f` on the CPU and on `dev` in `dtype` with the same fresh inputs and
/// compares the output and every input gradient.
fn compare(name: &str, dev: &Device, dtype: DType, tol: f64, inputs: &[Input], f: &OpFn) {
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    let vals: Vec<(Vec<f64>, Vec<usize>)> = inputs.iter().map(|(s, k, _)| (draw(&mut rng, s, *k), s.to_vec())).collect();
    // Round the inputs to the dtype once, so both devices see the same numbers.
    let vals: Vec<(Vec<f64>, Vec<usize>)> = vals.into_iter().map(|(v, s)| (common::tensor(&v, &s, dtype, &Device::Cpu).to_f64_vec().unwrap(), s)).collect();
    let mask: Vec<bool> = inputs.iter().map(|i| i.2).collect();
    let n_out = asrforge::autograd::no_grad(|| f(&vals.iter().map(|(v, s)| common::tensor(v, s, dtype, &Device::Cpu)).collect::<Vec<_>>()))
        .expect("cpu forward")
        .elem_count();
    let r = rng.normal(n_out.max(1));
    let (out_c, grads_c) = run_with_grads(f, &vals, &mask, &r, dtype, &Device::Cpu);
    let (out_g, grads_g) = run_with_grads(f, &vals, &mask, &r, dtype, dev);
    close(&format!("{name} {dtype:?} output"), &out_g, &out_c, tol, seed);
    for (i, (g, c)) in grads_g.iter().zip(&grads_c).enumerate() {
        if let (Some(g), Some(c)) = (g, c) {
            close(&format!("{name} {dtype:?} gradient of input {i}"), g, c, tol, seed);
        }
    }
}

/// `compare` in f32 and f64 at the harness's tolerances.
fn both(name: &str, dev: &Device, inputs: &[Input], f: &OpFn) {
    compare(name, dev, DType::F32, gpu::F32, inputs, f);
    compare(name, dev, DType::F64, gpu::F64, inputs, f);
}

fn ids_on_cpu(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape.to_vec(), &Device::Cpu).unwrap()
}

fn u8s(v: Vec<u8>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(v, shape.to_vec(), &Device::Cpu).unwrap()
}

/// `n` indices in `0..bound` from a fixed generator (repeats included).
fn some_ids(n: usize, bound: usize, seed: u64) -> Vec<i64> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| r.below(bound) as i64).collect()
}

/// A 0/1 mask of `n` elements from a fixed generator.
fn some_mask(n: usize, seed: u64) -> Vec<u8> {
    Rng::new(seed).uniform(n).into_iter().map(|u| (u < 0.4) as u8).collect()
}

// ---- softmax ----

#[test]
fn softmax_and_log_softmax_match_the_cpu() {
    let Some(dev) = gpu("softmax_and_log_softmax_match_the_cpu") else { return };
    // Rows of 1 and 7, of 200 (between half a block and a block), 300 (past
    // a block, not a multiple of 32), 1000 and 1024 (a warp per row), 1025
    // and 4097 (a block per row); 67 and 41 rows outnumber the capped grid
    // of blocks, 300 rows its warps (37 blocks of 8), so the row loops wrap.
    let shapes: [&'static [usize]; 9] = [&[3, 1], &[5, 7], &[300, 33], &[67, 200], &[41, 300], &[2, 1000], &[3, 1024], &[41, 1025], &[3, 4097]];
    for s in shapes {
        both(&format!("softmax {s:?}"), &dev, &[(s, Normal, true)], &move |x| ops::softmax(&x[0]));
        both(&format!("log_softmax {s:?}"), &dev, &[(s, Normal, true)], &move |x| ops::log_softmax(&x[0]));
        // Half activations: read and written in half, summed in f32. The
        // backward reads the half-rounded forward output y, whose rounding
        // (half an ulp) enters every gradient element times (g − Σg·y), on
        // top of the gradient's own rounding: results may sit two ulps from
        // the reference, so the bound is two of the dtype's tolerance (one
        // ulp) — at one, f16 failed about one seed in twelve at 1.003×.
        for dt in [DType::F16, DType::BF16] {
            compare(&format!("softmax {s:?}"), &dev, dt, 2.0 * gpu::tol(dt), &[(s, Normal, true)], &move |x| ops::softmax(&x[0]));
            compare(&format!("log_softmax {s:?}"), &dev, dt, 2.0 * gpu::tol(dt), &[(s, Normal, true)], &move |x| ops::log_softmax(&x[0]));
        }
    }
}

#[test]
fn softmax_of_large_logits_is_stable_on_the_gpu() {
    let Some(dev) = gpu("softmax_of_large_logits_is_stable_on_the_gpu") else { return };
    // exp(1000) overflows without the max subtraction; the answer is [0, 1/2, 1/2].
    let x = Tensor::from_vec(vec![0.0f32, 1000.0, 1000.0], [1, 3], &Device::Cpu).unwrap().to_device(&dev).unwrap();
    let y = ops::softmax(&x).unwrap().to_f64_vec().unwrap();
    close("softmax of large logits", &y, &[0.0, 0.5, 0.5], 1e-7, 0);
}

/// A (B, 1, T1 or 1, T2) attention mask with random masked keys and, for
/// T1 > 1, the first query row of the first sequence fully masked.
fn attention_mask(b: usize, t1: usize, t2: usize, seed: u64) -> (Vec<u8>, Vec<usize>) {
    let mut m = some_mask(b * t1 * t2, seed);
    if t1 > 1 {
        m[..t2].iter_mut().for_each(|v| *v = 1);
    }
    (m, vec![b, 1, t1, t2])
}

#[test]
fn masked_softmax_matches_the_cpu() {
    let Some(dev) = gpu("masked_softmax_matches_the_cpu") else { return };
    // Scores (B, H, T1, T2) under a key-padding mask (B, 1, 1, T2) and a
    // per-query mask (B, 1, T1, T2) with a fully masked row; rows of 7, 200
    // and 1024 (a warp per row; 2*8*20 = 320 rows wrap the capped grid's
    // warps) and 1025 and 3000 (a block per row; 41 rows wrap its blocks).
    let cases: [(&'static [usize], bool); 7] = [
        (&[2, 3, 5, 7], false),
        (&[2, 3, 5, 7], true),
        (&[2, 8, 20, 200], true),
        (&[2, 8, 20, 200], false),
        (&[1, 2, 3, 1024], true),
        (&[1, 41, 1, 1025], false),
        (&[2, 1, 3, 3000], true),
    ];
    for (i, (s, per_query)) in cases.into_iter().enumerate() {
        let (m, ms) = attention_mask(s[0], if per_query { s[2] } else { 1 }, s[3], 40 + i as u64);
        let (mc, mg) = (m.clone(), u8s(m.clone(), &ms).to_device(&dev).unwrap());
        let f = move |x: &[Tensor]| {
            // The mask on the scores' device (the host copy path is the one attention's masks may take too).
            let mask = if x[0].device() == Device::Cpu { u8s(mc.clone(), &ms) } else { mg.clone() };
            ops::masked_softmax(&x[0], &mask)
        };
        both(&format!("masked_softmax {s:?} per query {per_query}"), &dev, &[(s, Normal, true)], &f);
        // Half: two roundings apart. The backward reads each device's own
        // half output y, and the f32 values the two devices round to y
        // differ in the last f32 bits (sum order), so where they straddle a
        // half rounding boundary y differs by one half ulp (about one in
        // 2^13 elements, several per case at these sizes); gx ∝ y then
        // differs by that ulp plus its own rounding: up to two of the
        // harness's one-rounding tolerance.
        for dt in [DType::F16, DType::BF16] {
            compare(&format!("masked_softmax {s:?} per query {per_query}"), &dev, dt, 2.0 * gpu::tol(dt), &[(s, Normal, true)], &f);
        }
    }
    // A mask left on the host is copied to the GPU.
    let (m, ms) = attention_mask(2, 1, 9, 50);
    both("masked_softmax host mask", &dev, &[(&[2, 2, 4, 9], Normal, true)], &move |x| ops::masked_softmax(&x[0], &u8s(m.clone(), &ms)));
}

/// The definition, on the CPU and the GPU: masked_fill(−1e30), softmax,
/// masked_fill(0), in f64; a fully masked row is zeros, never NaN.
#[test]
fn masked_softmax_is_its_definition() {
    let mut devs = vec![Device::Cpu];
    devs.extend(gpu("masked_softmax_is_its_definition"));
    let seed = fresh_seed();
    let mut r = Rng::new(seed);
    for dev in devs {
        for (s, t1) in [([2usize, 3, 4, 9], 4usize), ([2, 3, 4, 300], 1), ([1, 2, 2, 1500], 2)] {
            let (m, ms) = attention_mask(s[0], t1, s[3], seed ^ 7);
            let x = Tensor::from_vec(r.normal(s.iter().product()), s, &Device::Cpu).unwrap().to_device(&dev).unwrap();
            let mask = u8s(m, &ms);
            let got = ops::masked_softmax(&x, &mask).unwrap().to_f64_vec().unwrap();
            let want = ops::masked_fill(&ops::softmax(&ops::masked_fill(&x, &mask, -1e30).unwrap()).unwrap(), &mask, 0.0).unwrap().to_f64_vec().unwrap();
            close(&format!("masked_softmax {s:?} on {dev:?}"), &got, &want, 1e-12, seed);
            if t1 > 1 {
                assert!(got[..s[3]].iter().all(|&v| v == 0.0), "a fully masked row is zeros on {dev:?}");
            }
        }
    }
}

// ---- norms ----

#[test]
fn layer_norm_matches_the_cpu() {
    let Some(dev) = gpu("layer_norm_matches_the_cpu") else { return };
    // Rows of 1 (zero variance), 7, 1000 and 4097; 300 rows spans several
    // chunks of the weight/bias column sums.
    // and 67 rows of 200 (between half a block and a block) wrap the capped grid.
    // Rows of 1024 and 1025 straddle the warp-per-row limit; 2400 rows of 5
    // (a warp per row) and of 1025 (a block per row) outnumber the capped
    // grid's chunks of the backward (37 of 64 rows), so its chunk loop wraps.
    let cases: [(&'static [usize], &'static [usize]); 10] = [
        (&[3, 1], &[1]),
        (&[300, 7], &[7]),
        (&[2400, 5], &[5]),
        (&[67, 200], &[200]),
        (&[2, 3, 1000], &[1000]),
        (&[3, 1024], &[1024]),
        (&[3, 1025], &[1025]),
        (&[2400, 1025], &[1025]),
        (&[2, 4097], &[4097]),
        (&[129, 64], &[64]),
    ];
    for (x, p) in cases {
        both(&format!("layer_norm affine {x:?}"), &dev, &[(x, Normal, true), (p, Normal, true), (p, Normal, true)], &move |t| {
            ops::layer_norm(&t[0], Some(&t[1]), Some(&t[2]), 1e-5)
        });
        both(&format!("layer_norm plain {x:?}"), &dev, &[(x, Normal, true)], &move |t| ops::layer_norm(&t[0], None, None, 1e-5));
    }
}

/// Layer norm of half activations (autocast): x, y and gx in f16/bf16, the
/// weight and bias in f32 (cast inside the op so the harness's one dtype
/// draws them), statistics and sums in f32, against the CPU's f32 reference.
#[test]
fn half_layer_norm_matches_the_cpu() {
    let Some(dev) = gpu("half_layer_norm_matches_the_cpu") else { return };
    let cases: [(&'static [usize], &'static [usize]); 5] =
        [(&[300, 7], &[7]), (&[67, 200], &[200]), (&[2, 3, 1000], &[1000]), (&[129, 256], &[256]), (&[5, 1500], &[1500])];
    for dt in [DType::F16, DType::BF16] {
        for (x, p) in cases {
            compare(&format!("half layer_norm affine {x:?}"), &dev, dt, gpu::tol(dt), &[(x, Normal, true), (p, Normal, true), (p, Normal, true)], &move |t| {
                let f32 = |v: &Tensor| ops::to_dtype(v, DType::F32);
                ops::layer_norm(&t[0], Some(&f32(&t[1])?), Some(&f32(&t[2])?), 1e-5)
            });
            compare(&format!("half layer_norm plain {x:?}"), &dev, dt, gpu::tol(dt), &[(x, Normal, true)], &move |t| {
                let y = ops::layer_norm(&t[0], None, None, 1e-5)?;
                if y.dtype() != t[0].dtype() {
                    return Err(Error::invalid("test", format!("expected a {:?} output, got {:?}", t[0].dtype(), y.dtype())));
                }
                Ok(y)
            });
        }
    }
}

/// `add_layer_norm` (the residual add fused with the next norm) on the GPU
/// against the CPU's composition `add_scaled` then `layer_norm`: outputs
/// `s` and `h` both used (so the backward adds the gradient that reached `s`
/// directly), only `h`, and only `s`; with and without the affine
/// parameters (no gradient reaches them when only `s` is used); alpha 1 and the macaron ½; rows across the warp-per-row
/// limit (1024/1025) and more rows than the capped grid.
#[test]
fn add_layer_norm_matches_the_cpu() {
    let Some(dev) = gpu("add_layer_norm_matches_the_cpu") else { return };
    let cases: [(&'static [usize], &'static [usize]); 7] =
        [(&[3, 1], &[1]), (&[300, 7], &[7]), (&[2400, 5], &[5]), (&[2, 3, 256], &[256]), (&[3, 1024], &[1024]), (&[41, 1025], &[1025]), (&[2, 4097], &[4097])];
    // Both outputs, weighed through one concatenation.
    let both_out = |s: Tensor, h: Tensor| ops::cat(&[&s, &h], 0);
    for (x, p) in cases {
        for alpha in [1.0, 0.5] {
            let name = format!("add_layer_norm {x:?} alpha {alpha}");
            both(&format!("{name} affine, s and h"), &dev, &[(x, Normal, true), (x, Normal, true), (p, Normal, true), (p, Normal, true)], &move |t| {
                let (s, h) = ops::add_layer_norm(&t[0], &t[1], alpha, 0.0, Some(&t[2]), Some(&t[3]), 1e-5)?;
                both_out(s, h)
            });
            both(&format!("{name} plain, h only"), &dev, &[(x, Normal, true), (x, Normal, true)], &move |t| {
                Ok(ops::add_layer_norm(&t[0], &t[1], alpha, 0.0, None, None, 1e-5)?.1)
            });
            both(&format!("{name} affine, s only"), &dev, &[(x, Normal, true), (x, Normal, true), (p, Normal, false), (p, Normal, false)], &move |t| {
                Ok(ops::add_layer_norm(&t[0], &t[1], alpha, 0.0, Some(&t[2]), Some(&t[3]), 1e-5)?.0)
            });
            for dt in [DType::F16, DType::BF16] {
                compare(
                    &format!("half {name} affine, s and h"),
                    &dev,
                    dt,
                    gpu::tol(dt),
                    &[(x, Normal, true), (x, Normal, true), (p, Normal, true), (p, Normal, true)],
                    &move |t| {
                        let f32 = |v: &Tensor| ops::to_dtype(v, DType::F32);
                        let (w, b) = (f32(&t[2])?, f32(&t[3])?);
                        if t[0].device() != Device::Cpu {
                            let (s, h) = ops::add_layer_norm(&t[0], &t[1], alpha, 0.0, Some(&w), Some(&b), 1e-5)?;
                            return both_out(s, h);
                        }
                        // The CPU has no half arithmetic: the sum in f32,
                        // rounded to the dtype as stored (its value only:
                        // `sr`, the gradient passing it unrounded),
                        // normalised in f32 and rounded once, as the kernel
                        // does. The two gradients of the sum meet in f32 and
                        // are rounded once, as the kernel rounds them: a
                        // reference whose norm backward rounds to half first
                        // (the CPU's half layer norm) was 1.08 x the
                        // tolerance off in x's f16 gradient where the two
                        // cancel (0.5605 against 0.5625 from terms in [2, 4),
                        // whose half ulp is 0.002; seed 1796613447210782314).
                        let dt = t[0].dtype();
                        let s32 = ops::add_scaled(&f32(&t[0])?, &f32(&t[1])?, alpha)?;
                        let rounding = ops::sub(&f32(&ops::to_dtype(&s32, dt)?)?, &s32)?.detach();
                        let sr = ops::add(&s32, &rounding)?;
                        let h = ops::to_dtype(&ops::layer_norm(&sr, Some(&w), Some(&b), 1e-5)?, dt)?;
                        both_out(ops::to_dtype(&sr, dt)?, h)
                    },
                );
            }
        }
    }
}

/// `add_layer_norm` with the residual branch's dropout folded in, on the GPU
/// (the mask drawn inside the norm kernels) against the CPU's composition
/// `add_scaled(x, dropout(y))` then `layer_norm` from the same generator
/// state: outputs and every gradient (the branch's is alpha·mask·gx, written
/// also for alpha 1), with s and h used, h only and s only (the backward's
/// own dropout of alpha·gs); rows whose length is not a multiple of 4 (the
/// Philox blocks straddle rows), the block path (1025), and p = 1. Each case
/// also runs as `add_layer_norm_masked` with two rows in five of the branch
/// zeroed (a module's padded frames), against `masked_fill` first in the
/// composition: the branch's gradient is then 0 on those rows, written also
/// for alpha 1 without dropout (p = 0).
#[test]
fn add_layer_norm_with_dropout_matches_the_cpu() {
    let Some(dev) = gpu("add_layer_norm_with_dropout_matches_the_cpu") else { return };
    let cases: [(&'static [usize], &'static [usize], f64); 7] = [
        (&[300, 7], &[7], 0.3),
        (&[2, 3, 256], &[256], 0.1),
        (&[41, 1025], &[1025], 0.3),
        (&[2400, 5], &[5], 0.5),
        (&[3, 9], &[9], 1.0),
        (&[3, 11, 7], &[7], 0.0),
        (&[2, 5, 1025], &[1025], 0.0),
    ];
    let both_out = |s: Tensor, h: Tensor| ops::cat(&[&s, &h], 0);
    for (x, pr, p) in cases {
        let seed = fresh_seed();
        for masked in [false, true] {
            // x's shape with the last dim 1, rows 1 and 3 of every 5 marked, on t's device.
            let rows = move |t: &Tensor| -> Result<Option<Tensor>> {
                if !masked {
                    return Ok(None);
                }
                let mut shape = x.to_vec();
                let n = shape.pop().unwrap_or(1);
                let bits: Vec<u8> = (0..t.elem_count() / n).map(|r| u8::from(r % 5 == 1 || r % 5 == 3)).collect();
                shape.push(1);
                Tensor::from_vec(bits, shape, &Device::Cpu)?.to_device(&t.device()).map(Some)
            };
            if p == 0.0 && !masked {
                continue;
            }
            for alpha in [1.0, 0.5] {
                let name = format!("add_layer_norm {x:?} alpha {alpha} dropout {p} row mask {masked}");
                both(&format!("{name} affine, s and h"), &dev, &[(x, Normal, true), (x, Normal, true), (pr, Normal, true), (pr, Normal, true)], &move |t| {
                    rng::manual_seed(seed);
                    let (s, h) = ops::add_layer_norm_masked(&t[0], &t[1], rows(&t[0])?.as_ref(), alpha, p, Some(&t[2]), Some(&t[3]), 1e-5)?;
                    both_out(s, h)
                });
                both(&format!("{name} plain, h only"), &dev, &[(x, Normal, true), (x, Normal, true)], &move |t| {
                    rng::manual_seed(seed);
                    Ok(ops::add_layer_norm_masked(&t[0], &t[1], rows(&t[0])?.as_ref(), alpha, p, None, None, 1e-5)?.1)
                });
                both(&format!("{name} affine, s only"), &dev, &[(x, Normal, true), (x, Normal, true), (pr, Normal, false), (pr, Normal, false)], &move |t| {
                    rng::manual_seed(seed);
                    Ok(ops::add_layer_norm_masked(&t[0], &t[1], rows(&t[0])?.as_ref(), alpha, p, Some(&t[2]), Some(&t[3]), 1e-5)?.0)
                });
                for dt in [DType::F16, DType::BF16] {
                    compare(
                        &format!("half {name} affine, s and h"),
                        &dev,
                        dt,
                        gpu::tol(dt),
                        &[(x, Normal, true), (x, Normal, true), (pr, Normal, true), (pr, Normal, true)],
                        &move |t| {
                            rng::manual_seed(seed);
                            let f32 = |v: &Tensor| ops::to_dtype(v, DType::F32);
                            let (w, b) = (f32(&t[2])?, f32(&t[3])?);
                            let m = rows(&t[0])?;
                            if t[0].device() != Device::Cpu {
                                let (s, h) = ops::add_layer_norm_masked(&t[0], &t[1], m.as_ref(), alpha, p, Some(&w), Some(&b), 1e-5)?;
                                return both_out(s, h);
                            }
                            // The CPU, rounding where the kernel rounds: the
                            // branch masked, times the dropout's mask (its
                            // scale rounded to the dtype: dropout of ones in
                            // the dtype, the same draws) in f32 and rounded
                            // to the dtype as stored, the sum in f32 rounded
                            // as stored, normalised in f32 and rounded once.
                            // Each rounding is of the value only (a detached
                            // term), so the gradients meet in f32 and are
                            // rounded once where they reach the half inputs,
                            // as the kernel writes them. (A reference that
                            // rounded s's two gradients to half before the
                            // mask's scale needed 2x the tolerance.)
                            let dt = t[0].dtype();
                            let round = |v: &Tensor| -> Result<Tensor> { ops::add(v, &ops::sub(&f32(&ops::to_dtype(v, dt)?)?, v)?.detach()) };
                            let y32 = match &m {
                                Some(m) => ops::masked_fill(&f32(&t[1])?, m, 0.0)?,
                                None => f32(&t[1])?,
                            };
                            let ones = Tensor::from_vec(vec![1.0f32; y32.elem_count()], y32.dims().to_vec(), &Device::Cpu)?;
                            let keep = f32(&ops::dropout(&ops::to_dtype(&ones, dt)?, p, true)?)?.detach();
                            let yd = round(&ops::mul(&y32, &keep)?)?;
                            let sr = round(&ops::add_scaled(&f32(&t[0])?, &yd, alpha)?)?;
                            let h = ops::to_dtype(&ops::layer_norm(&sr, Some(&w), Some(&b), 1e-5)?, dt)?;
                            both_out(ops::to_dtype(&sr, dt)?, h)
                        },
                    );
                }
            }
        }
    }
}

/// The generator moves by the branch's element count whether the dropout
/// is folded into `add_layer_norm` or not, and the kept elements are those
/// `ops::dropout` keeps: s − x is alpha·dropout(y) exactly (f64).
#[test]
fn add_layer_norm_dropout_draws_the_words_ops_dropout_draws() {
    let Some(dev) = gpu("add_layer_norm_dropout_draws_the_words_ops_dropout_draws") else { return };
    let seed = fresh_seed();
    let mut r = Rng::new(seed);
    let (n, c) = (37, 11);
    let xv = r.normal(n * c);
    let yv = r.normal(n * c);
    let x = common::tensor(&xv, &[n, c], DType::F64, &Device::Cpu).to_device(&dev).unwrap();
    let y = common::tensor(&yv, &[n, c], DType::F64, &Device::Cpu).to_device(&dev).unwrap();
    rng::manual_seed(seed);
    let (s, _) = ops::add_layer_norm(&x, &y, 0.5, 0.25, None, None, 1e-5).unwrap();
    let after_fused = rng::with_default(|g| g.offset);
    rng::manual_seed(seed);
    let yd = ops::dropout(&y, 0.25, true).unwrap().to_f64_vec().unwrap();
    assert_eq!(rng::with_default(|g| g.offset), after_fused, "the same words reserved (seed {seed})");
    let s = s.to_f64_vec().unwrap();
    let dropped = yd.iter().filter(|&&v| v == 0.0).count();
    assert!(dropped > 0 && dropped < n * c, "some dropped, some kept: {dropped} of {} (seed {seed})", n * c);
    for i in 0..n * c {
        assert_eq!(s[i], xv[i] + 0.5 * yd[i], "element {i} (seed {seed})");
    }
}

/// A fused dropout op's (output, input gradient, generator offset after)
/// against its composition's on the same device: the same bits, the
/// generator moved the same.
fn assert_same_draw_and_bits(what: &str, fused: &(Vec<f64>, Vec<f64>, u64), composed: &(Vec<f64>, Vec<f64>, u64), seed: u64) {
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&fused.0), bits(&composed.0), "{what}: the output (seed {seed})");
    assert_eq!(bits(&fused.1), bits(&composed.1), "{what}: the gradient (seed {seed})");
    assert_eq!(fused.2, composed.2, "{what}: the generator moved the same (seed {seed})");
}

/// The feed-forward block's activation fused with its dropout
/// (`ops::activation_dropout`, one launch each way) is the composition
/// `dropout(f(x))` on the same device bit for bit (output and gradient, the
/// generator moved the same), and the CPU's composition within the dtype's
/// tolerance (half inputs: its f32 composition): relu, silu, gelu and tanh, every float dtype, sizes that are
/// not a multiple of the Philox block of 4, p = 1.
#[test]
fn activation_dropout_is_the_composition_bit_for_bit() {
    use asrforge::backend::cpu::elementwise::Unary;
    let Some(dev) = gpu("activation_dropout_is_the_composition_bit_for_bit") else { return };
    let seed = fresh_seed();
    let mut r = Rng::new(seed);
    for (n, p) in [(4099, 0.3), (7, 0.5), (10, 1.0)] {
        let xv = r.normal(n);
        let gv = r.normal(n);
        for f in [Unary::Relu, Unary::Silu, Unary::Gelu, Unary::Tanh] {
            for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
                let what = format!("{} n {n} p {p} {dt:?}", f.name());
                // (output, input gradient, generator offset after) of the fused op on dev and the compositions on dev and the CPU.
                // The CPU computes half inputs in f32 (from the half-rounded values).
                let round = |v: &[f64]| common::tensor(v, &[n], dt, &Device::Cpu).to_f64_vec().unwrap();
                let (xr, gr) = (round(&xv), round(&gv));
                let run = |d: &Device, fused: bool| {
                    let t = if *d == Device::Cpu && matches!(dt, DType::F16 | DType::BF16) { DType::F32 } else { dt };
                    let x = common::tensor(&xr, &[n], t, &Device::Cpu).to_device(d).unwrap().requires_grad_();
                    let g = common::tensor(&gr, &[n], t, &Device::Cpu).to_device(d).unwrap();
                    rng::manual_seed(seed);
                    let y = if fused {
                        ops::activation_dropout(&x, f, p, true).unwrap()
                    } else {
                        let h = match f {
                            Unary::Relu => ops::relu(&x),
                            Unary::Silu => ops::silu(&x),
                            Unary::Gelu => ops::gelu(&x),
                            _ => ops::tanh(&x),
                        };
                        ops::dropout(&h.unwrap(), p, true).unwrap()
                    };
                    let after = rng::with_default(|g| g.offset);
                    asrforge::autograd::backward_with(&[(y.clone(), g)]).unwrap();
                    (y.to_f64_vec().unwrap(), x.grad().unwrap().to_f64_vec().unwrap(), after)
                };
                let fused = run(&dev, true);
                assert_same_draw_and_bits(&what, &fused, &run(&dev, false), seed);
                let cpu = run(&Device::Cpu, true);
                let (tol, floor) = (out_tol(dt), subnormal_floor(dt, out_tol(dt)));
                gpu::assert_close_floor(&format!("{what} output against the CPU"), &fused.0, &cpu.0, tol, floor, seed);
                // Half tanh's derivative 1 − y² reads y rounded to half (as
                // the unfused kernels store it), which cancels near |y| = 1:
                // the f32 CPU is no reference there; the bit equality with
                // the GPU composition above is the check.
                if !(f == Unary::Tanh && matches!(dt, DType::F16 | DType::BF16)) {
                    gpu::assert_close_floor(&format!("{what} gradient against the CPU"), &fused.1, &cpu.1, tol, floor, seed);
                }
                if p < 1.0 && n > 1000 {
                    let kept = fused.0.iter().filter(|v| **v != 0.0).count();
                    assert!(kept > n / 4 && kept < n, "{what}: some elements kept, some dropped: {kept} (seed {seed})");
                } else if p == 1.0 {
                    assert!(fused.0.iter().chain(&fused.1).all(|v| *v == 0.0), "{what}: p = 1 drops everything (seed {seed})");
                }
            }
        }
    }
}

/// The (input, output) dtypes of the positional-encoding kernels: each
/// float type to itself, and f32 to the two half types (autocast).
const POS_ENC_DTYPES: [(DType, DType); 6] = [
    (DType::F32, DType::F32),
    (DType::F64, DType::F64),
    (DType::F16, DType::F16),
    (DType::BF16, DType::BF16),
    (DType::F32, DType::F16),
    (DType::F32, DType::BF16),
];

/// The harness's tolerance for a result of dtype `dt` against the CPU.
/// The floor under which a comparison of `dt` results with tolerance
/// `tol` would ask for more than the type holds: f16 spaces its subnormals
/// (below 2^-14) 2^-24 apart, so a result there is only within half of
/// that, 2^-25, of the exact value (seen: a 7-element silu gradient whose
/// kept values were all about 1.1e-5, 2.5e-8 from the f32 reference). The
/// other types' subnormals lie far below anything these tests compare.
fn subnormal_floor(dt: DType, tol: f64) -> f64 {
    if dt == DType::F16 {
        2f64.powi(-25) / tol
    } else {
        0.0
    }
}

fn out_tol(dt: DType) -> f64 {
    match dt {
        DType::F64 => gpu::F64,
        DType::F32 => gpu::F32,
        h => gpu::tol(h),
    }
}

/// The positional encoding fused with its dropout (`ops::pos_enc_dropout`,
/// one launch each way) is the composition `dropout(cast(x·s + pe[off..]))`
/// on the same device bit for bit (output, input gradient, the generator
/// moved the same), and the CPU's composition within the output dtype's
/// tolerance (half inputs: its f32 composition): each float type to itself
/// and f32 to f16/bf16 (autocast), with and without the table at an offset,
/// sizes that are not a multiple of the Philox block of 4, p = 1, and
/// eval (no dropout: scale, rows and cast only).
#[test]
fn pos_enc_dropout_is_the_composition_bit_for_bit() {
    let Some(dev) = gpu("pos_enc_dropout_is_the_composition_bit_for_bit") else { return };
    let seed = fresh_seed();
    let mut r = Rng::new(seed);
    for (b, t, d, off, p, training) in [(2, 7, 6, 3, 0.3, true), (3, 5, 9, 0, 0.5, true), (1, 3, 5, 1, 1.0, true), (2, 4, 3, 2, 0.3, false)] {
        let n = b * t * d;
        let max_len = off + t + 2;
        let (xv, pv) = (r.normal(n), r.normal(max_len * d));
        let s = (d as f64).sqrt() * 1.5;
        for (xdt, out) in POS_ENC_DTYPES {
            for with_table in [true, false] {
                let what = format!("({b}, {t}, {d}) offset {off} p {p} training {training} {xdt:?} to {out:?} table {with_table}");
                let round = |v: &[f64]| common::tensor(v, &[v.len()], xdt, &Device::Cpu).to_f64_vec().unwrap();
                let (xr, pr) = (round(&xv), round(&pv));
                let gv = common::tensor(&r.normal(n), &[n], out, &Device::Cpu).to_f64_vec().unwrap();
                // (output, input gradient, generator offset after) on `d`; the CPU computes half inputs in f32.
                let run = |dv: &Device, fused: bool| {
                    let half_in = matches!(xdt, DType::F16 | DType::BF16);
                    let (tx, to) = if *dv == Device::Cpu && half_in { (DType::F32, DType::F32) } else { (xdt, out) };
                    let x = common::tensor(&xr, &[b, t, d], tx, &Device::Cpu).to_device(dv).unwrap().requires_grad_();
                    let pe = common::tensor(&pr, &[1, max_len, d], tx, &Device::Cpu).to_device(dv).unwrap();
                    let g = common::tensor(&gv, &[b, t, d], to, &Device::Cpu).to_device(dv).unwrap();
                    rng::manual_seed(seed);
                    let table = with_table.then_some((&pe, off));
                    let y = if fused {
                        ops::pos_enc_dropout(&x, s, table, to, p, training).unwrap()
                    } else {
                        let mut y = ops::mul_scalar(&x, s).unwrap();
                        if with_table {
                            y = ops::add(&y, &ops::narrow(&pe, 1, off, t).unwrap()).unwrap();
                        }
                        if y.dtype() != to {
                            y = ops::to_dtype(&y, to).unwrap();
                        }
                        ops::dropout(&y, p, training).unwrap()
                    };
                    assert_eq!(y.dtype(), to, "{what}: the output dtype");
                    let after = rng::with_default(|g| g.offset);
                    asrforge::autograd::backward_with(&[(y.clone(), g)]).unwrap();
                    let gx = x.grad().unwrap();
                    assert_eq!(gx.dtype(), tx, "{what}: the gradient's dtype");
                    (y.to_f64_vec().unwrap(), gx.to_f64_vec().unwrap(), after)
                };
                let fused = run(&dev, true);
                assert_same_draw_and_bits(&what, &fused, &run(&dev, false), seed);
                let cpu = run(&Device::Cpu, true);
                close(&format!("{what} output against the CPU"), &fused.0, &cpu.0, out_tol(out), seed);
                close(&format!("{what} gradient against the CPU"), &fused.1, &cpu.1, out_tol(out), seed);
                if p == 1.0 && training {
                    assert!(fused.0.iter().chain(&fused.1).all(|v| *v == 0.0), "{what}: p = 1 drops everything (seed {seed})");
                } else if training {
                    let kept = fused.0.iter().filter(|v| **v != 0.0).count();
                    assert!(kept > n / 5 && kept < n, "{what}: some elements kept, some dropped: {kept} of {n} (seed {seed})");
                } else {
                    // The input gradient s·g is 0 only where dropped (g is
                    // never 0); the output can be, where x·s cancels a row
                    // of the table in the output's rounding (seen in bf16).
                    assert!(fused.1.iter().all(|v| *v != 0.0), "{what}: eval drops nothing (seed {seed})");
                }
            }
        }
    }
}

/// The relative positional encoding's rows with their dropout
/// (`ops::pos_rows_dropout`, one launch) are the composition
/// `cast(dropout(narrow(pe)))` on the same device bit for bit (the
/// generator moved the same), and the CPU's within the output dtype's
/// tolerance: each float type to itself and f32 to f16/bf16, a (1, L, D)
/// and an (L, D) table, rows at an offset whose count is not a multiple of
/// the Philox block of 4, p = 1, and eval.
#[test]
fn pos_rows_dropout_is_the_composition_bit_for_bit() {
    let Some(dev) = gpu("pos_rows_dropout_is_the_composition_bit_for_bit") else { return };
    let seed = fresh_seed();
    let mut r = Rng::new(seed);
    for (t, d, off, p, training, rank3) in [(7, 6, 3, 0.3, true, true), (5, 9, 0, 0.5, true, false), (3, 5, 1, 1.0, true, true), (4, 3, 2, 0.3, false, true)] {
        let max_len = off + t + 2;
        let pv = r.normal(max_len * d);
        let shape = if rank3 { vec![1, max_len, d] } else { vec![max_len, d] };
        for (tdt, out) in POS_ENC_DTYPES {
            let what = format!("{t} rows of {d} at {off}, p {p}, training {training}, table {shape:?} {tdt:?} to {out:?}");
            let pr = common::tensor(&pv, &[pv.len()], tdt, &Device::Cpu).to_f64_vec().unwrap();
            let run = |dv: &Device, fused: bool| {
                let half_in = matches!(tdt, DType::F16 | DType::BF16);
                let (tt, to) = if *dv == Device::Cpu && half_in { (DType::F32, DType::F32) } else { (tdt, out) };
                let pe = common::tensor(&pr, &shape, tt, &Device::Cpu).to_device(dv).unwrap();
                rng::manual_seed(seed);
                let y = if fused {
                    ops::pos_rows_dropout(&pe, off, t, to, p, training).unwrap()
                } else {
                    let y = ops::dropout(&ops::narrow(&pe, shape.len() as isize - 2, off, t).unwrap(), p, training).unwrap();
                    ops::to_dtype(&y, to).unwrap()
                };
                assert_eq!((y.dtype(), y.rank()), (to, shape.len()), "{what}: the output's dtype and rank");
                (y.to_f64_vec().unwrap(), rng::with_default(|g| g.offset))
            };
            let (fused, composed) = (run(&dev, true), run(&dev, false));
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fused.0), bits(&composed.0), "{what}: the rows (seed {seed})");
            assert_eq!(fused.1, composed.1, "{what}: the generator moved the same (seed {seed})");
            close(&format!("{what} against the CPU"), &fused.0, &run(&Device::Cpu, true).0, out_tol(out), seed);
            let zeros = fused.0.iter().filter(|v| **v == 0.0).count();
            match (training, p == 1.0) {
                (true, true) => assert_eq!(zeros, t * d, "{what}: p = 1 drops everything"),
                (true, false) => assert!(zeros > 0 && zeros < t * d, "{what}: some dropped, some kept: {zeros} (seed {seed})"),
                (false, _) => assert_eq!(zeros, 0, "{what}: eval drops nothing"),
            }
        }
    }
}

fn stats_like(v: f64, x: &Tensor, c: usize) -> Tensor {
    let t = Tensor::full([c], v, x.dtype(), &Device::Cpu).unwrap();
    t.to_device(&x.device()).unwrap()
}

#[test]
fn batch_norm_matches_the_cpu_in_train_and_eval() {
    let Some(dev) = gpu("batch_norm_matches_the_cpu_in_train_and_eval") else { return };
    let cases: [(&'static [usize], &'static [usize]); 3] = [(&[4, 3, 7], &[3]), (&[2, 5, 1000], &[5]), (&[4097, 3], &[3])];
    for (x, p) in cases {
        let c = p[0];
        for training in [true, false] {
            let f = move |t: &[Tensor]| {
                let (rm, rv) = (stats_like(0.25, &t[0], c), stats_like(1.5, &t[0], c));
                let st = BatchNormState { running_mean: &rm, running_var: &rv, momentum: 0.1, eps: 1e-5, training };
                ops::batch_norm(&t[0], &t[1], &t[2], &st)
            };
            both(&format!("batch_norm {x:?} training {training}"), &dev, &[(x, Normal, true), (p, Normal, true), (p, Normal, true)], &f);
        }
    }
}

#[test]
fn batch_norm_of_half_inputs_matches_the_cpu() {
    let Some(dev) = gpu("batch_norm_of_half_inputs_matches_the_cpu") else { return };
    // Half x (autocast's activations) with f32 weight, bias and running
    // statistics: channels last (B*T, C) as the convolution module uses it,
    // with 3 and 300 channels (ragged, past a block) and 4097 rows, and the
    // channels-first (B, C, T) layout.
    let cases: [(&'static [usize], &'static [usize]); 4] = [(&[4, 3, 7], &[3]), (&[4097, 3], &[3]), (&[50, 300], &[300]), (&[2, 5, 1000], &[5])];
    for (x, p) in cases {
        let c = p[0];
        for training in [true, false] {
            let f = move |t: &[Tensor]| {
                let f32s = |v: f64| Tensor::full([c], v, DType::F32, &Device::Cpu).and_then(|s| s.to_device(&t[0].device()));
                let (rm, rv) = (f32s(0.25)?, f32s(1.5)?);
                let st = BatchNormState { running_mean: &rm, running_var: &rv, momentum: 0.1, eps: 1e-5, training };
                let (w, b) = (ops::to_dtype(&t[1], DType::F32)?, ops::to_dtype(&t[2], DType::F32)?);
                let y = ops::batch_norm(&t[0], &w, &b, &st)?;
                assert_eq!(y.dtype(), t[0].dtype(), "a half input gives a half output");
                Ok(y)
            };
            for dt in [DType::F16, DType::BF16] {
                compare(
                    &format!("batch_norm {x:?} training {training}"),
                    &dev,
                    dt,
                    gpu::tol(dt),
                    &[(x, Normal, true), (p, Normal, true), (p, Normal, true)],
                    &f,
                );
            }
        }
    }
}

#[test]
fn batch_norm_running_statistics_of_half_inputs_match_the_cpu() {
    let Some(dev) = gpu("batch_norm_running_statistics_of_half_inputs_match_the_cpu") else { return };
    let seed = fresh_seed();
    let mut r = Rng::new(seed);
    let xv: Vec<f32> = r.normal(3000 * 5).into_iter().map(|v| v as f32 * 2.0 + 0.5).collect();
    for dt in [DType::F16, DType::BF16] {
        let mut out = Vec::new();
        for d in [Device::Cpu, dev.clone()] {
            let x = ops::to_dtype(&Tensor::from_vec(xv.clone(), [3000, 5], &d).unwrap(), dt).unwrap();
            let w = Tensor::ones([5], DType::F32, &d).unwrap();
            let b = Tensor::zeros([5], DType::F32, &d).unwrap();
            let (rm, rv) = (Tensor::zeros([5], DType::F32, &d).unwrap(), Tensor::ones([5], DType::F32, &d).unwrap());
            let st = BatchNormState { running_mean: &rm, running_var: &rv, momentum: 0.1, eps: 1e-5, training: true };
            ops::batch_norm(&x, &w, &b, &st).unwrap();
            ops::batch_norm(&x, &w, &b, &st).unwrap();
            out.push((rm.to_f64_vec().unwrap(), rv.to_f64_vec().unwrap()));
        }
        // Both devices sum the same half values in f32 (in different orders).
        close(&format!("running_mean {dt:?}"), &out[1].0, &out[0].0, gpu::F32, seed);
        close(&format!("running_var {dt:?}"), &out[1].1, &out[0].1, gpu::F32, seed);
        // Two updates of the same batch from (0, 1): m = 0.19 * mean and
        // v = 0.81 + 0.19 * var (unbiased), by definition in f64 from the
        // half-rounded inputs. (A bound around the population's mean 0.5
        // and variance 4 failed about once in 30 runs: the sample mean of
        // 3000 draws moves by 2 / sqrt(3000) = 0.037.)
        let xr = ops::to_dtype(&Tensor::from_vec(xv.clone(), [3000, 5], &Device::Cpu).unwrap(), dt).unwrap().to_f64_vec().unwrap();
        for ch in 0..5 {
            let col: Vec<f64> = xr.iter().skip(ch).step_by(5).copied().collect();
            let mean = col.iter().sum::<f64>() / 3000.0;
            let var = col.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / 2999.0;
            let (m, v) = (out[0].0[ch], out[0].1[ch]);
            assert!((m - 0.19 * mean).abs() < 1e-5, "running_mean[{ch}] {m} against 0.19 * {mean} (seed {seed})");
            assert!((v - (0.81 + 0.19 * var)).abs() < 1e-4, "running_var[{ch}] {v} against 0.81 + 0.19 * {var} (seed {seed})");
        }
    }
}

#[test]
fn batch_norm_running_statistics_match_the_cpu() {
    let Some(dev) = gpu("batch_norm_running_statistics_match_the_cpu") else { return };
    let seed = fresh_seed();
    let mut r = Rng::new(seed);
    let xv = r.normal(3 * 5 * 1000);
    let wv = r.normal(5);
    let mut out = Vec::new();
    for d in [Device::Cpu, dev] {
        let x = Tensor::from_vec(xv.clone(), [3, 5, 1000], &d).unwrap();
        let w = Tensor::from_vec(wv.clone(), [5], &d).unwrap();
        let b = Tensor::zeros([5], DType::F64, &d).unwrap();
        let (rm, rv) = (Tensor::zeros([5], DType::F64, &d).unwrap(), Tensor::ones([5], DType::F64, &d).unwrap());
        let st = BatchNormState { running_mean: &rm, running_var: &rv, momentum: 0.1, eps: 1e-5, training: true };
        ops::batch_norm(&x, &w, &b, &st).unwrap();
        out.push((rm.to_f64_vec().unwrap(), rv.to_f64_vec().unwrap()));
    }
    close("running_mean", &out[1].0, &out[0].0, 1e-12, seed);
    close("running_var", &out[1].1, &out[0].1, 1e-12, seed);
}

/// Training batch norm of channels-last x (N, C) on `dev` in `dt` with
/// weight w, f32-or-f64 parameters: y, the gradients of x, w and b for the
/// loss sum(y * r), and the running statistics after the update (the tiled
/// `batch_norm_stats_cl` and `batch_norm_bwd_sums_cl` kernels on the GPU).
fn bn_channels_last_run(dev: &Device, dt: DType, xv: &[f64], wv: &[f64], rv: &[f64], n: usize, c: usize) -> Vec<Vec<f64>> {
    let pd = if dt == DType::F64 { DType::F64 } else { DType::F32 };
    let x = common::tensor(xv, &[n, c], dt, dev).requires_grad_();
    let w = common::tensor(wv, &[c], pd, dev).requires_grad_();
    let b = common::tensor(&vec![0.1; c], &[c], pd, dev).requires_grad_();
    let (rm, rvar) = (Tensor::full([c], 0.25, pd, dev).unwrap(), Tensor::full([c], 1.5, pd, dev).unwrap());
    let st = BatchNormState { running_mean: &rm, running_var: &rvar, momentum: 0.1, eps: 1e-5, training: true };
    let y = ops::batch_norm(&x, &w, &b, &st).unwrap();
    // The weighting in the parameter dtype (the CPU computes no half ops).
    let r = common::tensor(rv, &[n, c], pd, dev);
    let loss = ops::sum_all(&ops::mul(&ops::to_dtype(&y, pd).unwrap(), &r).unwrap()).unwrap();
    asrforge::autograd::backward(&loss).unwrap();
    let g = |t: &Tensor| t.grad().expect("a gradient reached the input").to_f64_vec().unwrap();
    vec![y.to_f64_vec().unwrap(), g(&x), g(&w), g(&b), rm.to_f64_vec().unwrap(), rvar.to_f64_vec().unwrap()]
}

#[test]
fn batch_norm_channels_last_tiled_matches_the_cpu_and_is_reproducible() {
    let Some(dev) = gpu("batch_norm_channels_last_tiled_matches_the_cpu_and_is_reproducible") else { return };
    // Rows not a multiple of the tile or of the 8 row lanes, channels not a
    // multiple of the 32-channel strip (7: one ragged strip; 300: ten, the
    // last of 12), 1000 x 300 is 10 strips x 31 tiles = 310 items over the
    // capped grid of 37 blocks (grid-stride wraps); 2051 x 40 has 2 strips
    // x 64 tiles of 40 rows, the last tile 11 rows (the module's N = 2048
    // tiling, ragged). x has a mean of 3 so the merge of tile variances
    // matters.
    let seed = fresh_seed();
    let names = ["y", "gx", "gw", "gb", "running_mean", "running_var"];
    for (n, c) in [(300usize, 7usize), (1000, 300), (2051, 40)] {
        let mut rng = Rng::new(seed ^ (n * c) as u64);
        let xv: Vec<f64> = rng.normal(n * c).into_iter().map(|v| 2.0 * v + 3.0).collect();
        let wv = rng.normal(c);
        let rv = rng.normal(n * c);
        for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            // Both devices see the same dtype-rounded numbers.
            let round = |v: &[f64], d: DType| common::tensor(v, &[v.len()], d, &Device::Cpu).to_f64_vec().unwrap();
            let pd = if dt == DType::F64 { DType::F64 } else { DType::F32 };
            let (xv, rv, wv) = (round(&xv, dt), round(&rv, dt), round(&wv, pd));
            let want = bn_channels_last_run(&Device::Cpu, dt, &xv, &wv, &rv, n, c);
            let got = bn_channels_last_run(&dev, dt, &xv, &wv, &rv, n, c);
            let again = bn_channels_last_run(&dev, dt, &xv, &wv, &rv, n, c);
            for (k, name) in names.iter().enumerate() {
                let what = format!("batch_norm channels-last ({n}, {c}) {dt:?} {name}");
                // The running statistics are f32 sums of the same half values for half x.
                let tol = if k >= 4 && matches!(dt, DType::F16 | DType::BF16) { gpu::F32 } else { gpu::tol(dt) };
                // y = w·x̂ + b: its error is that of the f32 statistics (sums
                // over the rows of x with a mean of 3) times |w·x̂|, which in
                // a channel of large |w| is several times y's rms while y
                // itself may be near 0: the scale is the largest |w| (x̂ has
                // unit rms) where that exceeds y's rms (seed
                // 1796530076764095829 at (2051, 40) was 1.25 × a tolerance
                // scaled by y's rms).
                let floor = if k == 0 { wv.iter().fold(0.0f64, |m, w| m.max(w.abs())) } else { 0.0 };
                gpu::assert_close_floor(&what, &got[k], &want[k], tol, floor, seed);
                let same_bits = got[k].iter().zip(&again[k]).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same_bits, "{what}: two GPU runs differ (seed {seed})");
            }
        }
    }
}

#[test]
fn layer_norm_weight_gradient_is_reproducible() {
    let Some(dev) = gpu("layer_norm_weight_gradient_is_reproducible") else { return };
    let mut r = Rng::new(fresh_seed());
    let (xv, wv) = (r.normal(1000 * 257), r.normal(257));
    let grad = || {
        let x = Tensor::from_vec(xv.iter().map(|&v| v as f32).collect::<Vec<_>>(), [1000, 257], &dev).unwrap();
        let w = Tensor::from_vec(wv.iter().map(|&v| v as f32).collect::<Vec<_>>(), [257], &dev).unwrap().requires_grad_();
        let y = ops::layer_norm(&x, Some(&w), None, 1e-5).unwrap();
        asrforge::autograd::backward(&ops::sum_all(&ops::mul(&y, &y).unwrap()).unwrap()).unwrap();
        w.grad().unwrap().to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
    };
    assert_eq!(grad(), grad(), "two runs of the same backward give the same bits");
}

/// Layer norm's weight and bias gradients are folded from the chunks'
/// partial rows by the last block to finish, elected on the device's kept
/// arrival counters (its one launch and no memset: tests/gpu_profile.rs).
/// Every folding kernel (layer norm by warp rows and by block rows, with the capped grid
/// wrapping over chunks; the tiled column sum; the channels-last batch norm
/// statistics) leaves those counters at 0, checked after each; gw and gb
/// equal their definitions, sum over rows of g * xh and of g, in f64.
#[test]
fn folding_kernels_leave_the_kept_arrival_counters_at_zero() {
    use asrforge::backend::cpu::CpuStorage;
    use asrforge::backend::cuda::{self, CudaStorage};
    let Some(dev) = gpu("folding_kernels_leave_the_kept_arrival_counters_at_zero") else { return };
    let Device::Cuda(ord) = dev else { unreachable!("gpu() gives a CUDA device") };
    let cdev = cuda::device(ord).unwrap();
    let up = |v: &[f64]| CudaStorage::from_cpu(&cdev, &CpuStorage::F64(v.to_vec())).unwrap();
    let down = |s: &CudaStorage| s.to_cpu().unwrap().to_f64_vec();
    let all_zero = |after: &str| {
        let kept = cuda::kept_arrivals(ord).unwrap().expect("a folding kernel made the counters");
        assert!(
            kept.iter().all(|&c| c == 0),
            "after {after}: counters left {:?}",
            kept.iter().enumerate().filter(|(_, &c)| c != 0).take(8).collect::<Vec<_>>()
        );
    };
    let seed = fresh_seed();
    let mut r = Rng::new(seed);
    // Rows of 7 (a warp each, 5 chunks of 64), of 1025 (a block each) and
    // 2400 rows of 5 (38 chunks: more than the capped grid's 37 blocks).
    // The first folding kernel on the device makes the kept counters (one memset).
    let (x0, g0) = (up(&r.normal(64 * 3)), up(&r.normal(64 * 3)));
    let (_, m0, s0) = cuda::norm::layer_norm(&x0, None, None, 3, 1e-5).unwrap();
    cuda::norm::layer_norm_backward(&x0, None, &m0, &s0, &g0, 3).unwrap();
    all_zero("the first layer_norm_backward");
    for (rows, n) in [(300usize, 7usize), (67, 1025), (2400, 5)] {
        let (xv, wv, bv, gv) = (r.normal(rows * n), r.normal(n), r.normal(n), r.normal(rows * n));
        let (x, w, b, g) = (up(&xv), up(&wv), up(&bv), up(&gv));
        let (_, mean, rstd) = cuda::norm::layer_norm(&x, Some(&w), Some(&b), n, 1e-5).unwrap();
        let (_, gw, gb) = cuda::norm::layer_norm_backward(&x, Some(&w), &mean, &rstd, &g, n).unwrap();
        all_zero(&format!("layer_norm_backward ({rows}, {n})"));
        let (mv, sv) = (down(&mean), down(&rstd));
        let mut want_w = vec![0.0; n];
        let mut want_b = vec![0.0; n];
        for i in 0..rows {
            for j in 0..n {
                let k = i * n + j;
                want_w[j] += gv[k] * (xv[k] - mv[i]) * sv[i];
                want_b[j] += gv[k];
            }
        }
        gpu::assert_close_floor(&format!("gw ({rows}, {n})"), &down(&gw), &want_w, gpu::F64, (rows as f64).sqrt(), seed);
        gpu::assert_close_floor(&format!("gb ({rows}, {n})"), &down(&gb), &want_b, gpu::F64, (rows as f64).sqrt(), seed);
        // A tiled column sum (33 strips) and the channels-last batch norm
        // statistics (3 strips) between the layer norms.
        let (o, cn, inner) = (1, 2048, 1050);
        let xs = up(&r.normal(o * cn * inner));
        let sum = cuda::reduce::sum_dim_acc_with(&xs, o, cn, inner, cuda::reduce::SumPath::Tiled).unwrap();
        let xsv = down(&xs);
        let want: Vec<f64> = (0..inner).map(|j| (0..cn).map(|i| xsv[i * inner + j]).sum()).collect();
        gpu::assert_close_floor("tiled column sum", &down(&sum), &want, gpu::F64, (cn as f64).sqrt(), seed);
        all_zero("a tiled column sum");
        let (bn, bc) = (1000, 70);
        let xb = r.normal(bn * bc);
        let (mut rm, mut rv) = (up(&vec![0.0; bc]), up(&vec![1.0; bc]));
        let (bmean, _) = cuda::norm::batch_norm_stats(&up(&xb), &mut rm, &mut rv, bn, bc, 1, 1e-5, 0.1, true).unwrap();
        let want: Vec<f64> = (0..bc).map(|c| (0..bn).map(|i| xb[i * bc + c]).sum::<f64>() / bn as f64).collect();
        gpu::assert_close_floor("batch norm mean", &down(&bmean), &want, gpu::F64, 1.0, seed);
        all_zero("the channels-last batch norm statistics");
    }
}

/// Folding kernels queued on the compute stream by several host threads at
/// once share the kept arrival counters safely: a stream runs its work one
/// item after another (on the emulator too, which holds each stream while a
/// launch runs), so each tiled sum and layer-norm backward is right.
#[test]
fn folding_kernels_from_several_threads_share_the_counters() {
    use asrforge::backend::cpu::CpuStorage;
    use asrforge::backend::cuda::{self, CudaStorage};
    let Some(dev) = gpu("folding_kernels_from_several_threads_share_the_counters") else { return };
    let Device::Cuda(ord) = dev else { unreachable!("gpu() gives a CUDA device") };
    let seed = fresh_seed();
    std::thread::scope(|sc| {
        for th in 0..3u64 {
            sc.spawn(move || {
                let cdev = cuda::device(ord).unwrap();
                let mut r = Rng::new(seed ^ th);
                for it in 0..12 {
                    let (n, inner) = (1024 + 64 * it, 96 + th as usize);
                    let v = r.normal(n * inner);
                    let x = CudaStorage::from_cpu(&cdev, &CpuStorage::F64(v.clone())).unwrap();
                    let got = cuda::reduce::sum_dim_acc_with(&x, 1, n, inner, cuda::reduce::SumPath::Tiled).unwrap().to_cpu().unwrap().to_f64_vec();
                    let want: Vec<f64> = (0..inner).map(|j| (0..n).map(|i| v[i * inner + j]).sum()).collect();
                    gpu::assert_close_floor(&format!("thread {th} sum {it}"), &got, &want, gpu::F64, (n as f64).sqrt(), seed);
                    let (rows, c) = (130 + it, 9);
                    let (xv, gv) = (r.normal(rows * c), r.normal(rows * c));
                    let (xl, gl) = (
                        CudaStorage::from_cpu(&cdev, &CpuStorage::F64(xv.clone())).unwrap(),
                        CudaStorage::from_cpu(&cdev, &CpuStorage::F64(gv.clone())).unwrap(),
                    );
                    let (_, mean, rstd) = cuda::norm::layer_norm(&xl, None, None, c, 1e-5).unwrap();
                    let (_, _, gb) = cuda::norm::layer_norm_backward(&xl, None, &mean, &rstd, &gl, c).unwrap();
                    let want: Vec<f64> = (0..c).map(|j| (0..rows).map(|i| gv[i * c + j]).sum()).collect();
                    gpu::assert_close_floor(
                        &format!("thread {th} layer norm gb {it}"),
                        &gb.to_cpu().unwrap().to_f64_vec(),
                        &want,
                        gpu::F64,
                        (rows as f64).sqrt(),
                        seed,
                    );
                }
            });
        }
    });
}

// ---- convolutions ----

/// `compare` in f32, f64, f16 and bf16 (the half types at their tolerance).
fn all_floats(name: &str, dev: &Device, inputs: &[Input], f: &OpFn) {
    both(name, dev, inputs, f);
    for dt in [DType::F16, DType::BF16] {
        compare(name, dev, dt, gpu::tol(dt), inputs, f);
    }
}

#[test]
fn glu_matches_the_cpu() {
    let Some(dev) = gpu("glu_matches_the_cpu") else { return };
    // Over the last dim (the convolution module's) and a middle one; halves
    // of 4 elements, 1500 (past a block) and 700 with 14000 outputs (more
    // than the capped grid's threads, so the loop wraps).
    let cases: [(&'static [usize], isize); 5] = [(&[2, 3, 8], -1), (&[3, 600, 5], 1), (&[4097, 2], -1), (&[2, 10, 1400], -1), (&[1, 2, 1], 1)];
    for (s, d) in cases {
        all_floats(&format!("glu {s:?} dim {d}"), &dev, &[(s, Normal, true)], &move |x| ops::glu(&x[0], d));
    }
}

#[test]
fn conv1d_depthwise_matches_the_cpu() {
    let Some(dev) = gpu("conv1d_depthwise_matches_the_cpu") else { return };
    // Channels last, x (B, T, C). Channel counts of 3 and 5 (ragged, less
    // than a 32-channel group), 300 (past a block) and 700 (with k = 15, the
    // weight-and-bias pass's 16 taps x 22 channel groups = 352 blocks
    // outnumber the capped grid's 37, so that loop wraps too); 4097 frames
    // with 4 channels give 8 row lanes of 2000+ terms each.
    all_floats("conv1d_depthwise k3 p1 with bias", &dev, &[(&[2, 7, 3], Normal, true), (&[3, 1, 3], Normal, true), (&[3], Normal, true)], &move |x| {
        ops::conv1d_depthwise(&x[0], &x[1], Some(&x[2]), 1)
    });
    // The Conformer module's kernel 15, "same" padding, 1000 frames.
    all_floats("conv1d_depthwise k15 p7 with bias", &dev, &[(&[2, 1000, 5], Normal, true), (&[5, 1, 15], Normal, true), (&[5], Normal, true)], &move |x| {
        ops::conv1d_depthwise(&x[0], &x[1], Some(&x[2]), 7)
    });
    all_floats(
        "conv1d_depthwise k15 p7 700 channels",
        &dev,
        &[(&[2, 20, 700], Normal, true), (&[700, 1, 15], Normal, true), (&[700], Normal, true)],
        &move |x| ops::conv1d_depthwise(&x[0], &x[1], Some(&x[2]), 7),
    );
    all_floats("conv1d_depthwise k5 p0 no bias", &dev, &[(&[1, 4097, 4], Normal, true), (&[4, 1, 5], Normal, true)], &move |x| {
        ops::conv1d_depthwise(&x[0], &x[1], None, 0)
    });
    // Causal: the module pads k-1 frames on the left and convolves with p = 0.
    all_floats("conv1d_depthwise k1 frame", &dev, &[(&[3, 1, 300], Normal, true), (&[300, 1, 1], Normal, true)], &move |x| {
        ops::conv1d_depthwise(&x[0], &x[1], None, 0)
    });
    // Padding wider than the input: taps that never touch x.
    all_floats("conv1d_depthwise k7 p4 short", &dev, &[(&[2, 2, 3], Normal, true), (&[3, 1, 7], Normal, true), (&[3], Normal, true)], &move |x| {
        ops::conv1d_depthwise(&x[0], &x[1], Some(&x[2]), 4)
    });
}

#[test]
fn conv1d_depthwise_gradients_are_reproducible() {
    let Some(dev) = gpu("conv1d_depthwise_gradients_are_reproducible") else { return };
    let mut r = Rng::new(fresh_seed());
    let (xv, wv) = (r.normal(3 * 200 * 257), r.normal(257 * 15));
    let grad = || {
        let x = Tensor::from_vec(xv.iter().map(|&v| v as f32).collect::<Vec<_>>(), [3, 200, 257], &dev).unwrap();
        let w = Tensor::from_vec(wv.iter().map(|&v| v as f32).collect::<Vec<_>>(), [257, 1, 15], &dev).unwrap().requires_grad_();
        let y = ops::conv1d_depthwise(&x, &w, None, 7).unwrap();
        asrforge::autograd::backward(&ops::sum_all(&ops::mul(&y, &y).unwrap()).unwrap()).unwrap();
        w.grad().unwrap().to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
    };
    assert_eq!(grad(), grad(), "two runs of the same backward give the same bits");
}

/// conv2d, and conv2d_relu (the `subsampling` fusion's op: the bias and
/// the ReLU after the product in one launch each way), against the CPU.
#[test]
fn conv2d_matches_the_cpu() {
    let Some(dev) = gpu("conv2d_matches_the_cpu") else { return };
    for relu in [false, true] {
        let conv = move |x: &Tensor, w: &Tensor, b: Option<&Tensor>, stride: usize, pad: usize| {
            if relu {
                ops::conv2d_relu(x, w, b, stride, pad)
            } else {
                ops::conv2d(x, w, b, stride, pad)
            }
        };
        let name = |what: &str| format!("{} {what}", if relu { "conv2d_relu" } else { "conv2d" });
        // The subsampling front end: 3x3 stride 2 on (B, 1, T, 80) features
        // (rows of more than a block), then on its channels (more (batch,
        // channel) rows than the capped grid).
        both(&name("stride 2"), &dev, &[(&[2, 1, 37, 80], Normal, true), (&[4, 1, 3, 3], Normal, true), (&[4], Normal, true)], &move |x| {
            conv(&x[0], &x[1], Some(&x[2]), 2, 0)
        });
        both(&name("16 channels stride 2"), &dev, &[(&[3, 4, 18, 39], Normal, true), (&[16, 4, 3, 3], Normal, true), (&[16], Normal, true)], &move |x| {
            conv(&x[0], &x[1], Some(&x[2]), 2, 0)
        });
        both(&name("pad 1 no bias"), &dev, &[(&[1, 3, 9, 7], Normal, true), (&[2, 3, 3, 3], Normal, true)], &move |x| conv(&x[0], &x[1], None, 1, 1));
        both(&name("5x5 stride 3"), &dev, &[(&[2, 2, 23, 17], Normal, true), (&[3, 2, 5, 5], Normal, true), (&[3], Normal, true)], &move |x| {
            conv(&x[0], &x[1], Some(&x[2]), 3, 1)
        });
    }
}

/// The subsampling's convolution and ReLU (`ops::conv2d_relu`, fusion
/// family `subsampling`: the bias and the ReLU after the product in one
/// launch each way, the bias's gradient summed in the backward's launch;
/// `conv2d_matches_the_cpu` checks it against the CPU) against the GPU
/// composition `relu(conv2d(..))` in every float dtype: the output and the
/// input and weight gradients bit for bit, the bias's gradient (summed in
/// another order) within the dtype's tolerance.
#[test]
fn conv2d_relu_matches_the_composition() {
    let Some(dev) = gpu("conv2d_relu_matches_the_composition") else { return };
    let seed = fresh_seed();
    let mut r = Rng::new(seed);
    let (xs, ws, bs) = ([3usize, 4, 18, 39], [16usize, 4, 3, 3], [16usize]);
    let (xv, wv, bv) = (r.normal(xs.iter().product()), r.normal(ws.iter().product()), r.normal(16));
    let gv = r.normal(3 * 16 * 8 * 19);
    for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let run = |fused: bool| {
            let t = |v: &[f64], s: &[usize]| common::tensor(v, s, dt, &Device::Cpu).to_device(&dev).unwrap();
            let (x, w, b) = (t(&xv, &xs).requires_grad_(), t(&wv, &ws).requires_grad_(), t(&bv, &bs).requires_grad_());
            let y = if fused { ops::conv2d_relu(&x, &w, Some(&b), 2, 0) } else { ops::relu(&ops::conv2d(&x, &w, Some(&b), 2, 0).unwrap()) }.unwrap();
            asrforge::autograd::backward_with(&[(y.clone(), t(&gv, y.dims()))]).unwrap();
            [y, x.grad().unwrap(), w.grad().unwrap(), b.grad().unwrap()].map(|v| v.to_f64_vec().unwrap())
        };
        let (f, c) = (run(true), run(false));
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (i, what) in ["output", "input gradient", "weight gradient"].iter().enumerate() {
            assert_eq!(bits(&f[i]), bits(&c[i]), "conv2d_relu {dt:?}: the {what} (seed {seed})");
        }
        assert!(f[0].iter().any(|v| *v == 0.0) && f[0].iter().any(|v| *v > 0.0), "conv2d_relu {dt:?}: some outputs clipped, some not");
        close(&format!("conv2d_relu {dt:?}: the bias gradient against the composition's"), &f[3], &c[3], out_tol(dt), seed);
    }
}

#[test]
fn pointwise_conv1d_matches_the_cpu() {
    let Some(dev) = gpu("pointwise_conv1d_matches_the_cpu") else { return };
    both("pointwise", &dev, &[(&[2, 7, 1000], Normal, true), (&[5, 7, 1], Normal, true), (&[5], Normal, true)], &move |x| {
        ops::conv1d_pointwise(&x[0], &x[1], Some(&x[2]))
    });
}

// ---- indexing ----

#[test]
fn embedding_and_index_select_match_the_cpu() {
    let Some(dev) = gpu("embedding_and_index_select_match_the_cpu") else { return };
    // 4097 lookups into 1000 rows: many repeats, many rows never hit (their gradient is 0).
    let ids = some_ids(4097, 1000, 11);
    both("embedding", &dev, &[(&[1000, 7], Normal, true)], &move |x| ops::embedding(&x[0], &ids_on_cpu(&ids, &[17, 241])));
    let sel = some_ids(9, 5, 12);
    both("index_select dim 1", &dev, &[(&[3, 5, 7], Normal, true)], &move |x| ops::index_select(&x[0], 1, &ids_on_cpu(&sel, &[9])));
    let sel0 = some_ids(9, 5, 18);
    both("index_select dim 0", &dev, &[(&[5, 1000], Normal, true)], &move |x| ops::index_select(&x[0], 0, &ids_on_cpu(&sel0, &[9])));
}

#[test]
fn gather_matches_the_cpu() {
    let Some(dev) = gpu("gather_matches_the_cpu") else { return };
    let idx = some_ids(3 * 4097, 7, 13);
    both("gather dim 1", &dev, &[(&[3, 7], Normal, true)], &move |x| ops::gather(&x[0], 1, &ids_on_cpu(&idx, &[3, 4097])));
    let idx0 = some_ids(2 * 1000, 4, 14);
    both("gather dim 0", &dev, &[(&[4, 1000], Normal, true)], &move |x| ops::gather(&x[0], 0, &ids_on_cpu(&idx0, &[2, 1000])));
}

#[test]
fn masked_fill_and_where_match_the_cpu() {
    let Some(dev) = gpu("masked_fill_and_where_match_the_cpu") else { return };
    // The attention mask's broadcast: (B, 1, T) over (B, H, T).
    let m = some_mask(2 * 1000, 15);
    both("masked_fill broadcast", &dev, &[(&[2, 3, 1000], Normal, true)], &move |x| ops::masked_fill(&x[0], &u8s(m.clone(), &[2, 1, 1000]), -1e4));
    let full = some_mask(5 * 4097, 16);
    let f1 = full.clone();
    both("masked_fill full", &dev, &[(&[5, 4097], Normal, true)], &move |x| ops::masked_fill(&x[0], &u8s(f1.clone(), &[5, 4097]), 0.0));
    let row = some_mask(7, 17);
    both("where broadcast", &dev, &[(&[3, 7], Normal, true), (&[3, 7], Normal, true)], &move |x| ops::where_cond(&u8s(row.clone(), &[7]), &x[0], &x[1]));
    // A mask already on the GPU takes the same path.
    let on_gpu = u8s(full.clone(), &[5, 4097]).to_device(&dev).unwrap();
    both("where mask on gpu", &dev, &[(&[5, 4097], Normal, true), (&[5, 4097], Normal, true)], &move |x| {
        let m = if x[0].device() == Device::Cpu { u8s(full.clone(), &[5, 4097]) } else { on_gpu.clone() };
        ops::where_cond(&m, &x[0], &x[1])
    });
}

#[test]
fn out_of_range_indices_are_errors_on_the_gpu() {
    let Some(dev) = gpu("out_of_range_indices_are_errors_on_the_gpu") else { return };
    let x = Tensor::zeros([5, 3], DType::F32, &dev).unwrap();
    match ops::index_select(&x, 0, &ids_on_cpu(&[1, 5], &[2])) {
        Err(Error::IndexOutOfRange { index: 5, size: 5, .. }) => {}
        other => panic!("expected IndexOutOfRange for index 5 of 5, got {other:?}"),
    }
    match ops::gather(&x, 1, &ids_on_cpu(&[0, -1], &[1, 2])) {
        Err(Error::IndexOutOfRange { index: -1, size: 3, .. }) => {}
        other => panic!("expected IndexOutOfRange for index -1 of 3, got {other:?}"),
    }
}

// ---- layout ----

/// Every dtype's copy of the same values: the GPU result must be bit-identical.
fn layout_exact(name: &str, dev: &Device, shape: &[usize], f: &dyn Fn(&Tensor) -> Result<Tensor>) {
    let seed = fresh_seed();
    let mut r = Rng::new(seed);
    let v = r.normal(shape.iter().product());
    for dt in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::U8] {
        let vals: Vec<f64> = if dt == DType::I64 || dt == DType::U8 { v.iter().map(|x| (x * 40.0).abs().floor()).collect() } else { v.clone() };
        let x = common::tensor(&vals, shape, dt, &Device::Cpu);
        let want = f(&x).unwrap().to_cpu_storage().unwrap();
        let got = f(&x.clone().to_device(dev).unwrap()).unwrap().to_cpu_storage().unwrap();
        let nan_free = got.to_f64_vec().iter().all(|v| !v.is_nan());
        assert!(nan_free, "{name} {dt:?}: NaN in the GPU result (seed {seed})");
        assert!(got == want, "{name} {dt:?}: GPU copy differs from the CPU's (seed {seed})");
    }
}

#[test]
fn permute_narrow_pad_cat_are_exact_copies_in_every_dtype() {
    let Some(dev) = gpu("permute_narrow_pad_cat_are_exact_copies_in_every_dtype") else { return };
    layout_exact("permute 3-d", &dev, &[3, 7, 1000], &move |x| ops::permute(x, &[2, 0, 1]));
    layout_exact("transpose 4-d", &dev, &[2, 5, 7, 13], &move |x| ops::transpose(x, 1, 2));
    layout_exact("permute 5-d", &dev, &[2, 3, 1, 4, 5], &move |x| ops::permute(x, &[4, 2, 0, 3, 1]));
    layout_exact("narrow", &dev, &[3, 4097, 2], &move |x| ops::narrow(x, 1, 1000, 97));
    layout_exact("pad", &dev, &[5, 7], &move |x| ops::pad(x, 1, 3, 2, 1.5));
    layout_exact("pad first dim", &dev, &[1000, 3], &move |x| ops::pad(x, 0, 1, 0, -2.0));
    layout_exact("cat", &dev, &[2, 7, 5], &move |x| ops::cat(&[x, &ops::narrow(x, 1, 0, 1)?, x], 1));
    layout_exact("stack", &dev, &[4097], &move |x| ops::stack(&[x, x, x], 0));
}

/// The divisors of the u32 kernels are exact: ⌊n/d⌋ by multiply-high, add
/// and shift for every d in 1..=2^31 tried and n < 2^31 (edges and draws).
#[test]
fn host_divisors_divide_exactly() {
    use asrforge::backend::cuda::fastdiv::FastDiv;
    let mut rng = Rng::new(fresh_seed());
    let big = [641usize, 65_535, 65_536, 65_537, 1_000_003, (1 << 30) + 1, (1 << 31) - 1, 1 << 31];
    let drawn: Vec<usize> = rng.uniform(200).into_iter().map(|u| 1 + (u * ((1u64 << 31) as f64)) as usize).collect();
    for d in (1..=2050usize).chain(big).chain(drawn) {
        let d = d.min(1 << 31);
        let f = FastDiv::new("test", d).unwrap();
        let draws = rng.uniform(20).into_iter().map(|u| (u * ((1u64 << 31) - 1) as f64) as usize);
        for n in [0, 1, d - 1, d, d + 1, 3 * d - 1, 3 * d, (1 << 31) - 1, (1 << 31) - 2].into_iter().chain(draws) {
            if n < 1 << 31 {
                assert_eq!(f.div(n as u32) as usize, n / d, "{n} / {d} with m = {}, s = {}", f.m, f.s);
            }
        }
    }
    assert!(FastDiv::new("test", 0).is_err() && FastDiv::new("test", (1 << 31) + 1).is_err());
}

/// conv2d's image copies by both index widths (`_u32` kernels, 64-bit)
/// against their definitions, written out here: im2col gathers
/// cols[b, (c, i, j), (oy, ox)] = x[b, c, oy·s + i − pad, ox·s + j − pad]
/// (0 outside the image) and col2im, its adjoint, sums every column entry
/// back into the pixel it came from. Several strides, pads and kernel
/// sizes (taps that skip pixels, windows that overhang), four dtypes,
/// grids that wrap the capped grid; the two widths agree bit for bit.
#[test]
fn im2col_and_col2im_by_both_index_widths_match_their_definitions() {
    use asrforge::backend::cpu::conv::Conv2d;
    use asrforge::backend::cuda::{conv, fastdiv::IndexWidth};
    use asrforge::backend::Storage;
    let Some(dev) = gpu("im2col_and_col2im_by_both_index_widths_match_their_definitions") else { return };
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    for (b, ci, h, w, k, stride, pad) in [(2, 3, 37, 23, 3, 2, 0), (1, 2, 19, 31, 5, 3, 1), (3, 1, 11, 9, 3, 1, 2), (2, 4, 40, 17, 2, 2, 1)] {
        let g = Conv2d { b, ci, h, w, co: 1, kh: k, kw: k, stride, pad };
        let (ho, wo) = g.out_hw();
        let x = rng.normal(b * ci * h * w);
        let c = rng.normal(b * ci * k * k * ho * wo);
        // The definition: (column entry, pixel) for every tap inside the image.
        let mut taps = Vec::new();
        for bi in 0..b {
            for ch in 0..ci {
                for i in 0..k {
                    for j in 0..k {
                        for oy in 0..ho {
                            for ox in 0..wo {
                                let (y, xx) = ((oy * stride + i) as i64 - pad as i64, (ox * stride + j) as i64 - pad as i64);
                                if y >= 0 && xx >= 0 && (y as usize) < h && (xx as usize) < w {
                                    let e = ((bi * ci + ch) * k * k + i * k + j) * ho * wo + oy * wo + ox;
                                    taps.push((e, ((bi * ci + ch) * h + y as usize) * w + xx as usize));
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(pad == 0 || taps.len() < c.len(), "{g:?}: with padding some windows overhang the image");
        for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            let xg = common::tensor(&x, &[x.len()], dt, &Device::Cpu).to_device(&dev).unwrap();
            let cg = common::tensor(&c, &[c.len()], dt, &Device::Cpu).to_device(&dev).unwrap();
            let (sx, sc) = (xg.storage(), cg.storage());
            let (Storage::Cuda(cx), Storage::Cuda(cc)) = (&*sx, &*sc) else { panic!("device tensors") };
            // The inputs as the device holds them (rounded to dt).
            let (xr, cr) = (cx.to_cpu().unwrap().to_f64_vec(), cc.to_cpu().unwrap().to_f64_vec());
            let mut want_cols = vec![0.0; c.len()];
            let mut want_gx = vec![0.0; x.len()];
            for &(e, at) in &taps {
                want_cols[e] = xr[at];
                want_gx[at] += cr[e];
            }
            // col2im sums at most k·k rounded entries in the accumulation type, rounded once.
            let tol = match dt {
                DType::F64 => 1e-12,
                DType::F32 => 1e-6,
                DType::BF16 => 8e-3,
                _ => 1e-3,
            };
            let mut outs = Vec::new();
            for width in [IndexWidth::Auto, IndexWidth::Wide] {
                let cols = conv::im2col_with(cx, &g, width).unwrap().to_cpu().unwrap().to_f64_vec();
                let gx = conv::col2im_with(cc, &g, width).unwrap().to_cpu().unwrap().to_f64_vec();
                assert!(cols == want_cols, "im2col {dt:?} {width:?} of {g:?}: not the input's copy (seed {seed})");
                for (e, (&got, &want)) in gx.iter().zip(&want_gx).enumerate() {
                    assert!((got - want).abs() <= tol * (1.0 + want.abs()), "col2im {dt:?} {width:?} pixel {e} of {g:?}: {got} vs {want} (seed {seed})");
                }
                outs.push((cols, gx));
            }
            assert!(outs[0] == outs[1], "{dt:?} {g:?}: the u32 and 64-bit kernels differ (seed {seed})");
        }
    }
}

/// The copy kernels by both index widths (u32 with host divisors, 64-bit)
/// equal the CPU's copies bit for bit, on shapes whose launches wrap the
/// capped grid, with size-1 dims (merged away on the u32 path).
#[test]
fn layout_copies_by_both_index_widths_equal_the_cpu() {
    use asrforge::backend::cuda::{fastdiv::IndexWidth, layout, CudaStorage};
    use asrforge::backend::Storage;
    let Some(dev) = gpu("layout_copies_by_both_index_widths_equal_the_cpu") else { return };
    let seed = fresh_seed();
    let v = Rng::new(seed).normal(3 * 37 * 13 * 11);
    for dt in [DType::F32, DType::F64, DType::BF16, DType::U8] {
        let vals: Vec<f64> = if dt == DType::U8 { v.iter().map(|x| (x * 40.0).abs().floor()).collect() } else { v.clone() };
        let x = common::tensor(&vals, &[3, 37, 13, 11], dt, &Device::Cpu);
        let x1 = ops::reshape(&x, [1, 37, 3, 1, 143]).unwrap();
        let head = ops::narrow(&x, 1, 0, 4).unwrap();
        let (xg, x1g, headg) = (x.clone().to_device(&dev).unwrap(), x1.clone().to_device(&dev).unwrap(), head.clone().to_device(&dev).unwrap());
        let (sx, sx1, sh) = (xg.storage(), x1g.storage(), headg.storage());
        let (Storage::Cuda(cx), Storage::Cuda(cx1), Storage::Cuda(ch)) = (&*sx, &*sx1, &*sh) else { panic!("device tensors") };
        for w in [IndexWidth::Auto, IndexWidth::Wide] {
            let check = |name: &str, got: CudaStorage, want: Tensor| {
                let got = got.to_cpu().unwrap();
                assert!(got == want.to_cpu_storage().unwrap(), "{name} {dt:?} {w:?}: differs from the CPU's copy (seed {seed})");
            };
            check("permute", layout::permute_with(cx, &[3, 37, 13, 11], &[2, 0, 3, 1], w).unwrap(), ops::permute(&x, &[2, 0, 3, 1]).unwrap());
            let p1 = [4, 1, 0, 3, 2];
            check("permute with unit dims", layout::permute_with(cx1, &[1, 37, 3, 1, 143], &p1, w).unwrap(), ops::permute(&x1, &p1).unwrap());
            check("narrow", layout::narrow_with(cx, 3, 37, 143, 5, 29, w).unwrap(), ops::narrow(&x, 1, 5, 29).unwrap());
            check("pad", layout::pad_with(cx, 3, 37, 143, 2, 3, -1.5, w).unwrap(), ops::pad(&x, 1, 2, 3, -1.5).unwrap());
            let want = ops::cat(&[&x, &head, &x], 1).unwrap();
            check("cat", layout::cat_with(&[cx, ch, cx], 3, &[37, 4, 37], 143, w).unwrap(), want);
        }
    }
}

#[test]
fn layout_gradients_match_the_cpu() {
    let Some(dev) = gpu("layout_gradients_match_the_cpu") else { return };
    both("permute", &dev, &[(&[3, 7, 1000], Normal, true)], &move |x| ops::permute(&x[0], &[1, 2, 0]));
    both("narrow", &dev, &[(&[3, 4097], Normal, true)], &move |x| ops::narrow(&x[0], 1, 7, 1000));
    both("pad", &dev, &[(&[7, 3], Normal, true)], &move |x| ops::pad(&x[0], 0, 2, 5, 0.5));
    both("cat", &dev, &[(&[2, 3, 7], Normal, true), (&[2, 1, 7], Normal, true), (&[2, 1000, 7], Normal, true)], &move |x| ops::cat(&[&x[0], &x[1], &x[2]], 1));
    both("stack", &dev, &[(&[1000], Normal, true), (&[1000], Normal, true)], &move |x| ops::stack(&[&x[0], &x[1]], 1));
}

// ---- dropout ----

/// The dropout mask of `n` ones in `dtype` on `dev`, drawn from seed `seed`,
/// with the generator state after the draw.
fn mask_on(dev: &Device, dtype: DType, n: usize, p: f64, seed: u64) -> (Vec<f64>, rng::Rng) {
    let ones = common::tensor(&vec![1.0; n], &[n], dtype, &Device::Cpu).to_device(dev).unwrap();
    rng::manual_seed(seed);
    let y = ops::dropout(&ones, p, true).unwrap();
    (y.to_f64_vec().unwrap(), rng::get_state())
}

#[test]
fn dropout_masks_equal_the_cpu_bit_for_bit() {
    let Some(dev) = gpu("dropout_masks_equal_the_cpu_bit_for_bit") else { return };
    let seed = fresh_seed();
    for n in [1, 7, 1000, 4097] {
        for p in [0.1, 0.5, 0.9] {
            for dt in [DType::F32, DType::F64] {
                let (want, st_c) = mask_on(&Device::Cpu, dt, n, p, seed);
                let (got, st_g) = mask_on(&dev, dt, n, p, seed);
                assert!(
                    got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "dropout n {n} p {p} {dt:?}: GPU mask differs from the CPU's (seed {seed})"
                );
                assert_eq!(st_g, st_c, "the generator advances the same on both devices");
            }
        }
    }
}

#[test]
fn half_precision_dropout_masks_follow_the_generator() {
    let Some(dev) = gpu("half_precision_dropout_masks_follow_the_generator") else { return };
    let (seed, n, p) = (fresh_seed(), 4097, 0.3);
    // The expected mask from the generator itself: keep where u < 1 − p.
    let keep = Rng::new(seed).bernoulli(n, 1.0 - p);
    for dt in [DType::F16, DType::BF16] {
        let scale = common::tensor(&[1.0 / (1.0 - p)], &[1], dt, &Device::Cpu).to_f64_vec().unwrap()[0];
        let want: Vec<f64> = keep.iter().map(|&k| if k { scale } else { 0.0 }).collect();
        let (got, _) = mask_on(&dev, dt, n, p, seed);
        assert_eq!(got, want, "{dt:?} dropout mask (seed {seed})");
    }
}

#[test]
fn dropout_recomputed_from_a_saved_state_is_the_same_mask() {
    let Some(dev) = gpu("dropout_recomputed_from_a_saved_state_is_the_same_mask") else { return };
    let x = Tensor::ones([3, 1000], DType::F32, &dev).unwrap();
    rng::manual_seed(fresh_seed());
    ops::dropout(&x, 0.2, true).unwrap();
    let saved = rng::get_state();
    let a = ops::dropout(&x, 0.2, true).unwrap().to_vec::<f32>().unwrap();
    let next = ops::dropout(&x, 0.2, true).unwrap().to_vec::<f32>().unwrap();
    rng::set_state(saved);
    let b = ops::dropout(&x, 0.2, true).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(a, b, "a recompute from the saved state draws the same mask");
    assert_ne!(a, next, "the next draw is a different mask");
}

/// Dropout's gradient is g times the forward's mask, redrawn from the
/// (seed, offset) the forward reserved: the same elements are dropped and
/// kept elements scaled by 1/(1−p), in every dtype, on both devices, also
/// when the generator has moved on (another draw) before the backward.
#[test]
fn dropout_backward_redraws_the_forward_mask() {
    let mut devs = vec![Device::Cpu];
    devs.extend(gpu("dropout_backward_redraws_the_forward_mask"));
    let (seed, n, p) = (fresh_seed(), 4097, 0.3);
    for dev in devs {
        for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            let x = common::tensor(&vec![1.0; n], &[n], dt, &Device::Cpu).to_device(&dev).unwrap().requires_grad_();
            rng::manual_seed(seed);
            let y = ops::dropout(&x, p, true).unwrap();
            ops::dropout(&x, p, true).unwrap();
            let gy = common::tensor(&vec![2.0; n], &[n], dt, &Device::Cpu).to_device(&dev).unwrap();
            asrforge::autograd::backward_with(&[(y.clone(), gy)]).unwrap();
            let (yv, gx) = (y.to_f64_vec().unwrap(), x.grad().unwrap().to_f64_vec().unwrap());
            for i in 0..n {
                assert_eq!(gx[i], 2.0 * yv[i], "{dt:?} on {dev:?}: element {i}: the gradient is 2 times the forward's mask (seed {seed})");
            }
            let kept = yv.iter().filter(|&&v| v != 0.0).count() as f64 / n as f64;
            assert!((kept - (1.0 - p)).abs() < 0.03, "{dt:?} on {dev:?}: kept {kept} of the elements, want about {} (seed {seed})", 1.0 - p);
        }
    }
}

#[test]
fn dropout_gradient_matches_the_cpu() {
    let Some(dev) = gpu("dropout_gradient_matches_the_cpu") else { return };
    let seed = fresh_seed();
    both("dropout", &dev, &[(&[7, 1000], Normal, true)], &move |x| {
        rng::manual_seed(seed);
        ops::dropout(&x[0], 0.3, true)
    });
}
