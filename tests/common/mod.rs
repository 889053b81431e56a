//! Shared test helpers: a finite-difference gradient check in f64 and small
//! model configs.
#![allow(dead_code)]

use asrforge::autograd::{backward, no_grad};
use asrforge::ops;
use asrforge::tensor::{DType, Device, Rng, Tensor};
use asrforge::Result;

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
