//! The tape: accumulation, no_grad, freeing after backward, and activation
//! checkpointing (same gradients, fewer saved activations, same dropout mask).

mod common;

use asrforge::autograd::{self, checkpoint};
use asrforge::ops;
use asrforge::tensor::{rng, Rng};
use asrforge::{DType, Device, Tensor};

fn randn(shape: &[usize], rng: &mut Rng) -> Tensor {
    Tensor::randn(shape.to_vec(), 0.0, 1.0, DType::F64, rng, &Device::Cpu).unwrap()
}

#[test]
fn gradients_accumulate_across_backward_calls_until_zero_grad() {
    let x = Tensor::from_vec(vec![1.0f64, -2.0, 3.0], [3], &Device::Cpu).unwrap().requires_grad_();
    for _ in 0..2 {
        let y = ops::sum_all(&ops::mul(&x, &x).unwrap()).unwrap();
        autograd::backward(&y).unwrap();
    }
    assert_eq!(x.grad().unwrap().to_vec::<f64>().unwrap(), vec![4.0, -8.0, 12.0]);
    x.zero_grad();
    assert!(x.grad().is_none());
    // A leaf used twice in one graph gets the sum of both paths.
    let y = ops::sum_all(&ops::add(&ops::mul_scalar(&x, 3.0).unwrap(), &x).unwrap()).unwrap();
    autograd::backward(&y).unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f64>().unwrap(), vec![4.0, 4.0, 4.0]);
}

#[test]
fn no_grad_records_nothing_and_backward_on_it_is_an_error() {
    let x = Tensor::ones([4], DType::F32, &Device::Cpu).unwrap().requires_grad_();
    let y = autograd::no_grad(|| ops::sum_all(&ops::exp(&x).unwrap()).unwrap());
    assert_eq!(autograd::tape_len(), 0);
    assert!(!y.requires_grad());
    let e = autograd::backward(&y).unwrap_err().to_string();
    assert!(e.contains("does not require grad"), "{e}");
    // Ops on tensors that need no grad record nothing either.
    let c = Tensor::ones([4], DType::F32, &Device::Cpu).unwrap();
    let _ = ops::exp(&c).unwrap();
    assert_eq!(autograd::tape_len(), 0);
    let e = autograd::backward(&ops::exp(&x).unwrap()).unwrap_err().to_string();
    assert!(e.contains("one-element"), "{e}");
    autograd::clear_tape();
}

#[test]
fn the_tape_frees_everything_after_backward_over_100_steps() {
    let mut rng = Rng::new(1);
    let w = randn(&[32, 32], &mut rng).requires_grad_();
    let x = randn(&[16, 32], &mut rng);
    let mut after_first = 0;
    for step in 0..100 {
        let h = ops::tanh(&ops::matmul(&x, &w).unwrap()).unwrap();
        let y = ops::sum_all(&ops::softmax(&h).unwrap()).unwrap();
        assert!(autograd::tape_len() > 0 && autograd::tape_saved_bytes() > 0);
        autograd::backward(&y).unwrap();
        w.zero_grad();
        assert_eq!(autograd::tape_len(), 0);
        assert_eq!(autograd::tape_saved_bytes(), 0);
        drop((h, y));
        let live = asrforge::tensor::live_bytes();
        if step == 0 {
            after_first = live;
        }
        // Other tests in this process allocate concurrently; bound the growth
        // well below what 100 steps of leaked activations would hold (~1 MB).
        assert!(live <= after_first + (1 << 20), "live bytes grew from {after_first} to {live} by step {step}");
    }
}

fn block(x: &Tensor, w1: &Tensor, w2: &Tensor) -> asrforge::Result<Tensor> {
    let h = ops::dropout(&ops::silu(&ops::matmul(x, w1)?)?, 0.25, true)?;
    ops::layer_norm(&ops::add(x, &ops::matmul(&h, w2)?)?, None, None, 1e-5)
}

#[test]
fn checkpoint_gives_the_same_gradients_with_fewer_saved_activations() {
    let mut rng = Rng::new(common::fresh_seed());
    let x = randn(&[8, 16], &mut rng).requires_grad_();
    let ws: Vec<Tensor> = (0..6).map(|_| randn(&[16, 16], &mut rng).requires_grad_()).collect();
    let run = |ckpt: bool| {
        rng::manual_seed(42);
        let mut h = x.clone();
        for l in 0..3 {
            let (w1, w2) = (ws[2 * l].clone(), ws[2 * l + 1].clone());
            h = if ckpt { checkpoint(move |xs: &[Tensor]| Ok(vec![block(&xs[0], &w1, &w2)?]), &[h]).unwrap().remove(0) } else { block(&h, &w1, &w2).unwrap() };
        }
        let y = ops::sum_all(&ops::mul(&h, &h).unwrap()).unwrap();
        let saved = autograd::tape_saved_bytes();
        let value = y.to_scalar().unwrap();
        autograd::backward(&y).unwrap();
        let grads: Vec<Vec<f64>> = std::iter::once(&x).chain(ws.iter()).map(|t| t.grad().unwrap().to_f64_vec().unwrap()).collect();
        x.zero_grad();
        ws.iter().for_each(|w| w.zero_grad());
        (value, saved, grads)
    };
    let (v0, saved0, g0) = run(false);
    let (v1, saved1, g1) = run(true);
    assert_eq!(v0, v1, "the forward values agree");
    for (a, b) in g0.iter().zip(&g1) {
        // Same ops in the same order (dropout masks replayed): bitwise equal.
        assert_eq!(a, b);
    }
    assert!(saved1 * 3 < saved0, "checkpointing saved {saved1} bytes, plain {saved0}");
}
