//! Shared test helpers: random inputs, the finite-difference gradient check
//! and the backend-generic runner. A test names an op and its inputs; the
//! helpers run it on every available device and compare with the CPU.
#![allow(dead_code)]

pub mod gpu;
pub mod tempdir;

use asrforge::autograd::{self, backward, no_grad};
use asrforge::ops;
use asrforge::tensor::Rng;
use asrforge::{DType, Device, Result, Tensor};

/// A seed that changes from run to run (fresh inputs), printed on failure.
pub fn fresh_seed() -> u64 {
    if let Ok(s) = std::env::var("ASRFORGE_TEST_SEED") {
        if let Ok(v) = s.parse() {
            return v;
        }
    }
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    (t as u64) ^ ((t >> 64) as u64)
}

/// How to draw an input.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// Standard normal.
    Normal,
    /// Uniform in (0.5, 2): for log, sqrt, division.
    Positive,
    /// |x| in (0.2, 1.2) with random sign: away from the kinks of relu/abs.
    AwayFromZero,
    /// A permutation of distinct, well-separated values (for max).
    Distinct,
}

/// An f64 input of `shape` drawn as `kind`.
pub fn draw(rng: &mut Rng, shape: &[usize], kind: Kind) -> Vec<f64> {
    let n: usize = shape.iter().product();
    match kind {
        Kind::Normal => rng.normal(n),
        Kind::Positive => rng.uniform(n).into_iter().map(|u| 0.5 + 1.5 * u).collect(),
        Kind::AwayFromZero => rng.uniform(2 * n).chunks(2).map(|c| (0.2 + c[0]) * if c[1] < 0.5 { -1.0 } else { 1.0 }).collect(),
        Kind::Distinct => {
            let mut v: Vec<f64> = (0..n).map(|i| i as f64 * 0.1).collect();
            for i in (1..n).rev() {
                let j = rng.below(i + 1);
                v.swap(i, j);
            }
            v
        }
    }
}

/// A tensor from f64 values converted to `dtype`.
pub fn tensor(v: &[f64], shape: &[usize], dtype: DType, dev: &Device) -> Tensor {
    let t = Tensor::from_vec(v.to_vec(), shape.to_vec(), &Device::Cpu).expect("test tensor");
    let t = match dtype {
        DType::F64 => t,
        _ => {
            let s = t.to_cpu_storage().expect("cpu").to_dtype(dtype);
            Tensor::from_cpu(s, shape.to_vec()).expect("cast")
        }
    };
    t.to_device(dev).expect("to device")
}

/// The op under test: maps input tensors to one output.
pub type OpFn = dyn Fn(&[Tensor]) -> Result<Tensor>;

/// `Σ f(x)·r` for a fixed random `r`: a scalar whose gradient reaches every output element.
fn weighted(f: &OpFn, xs: &[Tensor], r: &[f64]) -> Result<Tensor> {
    let y = f(xs)?;
    // A half output (the CPU has no half arithmetic) is weighed in f32; its
    // gradient reaches the op through the cast, rounded to the half type.
    let y = if matches!(y.dtype(), DType::F16 | DType::BF16) { asrforge::ops::to_dtype(&y, DType::F32)? } else { y };
    let rt = tensor(&r[..y.elem_count()], y.dims(), y.dtype(), &y.device());
    asrforge::ops::sum_all(&asrforge::ops::mul(&y, &rt)?)
}

/// Output and input gradients of `f` on `dev` in `dtype` (grads only for `grad_mask` inputs).
pub fn run_with_grads(
    f: &OpFn,
    vals: &[(Vec<f64>, Vec<usize>)],
    grad_mask: &[bool],
    r: &[f64],
    dtype: DType,
    dev: &Device,
) -> (Vec<f64>, Vec<Option<Vec<f64>>>) {
    let xs: Vec<Tensor> = vals
        .iter()
        .zip(grad_mask)
        .map(|((v, s), &g)| {
            let t = tensor(v, s, dtype, dev);
            if g {
                t.requires_grad_()
            } else {
                t
            }
        })
        .collect();
    let out = autograd::no_grad(|| f(&xs)).expect("forward").to_f64_vec().expect("read output");
    let loss = weighted(f, &xs, r).expect("loss");
    autograd::backward(&loss).expect("backward");
    let grads =
        xs.iter().zip(grad_mask).map(|(x, &g)| if g { Some(x.grad().expect("a gradient reached the input").to_f64_vec().unwrap()) } else { None }).collect();
    assert_eq!(autograd::tape_len(), 0, "backward must empty the tape");
    (out, grads)
}

/// Finite-difference gradient check in f64 on the CPU, then the same op on
/// every other available device compared with the CPU's output and gradients.
/// `vals`: inputs; `grad_mask`: which inputs are differentiated.
pub fn check_grad(name: &str, f: &OpFn, vals: Vec<(Vec<f64>, Vec<usize>)>, grad_mask: &[bool], seed: u64) {
    let mut rng = Rng::new(seed ^ 0x5eed);
    let y0 = f(&vals.iter().map(|(v, s)| tensor(v, s, DType::F64, &Device::Cpu)).collect::<Vec<_>>()).expect("forward");
    let r = rng.normal(y0.elem_count().max(1));
    let (out, grads) = run_with_grads(f, &vals, grad_mask, &r, DType::F64, &Device::Cpu);
    let h = 1e-6;
    for (i, g) in grads.iter().enumerate() {
        let Some(g) = g else { continue };
        let mut num = vec![0.0; g.len()];
        for j in 0..g.len() {
            let eval = |d: f64| {
                let xs: Vec<Tensor> = vals
                    .iter()
                    .enumerate()
                    .map(|(k, (v, s))| {
                        let mut v = v.clone();
                        if k == i {
                            v[j] += d;
                        }
                        tensor(&v, s, DType::F64, &Device::Cpu)
                    })
                    .collect();
                autograd::no_grad(|| weighted(f, &xs, &r)).expect("loss").to_scalar().unwrap()
            };
            num[j] = (eval(h) - eval(-h)) / (2.0 * h);
        }
        let diff: f64 = g.iter().zip(&num).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
        let norm: f64 = g.iter().map(|a| a * a).sum::<f64>().sqrt() + num.iter().map(|a| a * a).sum::<f64>().sqrt();
        let rel = if norm > 0.0 { diff / norm } else { diff };
        assert!(rel < 1e-6, "{name}: input {i}: gradient relative error {rel:e} (seed {seed})\nanalytic {g:?}\nnumeric  {num:?}");
        for (j, (a, b)) in g.iter().zip(&num).enumerate() {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{name}: input {i} element {j}: analytic {a} vs numeric {b} (seed {seed})");
        }
        assert!(g.iter().all(|v| v.is_finite()), "{name}: non-finite gradient (seed {seed})");
    }
    // The GPU column: the same op in f32 on Cuda(0) against the CPU's f64.
    if let Some(dev) = gpu::gpu(name) {
        compare_device(name, f, &vals, grad_mask, &r, &out, &grads, &dev, seed);
    }
}

/// The op on `dev` in f32 against the CPU's f64 results (the harness's f32 tolerance).
#[allow(clippy::too_many_arguments)]
fn compare_device(
    name: &str,
    f: &OpFn,
    vals: &[(Vec<f64>, Vec<usize>)],
    mask: &[bool],
    r: &[f64],
    out: &[f64],
    grads: &[Option<Vec<f64>>],
    dev: &Device,
    seed: u64,
) {
    let (o, g) = run_with_grads(f, vals, mask, r, DType::F32, dev);
    gpu::assert_close(&format!("{name} on {dev:?} output"), &o, out, gpu::F32, seed);
    for (i, (a, b)) in g.iter().zip(grads).enumerate() {
        if let (Some(a), Some(b)) = (a, b) {
            gpu::assert_close(&format!("{name} on {dev:?} gradient of input {i}"), a, b, gpu::F32, seed);
        }
    }
}

/// Asserts two vectors agree elementwise to `tol` (absolute).
pub fn assert_vec(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: got {got:?}, want {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g == w || (g - w).abs() <= tol, "{what}: element {i}: got {g}, want {w}\n got {got:?}\nwant {want:?}");
    }
}

// ---- model-level gradient checks (sampled elements) and configs ----

/// Step of the central differences.
const H: f64 = 1e-5;

/// The central-difference check: for up to `per_tensor` elements of every
/// tensor in `wrt` (spread over the tensor, first and last included), the
/// analytic gradient of `f` must match (f(x+h) − f(x−h))/2h to a relative
/// error |a − n| / max(|a|, |n|, 1e-3) below `tol`. Returns the largest
/// error seen and how many elements were checked.
pub fn grad_check(wrt: &[(String, Tensor)], f: &dyn Fn() -> Result<Tensor>, per_tensor: usize, tol: f64) -> (f64, usize) {
    for (_, t) in wrt {
        t.zero_grad();
    }
    let loss = f().expect("forward");
    backward(&loss).expect("backward");
    let mut worst = 0.0f64;
    let mut checked = 0;
    for (name, t) in wrt {
        assert_eq!(t.dtype(), DType::F64, "{name}: gradient checks run in f64");
        let analytic = match t.grad() {
            Some(g) => g.to_f64_vec().unwrap(),
            None => vec![0.0; t.elem_count()],
        };
        let orig = t.to_f64_vec().unwrap();
        let n = orig.len();
        let picks: Vec<usize> = if n <= per_tensor { (0..n).collect() } else { (0..per_tensor).map(|k| k * (n - 1) / (per_tensor - 1).max(1)).collect() };
        for &i in &picks {
            let mut v = orig.clone();
            let eval = |v: &Vec<f64>| -> f64 {
                t.assign(&Tensor::from_vec(v.clone(), t.shape().clone(), &Device::Cpu).unwrap()).unwrap();
                no_grad(|| f().expect("forward").to_scalar().unwrap())
            };
            v[i] = orig[i] + H;
            let up = eval(&v);
            v[i] = orig[i] - H;
            let down = eval(&v);
            let num = (up - down) / (2.0 * H);
            let a = analytic[i];
            let err = (a - num).abs() / a.abs().max(num.abs()).max(1e-3);
            assert!(err < tol, "{name}[{i}]: analytic {a:.12e} vs numeric {num:.12e} (relative error {err:.3e})");
            worst = worst.max(err);
            checked += 1;
        }
        t.assign(&Tensor::from_vec(orig, t.shape().clone(), &Device::Cpu).unwrap()).unwrap();
    }
    (worst, checked)
}

/// A random f64 input that requires grad.
pub fn input(shape: &[usize], rng: &mut Rng) -> Tensor {
    Tensor::randn(shape.to_vec(), 0.0, 1.0, DType::F64, rng, &Device::Cpu).unwrap().requires_grad_()
}

/// `Σ y·w` for a fixed random `w` of y's shape: a scalar whose gradient reaches every output.
pub fn weighted_sum(y: &Tensor, w: &Tensor) -> Result<Tensor> {
    ops::sum_all(&ops::mul(y, w)?)
}

/// A fixed random weight for `weighted_sum`.
pub fn weights_like(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn(shape.to_vec(), 0.0, 1.0, DType::F64, &mut Rng::new(seed), &Device::Cpu).unwrap()
}

/// A tiny conformer + bitransformer config (2 blocks, d = 8), dropout 0.
pub const TINY_F64_YAML: &str = "
input_dim: 9
output_dim: 7
encoder: conformer
encoder_conf:
  output_size: 8
  attention_heads: 2
  linear_units: 12
  num_blocks: 2
  dropout_rate: 0.0
  positional_dropout_rate: 0.0
  attention_dropout_rate: 0.0
  input_layer: conv2d
  cnn_module_kernel: 3
  pos_enc_layer_type: rel_pos
  selfattention_layer_type: rel_selfattn
decoder: bitransformer
decoder_conf:
  attention_heads: 2
  linear_units: 12
  num_blocks: 2
  r_num_blocks: 1
  dropout_rate: 0.0
  positional_dropout_rate: 0.0
model_conf:
  ctc_weight: 0.3
  lsm_weight: 0.1
  reverse_weight: 0.3
  length_normalized_loss: false
";
