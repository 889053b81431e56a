//! Chunk-by-chunk encoding (WeNet's forward_chunk_by_chunk: attention
//! key/value caches and causal convolution caches carried across chunks)
//! equals the whole utterance encoded under the same chunk mask, and a
//! dynamic-chunk model's chunked decoding equals its masked full decoding.

use asrforge::autograd;
use asrforge::decode::ctc::ctc_greedy_search;
use asrforge::models::mask::ChunkRequest;
use asrforge::models::{config::ModelConfig, AsrModel};
use asrforge::nn::Module;
use asrforge::ops;
use asrforge::tensor::{DType, Device, Rng, Tensor};

const CONFORMER: &str = "
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
  cnn_module_kernel: 5
  causal: true
  use_dynamic_chunk: true
  use_dynamic_left_chunk: true
  pos_enc_layer_type: rel_pos
  selfattention_layer_type: rel_selfattn
decoder: bitransformer
decoder_conf: {attention_heads: 2, linear_units: 12, num_blocks: 1, r_num_blocks: 1, dropout_rate: 0.0, positional_dropout_rate: 0.0}
model_conf: {ctc_weight: 0.3, reverse_weight: 0.3}
";

fn model(yaml: &str) -> AsrModel {
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).unwrap();
    let (cfg, w) = ModelConfig::from_yaml(&v).unwrap();
    assert!(w.is_empty(), "{w:?}");
    let mut m = AsrModel::with_cmvn(&cfg, None, DType::F64, &mut Rng::new(21)).unwrap();
    m.train(false);
    m
}

fn close(a: &[f64], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-10 * x.abs().max(1.0), "{what}[{i}]: {x} vs {y}");
    }
}

fn check_stream_equals_masked(m: &AsrModel, frames: usize, what: &str) {
    let feats = Tensor::randn([1, frames, 9], 0.0, 1.0, DType::F64, &mut Rng::new(frames as u64), &Device::Cpu).unwrap();
    for (chunk, left) in [(1usize, -1i64), (2, -1), (3, 1), (4, 0), (4, 2), (5, -1), (16, -1), (64, -1)] {
        let req = ChunkRequest { decoding_chunk_size: chunk as i64, num_decoding_left_chunks: left };
        let (full, lens, used) = autograd::no_grad(|| m.encoder.forward_with(&feats, &[frames], req)).unwrap();
        assert_eq!(used.map(|c| (c.size, c.num_left_chunks)), Some((chunk, left)));
        let stream = autograd::no_grad(|| m.encoder.forward_chunk_by_chunk(&feats, chunk, left)).unwrap();
        assert_eq!(stream.dims(), full.dims(), "{what} chunk {chunk} left {left}");
        assert_eq!(lens, vec![full.dims()[1]]);
        close(&full.to_f64_vec().unwrap(), &stream.to_f64_vec().unwrap(), &format!("{what} chunk {chunk} left {left}"));
    }
    // Full context is not the chunked result: the mask matters (given more than one chunk).
    if frames < 20 {
        return;
    }
    let req = ChunkRequest { decoding_chunk_size: -1, num_decoding_left_chunks: -1 };
    let (full, _, used) = autograd::no_grad(|| m.encoder.forward_with(&feats, &[frames], req)).unwrap();
    assert_eq!(used, None);
    let stream = autograd::no_grad(|| m.encoder.forward_chunk_by_chunk(&feats, 2, -1)).unwrap();
    let d: f64 = full.to_f64_vec().unwrap().iter().zip(stream.to_f64_vec().unwrap()).map(|(a, b)| (a - b).abs()).sum();
    assert!(d > 1e-3, "{what}: chunk 2 should differ from full context, total difference {d}");
}

#[test]
fn conformer_stream_equals_chunk_masked_encoder() {
    let m = model(CONFORMER);
    // 57 frames → 13 outputs (chunks of 4 leave a partial last chunk); 31 → 7; 7 → 1.
    for frames in [57, 31, 7] {
        check_stream_equals_masked(&m, frames, &format!("conformer {frames} frames"));
    }
}

#[test]
fn transformer_and_layer_norm_conformer_streams_equal_masked_encoders() {
    let t = CONFORMER
        .replace("encoder: conformer", "encoder: transformer")
        .replace("pos_enc_layer_type: rel_pos", "pos_enc_layer_type: abs_pos")
        .replace("selfattention_layer_type: rel_selfattn", "selfattention_layer_type: selfattn")
        .replace("  cnn_module_kernel: 5\n  causal: true\n", "");
    check_stream_equals_masked(&model(&t), 45, "transformer");
    let c = CONFORMER
        .replace("causal: true", "causal: true\n  cnn_module_norm: layer_norm\n  static_chunk_size: 4")
        .replace("use_dynamic_chunk: true", "use_dynamic_chunk: false");
    // A static-chunk model streams too (its mask uses the static size, so only that size is compared).
    let m = model(&c);
    let feats = Tensor::randn([1, 41, 9], 0.0, 1.0, DType::F64, &mut Rng::new(4), &Device::Cpu).unwrap();
    let req = ChunkRequest { decoding_chunk_size: 4, num_decoding_left_chunks: -1 };
    let (full, _, used) = autograd::no_grad(|| m.encoder.forward_with(&feats, &[41], req)).unwrap();
    assert_eq!(used.map(|c| c.size), Some(4));
    let stream = autograd::no_grad(|| m.encoder.forward_chunk_by_chunk(&feats, 4, -1)).unwrap();
    close(&full.to_f64_vec().unwrap(), &stream.to_f64_vec().unwrap(), "static-chunk layer-norm conformer");
}

#[test]
fn streaming_needs_a_chunk_trained_model_and_a_long_enough_utterance() {
    let plain = model(&CONFORMER.replace("use_dynamic_chunk: true", "use_dynamic_chunk: false"));
    let feats = Tensor::randn([1, 20, 9], 0.0, 1.0, DType::F64, &mut Rng::new(4), &Device::Cpu).unwrap();
    let e = plain.encoder.forward_chunk_by_chunk(&feats, 4, -1).unwrap_err().to_string();
    assert!(e.contains("use_dynamic_chunk"), "{e}");
    let m = model(CONFORMER);
    let short = ops::narrow(&feats, 1, 0, 6).unwrap();
    let e = m.encoder.forward_chunk_by_chunk(&short, 4, -1).unwrap_err().to_string();
    assert!(e.contains("6 frames"), "{e}");
}

#[test]
fn chunked_decoding_of_a_padded_batch_equals_masked_full_decoding() {
    let m = model(CONFORMER);
    let feats = Tensor::randn([2, 61, 9], 0.0, 1.0, DType::F64, &mut Rng::new(9), &Device::Cpu).unwrap();
    let lens = [61usize, 38];
    for (chunk, left) in [(4i64, -1i64), (2, 1), (16, -1)] {
        let req = ChunkRequest { decoding_chunk_size: chunk, num_decoding_left_chunks: left };
        let (full, fl) = autograd::no_grad(|| m.encode_with(&feats, &lens, req, false)).unwrap();
        let (stream, sl) = autograd::no_grad(|| m.encode_with(&feats, &lens, req, true)).unwrap();
        assert_eq!(fl, sl);
        assert_eq!(fl, vec![14, 8]);
        let (lf, ls) = (m.ctc_log_probs(&full).unwrap(), m.ctc_log_probs(&stream).unwrap());
        let (t, v) = (lf.dims()[1], lf.dims()[2]);
        let (a, b) = (lf.to_f64_vec().unwrap(), ls.to_f64_vec().unwrap());
        for (i, &n) in fl.iter().enumerate() {
            let (ra, rb) = (&a[i * t * v..(i * t + n) * v], &b[i * t * v..(i * t + n) * v]);
            close(ra, rb, &format!("CTC log-probs, utterance {i}, chunk {chunk} left {left}"));
            let fa: Vec<f32> = ra.iter().map(|&x| x as f32).collect();
            let fb: Vec<f32> = rb.iter().map(|&x| x as f32).collect();
            assert_eq!(ctc_greedy_search(&fa, v, 0).unwrap().tokens, ctc_greedy_search(&fb, v, 0).unwrap().tokens);
        }
    }
}
