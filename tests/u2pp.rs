//! U2++: the bidirectional decoder's training loss mixes the right-to-left
//! decoder's loss on the reversed targets as WeNet does,
//! `loss_att = (1 − w)·l2r + w·r2l` with `w = reverse_weight`, and the total
//! stays `ctc_weight·ctc + (1 − ctc_weight)·loss_att`.

mod common;

use asrforge::autograd;
use asrforge::models::decoder::Decoder;
use asrforge::models::{config::ModelConfig, AsrModel};
use asrforge::nn::Module;
use asrforge::tensor::{DType, Device, Rng, Tensor};

fn model(yaml: &str) -> AsrModel {
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).unwrap();
    let (cfg, _) = ModelConfig::from_yaml(&v).unwrap();
    let mut m = AsrModel::with_cmvn(&cfg, None, DType::F64, &mut Rng::new(31)).unwrap();
    m.train(false);
    m
}

fn scalar(t: &Tensor) -> f64 {
    t.to_f64_vec().unwrap()[0]
}

#[test]
fn reverse_weight_mixes_the_right_to_left_loss_as_wenet() {
    let mut m = model(common::TINY_F64_YAML);
    assert!(m.decoder.is_bidirectional());
    let feats = Tensor::randn([2, 27, 9], 0.0, 1.0, DType::F64, &mut Rng::new(5), &Device::Cpu).unwrap();
    let lens = [27usize, 19];
    let seqs: [&[i64]; 2] = [&[1, 2, 3, 4], &[5, 2]];
    let pad = |s: &[&[i64]]| -> Tensor {
        let l = s.iter().map(|x| x.len()).max().unwrap();
        let v: Vec<i64> = s.iter().flat_map(|x| x.iter().copied().chain(std::iter::repeat_n(-1, l - x.len()))).collect();
        Tensor::from_vec(v, [s.len(), l], &Device::Cpu).unwrap()
    };
    let tlens = [4usize, 2];
    let target = pad(&seqs);
    let w = 0.3;
    m.reverse_weight = w;
    let mixed = autograd::no_grad(|| m.forward(&feats, &lens, &target, &tlens)).unwrap();
    m.reverse_weight = 0.0;
    let l2r = autograd::no_grad(|| m.forward(&feats, &lens, &target, &tlens)).unwrap();
    // The right decoder as a left decoder, on the reversed targets: WeNet's r2l loss.
    let mut r = m.clone();
    if let Decoder::Bi { left_decoder, right_decoder } = &mut r.decoder {
        *left_decoder = right_decoder.clone();
    }
    let rev: Vec<Vec<i64>> = seqs.iter().map(|s| s.iter().rev().copied().collect()).collect();
    let rev_refs: Vec<&[i64]> = rev.iter().map(Vec::as_slice).collect();
    let r2l = autograd::no_grad(|| r.forward(&feats, &lens, &pad(&rev_refs), &tlens)).unwrap();
    let (la, ll, lr) = (scalar(mixed.loss_att.as_ref().unwrap()), scalar(l2r.loss_att.as_ref().unwrap()), scalar(r2l.loss_att.as_ref().unwrap()));
    assert!((ll - lr).abs() > 1e-3, "the two decoders differ: {ll} vs {lr}");
    assert!((la - ((1.0 - w) * ll + w * lr)).abs() <= 1e-12 * la.abs(), "{la} vs (1-w)·{ll} + w·{lr}");
    let ctc = scalar(mixed.loss_ctc.as_ref().unwrap());
    assert!((scalar(&mixed.loss) - (m.ctc_weight * ctc + (1.0 - m.ctc_weight) * la)).abs() <= 1e-12 * la.abs());
    // Accuracy is the left-to-right decoder's.
    assert_eq!(scalar(mixed.th_accuracy.as_ref().unwrap()), scalar(l2r.th_accuracy.as_ref().unwrap()));
}
