//! Finite-difference gradient checks in f64 for every layer.

mod common;

use asrforge::models::config::{Activation, ConvNorm, EncoderConfig, EncoderType, InputLayer, PosEncType};
use asrforge::models::convolution::ConvolutionModule;
use asrforge::models::decoder::DecoderLayer;
use asrforge::models::encoder::frame_pad_mask;
use asrforge::models::encoder_layer::EncoderLayer;
use asrforge::models::ffn::FeedForward;
use asrforge::models::pos_enc::PositionalEncoding;
use asrforge::models::subsampling::Subsampling;
use asrforge::models::GlobalCmvn;
use asrforge::nn::*;
use asrforge::tensor::{DType, Device, Rng, Tensor};
use common::{grad_check, input, weighted_sum, weights_like};

const F64: DType = DType::F64;
const TOL: f64 = 1e-6;

fn with_input(m: &dyn Module, x: &Tensor) -> Vec<(String, Tensor)> {
    let mut v = m.named_parameters();
    v.push(("input".into(), x.clone()));
    v
}

#[test]
fn linear_gradients() {
    let mut rng = Rng::new(1);
    let l = Linear::new(5, 4, true, F64, &mut rng).unwrap();
    let x = input(&[2, 3, 5], &mut rng);
    let w = weights_like(&[2, 3, 4], 2);
    let (err, n) = grad_check(&with_input(&l, &x), &|| weighted_sum(&l.forward(&x)?, &w), 64, TOL);
    assert_eq!(n, 4 * 5 + 4 + 30);
    assert!(err < TOL);
}

#[test]
fn layer_norm_gradients() {
    let mut rng = Rng::new(3);
    let l = LayerNorm::new(6, 1e-5, F64).unwrap();
    // Non-trivial affine parameters so their gradients are exercised.
    l.weight.assign(&Tensor::randn([6], 1.0, 0.3, F64, &mut rng, &Device::Cpu).unwrap()).unwrap();
    let x = input(&[3, 6], &mut rng);
    let w = weights_like(&[3, 6], 4);
    let (err, n) = grad_check(&with_input(&l, &x), &|| weighted_sum(&l.forward(&x)?, &w), 64, TOL);
    assert_eq!(n, 6 + 6 + 18);
    assert!(err < TOL);
}

#[test]
fn batch_norm_gradients_train_and_eval() {
    let mut rng = Rng::new(5);
    let mut bn = BatchNorm1d::new(3, 1e-5, F64).unwrap();
    let x = input(&[2, 3, 4], &mut rng);
    let w = weights_like(&[2, 3, 4], 6);
    let (err, _) = grad_check(&with_input(&bn, &x), &|| weighted_sum(&bn.forward(&x)?, &w), 64, TOL);
    assert!(err < TOL);
    // Every training forward moved the running stats and counted a batch.
    assert!(bn.num_batches_tracked.to_vec::<i64>().unwrap()[0] > 0);
    assert_ne!(bn.running_mean.to_f64_vec().unwrap(), vec![0.0; 3]);
    bn.train(false);
    let tracked = bn.num_batches_tracked.to_vec::<i64>().unwrap()[0];
    let (err, _) = grad_check(&with_input(&bn, &x), &|| weighted_sum(&bn.forward(&x)?, &w), 64, TOL);
    assert!(err < TOL);
    assert_eq!(bn.num_batches_tracked.to_vec::<i64>().unwrap()[0], tracked, "eval must not count batches");
}

#[test]
fn conv_gradients() {
    let mut rng = Rng::new(7);
    let pw = Conv1d::pointwise(3, 4, true, F64, &mut rng).unwrap();
    let x = input(&[2, 3, 5], &mut rng);
    let w = weights_like(&[2, 4, 5], 8);
    assert!(grad_check(&with_input(&pw, &x), &|| weighted_sum(&pw.forward(&x)?, &w), 64, TOL).0 < TOL);

    let dw = Conv1d::depthwise(3, 3, 1, true, F64, &mut rng).unwrap();
    let w = weights_like(&[2, 3, 5], 9);
    assert!(grad_check(&with_input(&dw, &x), &|| weighted_sum(&dw.forward(&x)?, &w), 64, TOL).0 < TOL);

    let c2 = Conv2d::new(2, 3, 3, 2, 0, F64, &mut rng).unwrap();
    let x2 = input(&[2, 2, 7, 6], &mut rng);
    let w = weights_like(&[2, 3, 3, 2], 10);
    assert!(grad_check(&with_input(&c2, &x2), &|| weighted_sum(&c2.forward(&x2)?, &w), 64, TOL).0 < TOL);
}

#[test]
fn embedding_gradients() {
    let mut rng = Rng::new(11);
    let e = Embedding::new(5, 3, F64, &mut rng).unwrap();
    let ids = Tensor::from_vec(vec![0i64, 3, 3, 4], [2, 2], &Device::Cpu).unwrap();
    let w = weights_like(&[2, 2, 3], 12);
    let (err, n) = grad_check(&e.named_parameters(), &|| weighted_sum(&e.forward(&ids)?, &w), 64, TOL);
    assert_eq!(n, 15);
    assert!(err < TOL);
    // Row 3 was looked up twice, so its gradient is the sum of both output rows' weights.
    let g = e.weight.grad().unwrap().to_f64_vec().unwrap();
    let wv = w.to_f64_vec().unwrap();
    assert!((g[9] - (wv[3] + wv[6])).abs() < 1e-12);
    assert_eq!(&g[3..6], &[0.0, 0.0, 0.0]);
}

#[test]
fn attention_gradients_with_padding_mask() {
    let mut rng = Rng::new(13);
    let a = MultiHeadedAttention::new(2, 6, 0.0, F64, &mut rng).unwrap();
    let q = input(&[2, 3, 6], &mut rng);
    let kv = input(&[2, 4, 6], &mut rng);
    let mask = AttentionMask::key_padding(&[4, 2], 4).unwrap();
    let w = weights_like(&[2, 3, 6], 14);
    let mut wrt = a.named_parameters();
    wrt.push(("q".into(), q.clone()));
    wrt.push(("kv".into(), kv.clone()));
    let (err, _) = grad_check(&wrt, &|| weighted_sum(&a.forward(&q, &kv, &kv, Some(&mask))?, &w), 40, TOL);
    assert!(err < TOL);
    // Masked keys of the second sequence get no gradient.
    let g = kv.grad().unwrap().to_f64_vec().unwrap();
    assert!(g[24 + 12..].iter().all(|&v| v == 0.0));
}

#[test]
fn rel_attention_gradients() {
    let mut rng = Rng::new(15);
    let a = RelPositionMultiHeadedAttention::new(2, 6, 0.0, F64, &mut rng).unwrap();
    let x = input(&[2, 4, 6], &mut rng);
    let pos = input(&[1, 4, 6], &mut rng);
    let mask = AttentionMask::key_padding(&[4, 3], 4).unwrap();
    let w = weights_like(&[2, 4, 6], 16);
    let mut wrt = a.named_parameters();
    assert_eq!(wrt.iter().map(|(n, _)| n.as_str()).take(2).collect::<Vec<_>>(), ["pos_bias_u", "pos_bias_v"]);
    wrt.push(("x".into(), x.clone()));
    wrt.push(("pos".into(), pos.clone()));
    let (err, _) = grad_check(&wrt, &|| weighted_sum(&a.forward(&x, &x, &x, Some(&mask), &pos)?, &w), 40, TOL);
    assert!(err < TOL);
}

#[test]
fn front_end_gradients() {
    let mut rng = Rng::new(17);
    let cmvn = GlobalCmvn::new(&[0.5, -1.0, 2.0], &[2.0, 0.5, 1.5], F64).unwrap();
    let x = input(&[2, 4, 3], &mut rng);
    let w = weights_like(&[2, 4, 3], 18);
    assert!(grad_check(&[("x".into(), x.clone())], &|| weighted_sum(&cmvn.forward(&x)?, &w), 64, TOL).0 < TOL);

    for kind in [InputLayer::Conv2d, InputLayer::Conv2d6, InputLayer::Conv2d8, InputLayer::Linear] {
        let sub = Subsampling::new(kind, 17, 4, 0.0, (PosEncType::Abs, 0.0), F64, &mut rng).unwrap();
        let x = input(&[2, 19, 17], &mut rng);
        let (y, _, lens) = sub.forward(&x, &[19, 15]).unwrap();
        let w = weights_like(y.dims(), 19);
        let (err, _) = grad_check(&with_input(&sub, &x), &|| weighted_sum(&sub.forward(&x, &[19, 15])?.0, &w), 12, TOL);
        assert!(err < TOL, "{kind:?}");
        let expect: Vec<usize> = match kind {
            InputLayer::Conv2d => vec![4, 3],  // ((19-1)//2-1)//2 = 4, ((15-1)//2-1)//2 = 3
            InputLayer::Conv2d6 => vec![2, 1], // ((19-1)//2-2)//3 = 2, ((15-1)//2-2)//3 = 1
            InputLayer::Conv2d8 => vec![1, 1], // (((19-1)//2-1)//2-1)//2 = 1
            InputLayer::Linear => vec![19, 15],
        };
        assert_eq!(lens, expect, "{kind:?}");
        assert_eq!(y.dims()[1], expect[0]);
    }

    let pe = PositionalEncoding::new(PosEncType::Rel, 4, 0.0, F64).unwrap();
    let x = input(&[1, 3, 4], &mut rng);
    let (y, p) = pe.forward(&x).unwrap();
    assert_eq!(p.dims(), &[1, 3, 4]);
    // Row 1 of the table: sin(1), cos(1), sin(1/100), cos(1/100) for d = 4.
    let pv = p.to_f64_vec().unwrap();
    let want = [1f64.sin(), 1f64.cos(), 0.01f64.sin(), 0.01f64.cos()];
    for (a, b) in pv[4..8].iter().zip(want) {
        assert!((a - b).abs() < 1e-12);
    }
    let (xv, yv) = (x.to_f64_vec().unwrap(), y.to_f64_vec().unwrap());
    assert!(xv.iter().zip(&yv).all(|(a, b)| (a * 2.0 - b).abs() < 1e-12), "rel_pos scales by sqrt(d) = 2");
}

fn ffn(rng: &mut Rng) -> FeedForward {
    FeedForward::new(6, 10, 0.0, Activation::Swish, F64, rng).unwrap()
}

#[test]
fn ffn_and_convolution_module_gradients() {
    let mut rng = Rng::new(19);
    let f = ffn(&mut rng);
    let x = input(&[2, 3, 6], &mut rng);
    let w = weights_like(&[2, 3, 6], 20);
    assert!(grad_check(&with_input(&f, &x), &|| weighted_sum(&f.forward(&x)?, &w), 20, TOL).0 < TOL);

    for (norm, causal) in [(ConvNorm::BatchNorm, false), (ConvNorm::LayerNorm, false), (ConvNorm::LayerNorm, true)] {
        let c = ConvolutionModule::new(6, 3, Activation::Swish, norm, causal, 1e-5, F64, &mut rng).unwrap();
        let pad = frame_pad_mask(&[3, 2], 3).unwrap();
        let (err, _) = grad_check(&with_input(&c, &x), &|| weighted_sum(&c.forward(&x, Some(&pad))?, &w), 12, TOL);
        assert!(err < TOL, "{norm:?} causal={causal}");
        // Padded frames come out as zeros and get no gradient.
        let y = c.forward(&x, Some(&pad)).unwrap().to_f64_vec().unwrap();
        assert!(y[18 + 12..].iter().all(|&v| v == 0.0));
    }
}

#[test]
fn encoder_and_decoder_layer_gradients() {
    let mut rng = Rng::new(21);
    let d = 6;
    let c = EncoderConfig {
        output_size: d,
        attention_heads: 2,
        linear_units: 10,
        cnn_module_kernel: 3,
        dropout_rate: 0.0,
        attention_dropout_rate: 0.0,
        ..EncoderConfig::defaults(EncoderType::Conformer).unwrap()
    };
    let layer = EncoderLayer::new(&c, true, F64, &mut rng).unwrap();
    let x = input(&[2, 4, d], &mut rng);
    let pos = input(&[1, 4, d], &mut rng);
    let mask = AttentionMask::key_padding(&[4, 3], 4).unwrap();
    let pad = frame_pad_mask(&[4, 3], 4).unwrap();
    let w = weights_like(&[2, 4, d], 22);
    let (err, n) = grad_check(&with_input(&layer, &x), &|| weighted_sum(&layer.forward(&x, Some(&mask), &pos, Some(&pad))?, &w), 6, TOL);
    assert!(err < TOL);
    assert!(n > 100);

    let dl = DecoderLayer {
        self_attn: MultiHeadedAttention::new(2, d, 0.0, F64, &mut rng).unwrap(),
        src_attn: MultiHeadedAttention::new(2, d, 0.0, F64, &mut rng).unwrap(),
        feed_forward: FeedForward::new(d, 10, 0.0, Activation::Relu, F64, &mut rng).unwrap(),
        norm1: LayerNorm::new(d, 1e-5, F64).unwrap(),
        norm2: LayerNorm::new(d, 1e-5, F64).unwrap(),
        norm3: LayerNorm::new(d, 1e-5, F64).unwrap(),
        dropout: Dropout::new(0.0),
        normalize_before: true,
    };
    let y = input(&[2, 3, d], &mut rng);
    let tgt = AttentionMask::causal_padding(&[3, 2], 3).unwrap();
    let w = weights_like(&[2, 3, d], 23);
    let mut wrt = with_input(&dl, &y);
    wrt.push(("memory".into(), x.clone()));
    let (err, _) = grad_check(&wrt, &|| weighted_sum(&dl.forward(&y, &tgt, &x, &mask)?, &w), 6, TOL);
    assert!(err < TOL);
}

#[test]
fn to_dtype_passes_the_gradient_back_in_the_input_dtype() {
    let mut rng = Rng::new(23);
    let x = input(&[2, 3], &mut rng);
    let w = weights_like(&[2, 3], 24);
    // f64 → f32 → f64 is the identity up to f32 rounding; its gradient is w rounded through f32.
    let y = asrforge::ops::to_dtype(&asrforge::ops::to_dtype(&x, DType::F32).unwrap(), F64).unwrap();
    let yv = y.to_f64_vec().unwrap();
    assert!(x.to_f64_vec().unwrap().iter().zip(&yv).all(|(a, b)| (a - b).abs() <= 1e-7 * a.abs().max(1.0)));
    asrforge::autograd::backward(&weighted_sum(&y, &w).unwrap()).unwrap();
    let g = x.grad().unwrap();
    assert_eq!(g.dtype(), F64);
    let want: Vec<f64> = w.to_f64_vec().unwrap().iter().map(|&v| v as f32 as f64).collect();
    assert_eq!(g.to_f64_vec().unwrap(), want);
    // Same dtype: the same handle, nothing recorded.
    assert!(asrforge::ops::to_dtype(&x, F64).unwrap().same_storage(&x));
}
