//! The whole AsrModel on a tiny config (2 blocks, d = 8) in f64: gradients
//! against central differences, activation checkpointing giving the same
//! gradients with less saved memory, and the loss branches.

mod common;

use asrforge::autograd::{backward, clear_tape, tape_saved_bytes};
use asrforge::models::{config::ModelConfig, AsrModel};
use asrforge::nn::Module;
use asrforge::tensor::{DType, Device, Rng, Tensor};
use common::{grad_check, TINY_F64_YAML};

fn tiny(yaml: &str, seed: u64) -> AsrModel {
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).unwrap();
    let (cfg, warnings) = ModelConfig::from_yaml(&v).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    AsrModel::with_cmvn(&cfg, None, DType::F64, &mut Rng::new(seed)).unwrap()
}

fn batch(rng: &mut Rng) -> (Tensor, Vec<usize>, Tensor, Vec<usize>) {
    let feats = Tensor::randn([2, 19, 9], 0.0, 1.0, DType::F64, rng, &Device::Cpu).unwrap();
    let target = Tensor::from_vec(vec![1i64, 2, 3, 4, -1, -1], [2, 3], &Device::Cpu).unwrap();
    (feats, vec![19, 16], target, vec![3, 1])
}

#[test]
fn full_model_gradients_match_finite_differences() {
    let m = tiny(TINY_F64_YAML, 1);
    let mut rng = Rng::new(2);
    let (feats, fl, target, tl) = batch(&mut rng);
    let f = || Ok(m.forward(&feats, &fl, &target, &tl)?.loss);
    let params = m.named_parameters();
    let (err, n) = grad_check(&params, &f, 3, 1e-6);
    assert!(err < 1e-6);
    // Every parameter tensor took part (3 elements each, fewer for the tiny ones).
    assert!(n >= 2 * params.len(), "{n} elements over {} tensors", params.len());
    // Both decoders and the CTC head received gradients.
    for key in ["ctc.ctc_lo.weight", "decoder.left_decoder.output_layer.weight", "decoder.right_decoder.output_layer.weight", "encoder.embed.conv.0.weight"] {
        let p = params.iter().find(|(k, _)| k == key).unwrap_or_else(|| panic!("{key}"));
        assert!(p.1.grad().unwrap().to_f64_vec().unwrap().iter().any(|&g| g != 0.0), "{key}");
    }
}

fn grads(m: &AsrModel, feats: &Tensor, fl: &[usize], target: &Tensor, tl: &[usize]) -> (Vec<Vec<f64>>, usize, f64) {
    m.zero_grad();
    let loss = m.forward(feats, fl, target, tl).unwrap().loss;
    let saved = tape_saved_bytes();
    backward(&loss).unwrap();
    let g = m.parameters().iter().map(|p| p.grad().map(|g| g.to_f64_vec().unwrap()).unwrap_or_default()).collect();
    (g, saved, loss.to_scalar().unwrap())
}

#[test]
fn gradient_checkpointing_gives_same_gradients_with_less_saved_memory() {
    let yaml = TINY_F64_YAML.replace("dropout_rate: 0.0\n  positional", "dropout_rate: 0.1\n  positional");
    let plain = tiny(&yaml, 3);
    let ck_yaml = yaml
        .replace("  num_blocks: 2\n  dropout", "  num_blocks: 2\n  gradient_checkpointing: true\n  dropout")
        .replace("  r_num_blocks: 1\n", "  r_num_blocks: 1\n  gradient_checkpointing: true\n");
    let ck = tiny(&ck_yaml, 3);
    assert!(ck.encoder.gradient_checkpointing);
    assert!(ck.decoder_gradient_checkpointing());
    let mut rng = Rng::new(4);
    let (feats, fl, target, tl) = batch(&mut rng);
    clear_tape();
    asrforge::tensor::rng::manual_seed(7);
    let (g1, bytes1, l1) = grads(&plain, &feats, &fl, &target, &tl);
    asrforge::tensor::rng::manual_seed(7);
    let (g2, bytes2, l2) = grads(&ck, &feats, &fl, &target, &tl);
    assert_eq!(l1, l2, "same dropout masks, same loss");
    for (a, b) in g1.iter().zip(&g2) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-12 * x.abs().max(1.0), "{x} vs {y}");
        }
    }
    assert!(bytes2 < bytes1, "checkpointed tape keeps {bytes2} bytes, plain {bytes1}");
}

#[test]
fn ctc_weight_zero_and_one_skip_the_unused_branch() {
    let mut rng = Rng::new(5);
    let (feats, fl, target, tl) = batch(&mut rng);
    let mixed = tiny(TINY_F64_YAML, 6).forward(&feats, &fl, &target, &tl).unwrap();
    let (c, a) = (mixed.loss_ctc.unwrap().to_scalar().unwrap(), mixed.loss_att.unwrap().to_scalar().unwrap());
    assert!((mixed.loss.to_scalar().unwrap() - (0.3 * c + 0.7 * a)).abs() < 1e-12);
    let acc = mixed.th_accuracy.unwrap().to_scalar().unwrap();
    assert!((0.0..=1.0).contains(&acc));

    let only_ctc = tiny(&TINY_F64_YAML.replace("ctc_weight: 0.3", "ctc_weight: 1.0"), 6).forward(&feats, &fl, &target, &tl).unwrap();
    assert!(only_ctc.loss_att.is_none() && only_ctc.th_accuracy.is_none());
    assert_eq!(only_ctc.loss.to_scalar().unwrap(), c);

    let only_att = tiny(&TINY_F64_YAML.replace("ctc_weight: 0.3", "ctc_weight: 0.0"), 6).forward(&feats, &fl, &target, &tl).unwrap();
    assert!(only_att.loss_ctc.is_none());
    assert_eq!(only_att.loss.to_scalar().unwrap(), a);
    assert_eq!(only_att.th_accuracy.unwrap().to_scalar().unwrap(), acc);
}

#[test]
fn sos_eos_and_accuracy_follow_wenet() {
    use asrforge::models::asr_model::add_sos_eos;
    use asrforge::ops::token_accuracy;
    let s = add_sos_eos(&[vec![3, 4], vec![5]], 6, 6, -1).unwrap();
    assert_eq!(s.ys_in.to_vec::<i64>().unwrap(), vec![6, 3, 4, 6, 5, 6]);
    assert_eq!(s.ys_out.to_vec::<i64>().unwrap(), vec![3, 4, 6, 5, 6, -1]);
    assert_eq!(s.lens, vec![3, 2]);
    // Argmax 1, 0 against targets 1, 2 and an ignored one: 1 of 2 right.
    let logits = Tensor::from_vec(vec![0.0f64, 1.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 9.0], [1, 3, 3], &Device::Cpu).unwrap();
    let tg = Tensor::from_vec(vec![1i64, 2, -1], [1, 3], &Device::Cpu).unwrap();
    assert_eq!(token_accuracy(&logits, &tg, -1).unwrap().to_scalar().unwrap(), 0.5);
}

#[test]
fn decoder_logits_for_hypotheses() {
    let mut m = tiny(TINY_F64_YAML, 8);
    m.train(false);
    let mut rng = Rng::new(9);
    let (feats, fl, _, _) = batch(&mut rng);
    let (enc, lens) = m.encode(&feats, &fl).unwrap();
    assert_eq!(lens, vec![4, 3]);
    let lp = m.ctc_log_probs(&enc).unwrap();
    assert_eq!(lp.dims(), &[2, 4, 7]);
    // Each frame's log-probabilities normalise.
    let v = lp.to_f64_vec().unwrap();
    assert!((v[..7].iter().map(|x| x.exp()).sum::<f64>() - 1.0).abs() < 1e-12);
    let (l, r) = m.decoder_logits(&enc, &lens, &[vec![1, 2], vec![3]]).unwrap();
    assert_eq!(l.dims(), &[2, 3, 7]);
    assert_eq!(r.unwrap().dims(), &[2, 3, 7]);
}

#[test]
fn transformer_encoder_model_gradients_match_finite_differences() {
    let yaml = TINY_F64_YAML
        .replace("encoder: conformer", "encoder: transformer")
        .replace("pos_enc_layer_type: rel_pos", "pos_enc_layer_type: abs_pos")
        .replace("selfattention_layer_type: rel_selfattn", "selfattention_layer_type: selfattn")
        .replace("decoder: bitransformer", "decoder: transformer")
        .replace("  length_normalized_loss: false", "  length_normalized_loss: true");
    let m = tiny(&yaml, 10);
    assert!(!m.decoder.is_bidirectional());
    let mut rng = Rng::new(11);
    let (feats, fl, target, tl) = batch(&mut rng);
    let f = || Ok(m.forward(&feats, &fl, &target, &tl)?.loss);
    let (err, _) = grad_check(&m.named_parameters(), &f, 3, 1e-6);
    assert!(err < 1e-6);
}
