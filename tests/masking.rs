//! Padding never leaks into valid positions: encoder outputs at valid
//! frames and decoder logits at valid tokens do not change when padding is
//! appended to the batch, or when a sequence is run alone. The masks
//! themselves equal WeNet's, written out by hand (padded query rows
//! included, which no output at a valid position can show).

mod common;

use asrforge::models::{config::ModelConfig, AsrModel};
use asrforge::nn::Module;
use asrforge::ops;
use asrforge::tensor::{DType, Device, Rng, Tensor};

fn model(yaml: &str) -> AsrModel {
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).unwrap();
    let (cfg, _) = ModelConfig::from_yaml(&v).unwrap();
    let mut m = AsrModel::with_cmvn(&cfg, None, DType::F64, &mut Rng::new(11)).unwrap();
    // Eval mode: batch norm uses its running statistics, which padding cannot move.
    m.train(false);
    m
}

fn rows(t: &Tensor, b: usize, n: usize) -> Vec<f64> {
    let (tt, d) = (t.dims()[1], t.dims()[2]);
    t.to_f64_vec().unwrap()[b * tt * d..(b * tt + n) * d].to_vec()
}

fn close(a: &[f64], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-10 * x.abs().max(1.0), "{what}[{i}]: {x} vs {y}");
    }
}

#[test]
fn masks_equal_wenets_pad_and_subsequent_masks_written_out() {
    use asrforge::nn::AttentionMask;
    let bits = |m: AttentionMask| m.tensor().unwrap().to_vec::<u8>().unwrap();
    // make_pad_mask(lens): key j of sequence b is masked when j >= lens[b]; (B, 1, 1, T).
    let m = AttentionMask::key_padding(&[0, 2, 3], 3).unwrap();
    assert_eq!(m.tensor().unwrap().dims(), &[3, 1, 1, 3]);
    assert_eq!(bits(m), [1, 1, 1, 0, 0, 1, 0, 0, 0]);
    // ~(~make_pad_mask(lens).unsqueeze(1) & subsequent_mask(T)): masked when j > i or j >= lens[b],
    // in every query row, the padded ones (i >= lens[b]) too; (B, 1, T, T).
    let m = AttentionMask::causal_padding(&[1, 3], 3).unwrap();
    assert_eq!(m.tensor().unwrap().dims(), &[2, 1, 3, 3]);
    #[rustfmt::skip]
    let want = [
        0, 1, 1,  0, 1, 1,  0, 1, 1, // length 1: rows 1 and 2 are padding and still mask keys 1 and 2
        0, 1, 1,  0, 0, 1,  0, 0, 0, // length 3: the lower triangle
    ];
    assert_eq!(bits(m), want);
}

fn check_encoder(yaml: &str) {
    let m = model(yaml);
    let mut rng = Rng::new(3);
    let feats = Tensor::randn([2, 23, 9], 0.0, 1.0, DType::F64, &mut rng, &Device::Cpu).unwrap();
    let lens = [23usize, 15];
    let (out, ol) = m.encode(&feats, &lens).unwrap();
    // Append 12 frames of garbage to the whole batch.
    let junk = Tensor::randn([2, 12, 9], 5.0, 3.0, DType::F64, &mut rng, &Device::Cpu).unwrap();
    let longer = ops::cat(&[&feats, &junk], 1).unwrap();
    let (out2, ol2) = m.encode(&longer, &lens).unwrap();
    assert_eq!(ol, ol2);
    // ((23-1)//2 - 1)//2 = 5 and ((15-1)//2 - 1)//2 = 3.
    assert_eq!(ol, vec![5, 3]);
    assert!(out2.dims()[1] > out.dims()[1]);
    for (b, &n) in ol.iter().enumerate() {
        close(&rows(&out, b, n), &rows(&out2, b, n), "encoder with appended padding");
    }
    // The short sequence alone, cut to its length, gives the same valid frames.
    let alone = ops::narrow(&ops::narrow(&feats, 0, 1, 1).unwrap(), 1, 0, 15).unwrap();
    let (out3, ol3) = m.encode(&alone, &[15]).unwrap();
    assert_eq!(ol3, vec![3]);
    close(&rows(&out, 1, 3), &rows(&out3, 0, 3), "encoder alone vs in a batch");
}

#[test]
fn conformer_encoder_ignores_padding() {
    check_encoder(common::TINY_F64_YAML);
    // The layer-norm convolution module and abs positions too.
    check_encoder(
        &common::TINY_F64_YAML
            .replace("  cnn_module_kernel: 3\n", "  cnn_module_kernel: 3\n  cnn_module_norm: layer_norm\n")
            .replace("pos_enc_layer_type: rel_pos", "pos_enc_layer_type: abs_pos"),
    );
}

#[test]
fn transformer_encoder_ignores_padding() {
    let yaml = common::TINY_F64_YAML
        .replace("encoder: conformer", "encoder: transformer")
        .replace("pos_enc_layer_type: rel_pos", "pos_enc_layer_type: abs_pos")
        .replace("selfattention_layer_type: rel_selfattn", "selfattention_layer_type: selfattn");
    let m = model(&yaml);
    assert!(m.encoder.encoders[0].conv_module.is_none() && m.encoder.encoders[0].feed_forward_macaron.is_none());
    assert!(m.state_dict().iter().any(|e| e.name == "encoder.encoders.1.norm2.bias"));
    check_encoder(&yaml);
}

#[test]
fn decoder_ignores_padding() {
    let m = model(common::TINY_F64_YAML);
    let mut rng = Rng::new(4);
    let memory = Tensor::randn([2, 5, 8], 0.0, 1.0, DType::F64, &mut rng, &Device::Cpu).unwrap();
    let mem_lens = [5usize, 3];
    let hyps = [vec![1i64, 2, 3], vec![4]];
    let (l1, r1) = m.decoder_logits(&memory, &mem_lens, &hyps).unwrap();
    // Longer memory padding and longer token padding (a third, longer hypothesis elsewhere in the batch).
    let junk = Tensor::randn([2, 4, 8], 3.0, 2.0, DType::F64, &mut rng, &Device::Cpu).unwrap();
    let mem2 = ops::cat(&[&memory, &junk], 1).unwrap();
    let (l2, r2) = m.decoder_logits(&mem2, &mem_lens, &hyps).unwrap();
    let mem3 = ops::cat(&[&mem2, &ops::narrow(&mem2, 0, 0, 1).unwrap()], 0).unwrap();
    let (l3, _) = m.decoder_logits(&mem3, &[5, 3, 5], &[hyps[0].clone(), hyps[1].clone(), vec![1, 2, 3, 4, 5, 6]]).unwrap();
    assert_eq!(l3.dims()[1], 7);
    for (b, n) in [(0usize, 4usize), (1, 2)] {
        close(&rows(&l1, b, n), &rows(&l2, b, n), "decoder with longer memory padding");
        close(&rows(&l1, b, n), &rows(&l3, b, n), "decoder with longer token padding");
        close(&rows(r1.as_ref().unwrap(), b, n), &rows(r2.as_ref().unwrap(), b, n), "right decoder");
    }
    // Causality: the logits at token 1 do not depend on later tokens.
    let (l4, _) = m.decoder_logits(&memory, &mem_lens, &[vec![1, 6, 6], vec![4]]).unwrap();
    close(&rows(&l1, 0, 2), &rows(&l4, 0, 2), "causal mask");
}
