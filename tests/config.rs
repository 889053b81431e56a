//! Model config parsing: WeNet's keys and defaults, warnings for unknown
//! keys, errors that name the key, `--override_config`, and `model-info`.

use asrforge::models::cli::{run_model_info, ModelInfoArgs};
use asrforge::models::config::*;
use serde_yaml_ng::Value;
use std::path::PathBuf;

fn parse(y: &str) -> asrforge::Result<(ModelConfig, Vec<String>)> {
    let v: Value = serde_yaml_ng::from_str(y).unwrap();
    ModelConfig::from_yaml(&v)
}

fn conf(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/conf")).join(name)
}

#[test]
fn aishell_config_parses_with_wenet_defaults() {
    let root = load_yaml(&conf("train_conformer.yaml")).unwrap();
    let (c, w) = ModelConfig::from_yaml(&root).unwrap();
    assert!(w.is_empty(), "{w:?}");
    let e = &c.encoder_conf;
    assert_eq!((e.output_size, e.attention_heads, e.linear_units, e.num_blocks, e.cnn_module_kernel), (256, 4, 2048, 12, 15));
    assert_eq!((e.pos_enc_layer_type, e.selfattention_layer_type, e.activation_type), (PosEncType::Rel, SelfAttnType::Rel, Activation::Swish));
    // Not in the file: WeNet's defaults.
    assert_eq!((e.cnn_module_norm, e.macaron_style, e.causal, e.gradient_checkpointing), (ConvNorm::BatchNorm, true, false, false));
    assert_eq!((c.decoder, c.decoder_conf.num_blocks, c.decoder_conf.activation_type), (DecoderType::Transformer, 6, Activation::Relu));
    assert_eq!((c.model_conf.ctc_weight, c.model_conf.lsm_weight, c.model_conf.length_normalized_loss), (0.3, 0.1, false));
    assert_eq!(c.cmvn, Some(CmvnConfig { cmvn_file: "data/train/global_cmvn".into(), is_json_cmvn: true }));
    // The recipe's tokenizer maps <sos> and <eos> to 2.
    assert_eq!((c.sos, c.eos, c.ctc_blank_id), (2, 2, 0));
}

#[test]
fn defaults_and_sos_eos_without_a_tokenizer() {
    let (c, w) = parse("output_dim: 10\ndataset_conf:\n  fbank_conf:\n    num_mel_bins: 40\n").unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert_eq!((c.input_dim, c.sos, c.eos), (40, 9, 9));
    assert_eq!((c.encoder, c.decoder), (EncoderType::Conformer, DecoderType::BiTransformer));
    assert_eq!((c.encoder_conf.num_blocks, c.model_conf.ctc_weight, c.model_conf.ignore_id), (6, 0.5, -1));
}

#[test]
fn unknown_keys_warn_and_other_parts_are_silent() {
    let (c, w) = parse("input_dim: 80\noutput_dim: 10\noptim: adam\noptim_conf: {lr: 1}\nscheduler: warmuplr\ngrad_clip: 5\ntrain_engine: deepspeed\nfrobnicate: 1\nencoder_conf:\n  output_sise: 128\n  use_dynamic_chunk: true\n  use_dynamic_left_chunk: true\n  static_chunk_size: 8\n").unwrap();
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w.iter().any(|s| s.contains("`frobnicate`")));
    assert!(w.iter().any(|s| s.contains("`encoder_conf.output_sise`")));
    // The chunk keys are read, not ignored.
    assert!(c.encoder_conf.use_dynamic_chunk && c.encoder_conf.use_dynamic_left_chunk);
    assert_eq!(c.encoder_conf.static_chunk_size, 8);
    assert!(!c.encoder_conf.wenet_conv_masking);
}

#[test]
fn wrong_types_and_values_are_errors_naming_the_key() {
    let cases = [
        ("input_dim: 80\noutput_dim: ten\n", "output_dim", "non-negative integer"),
        ("input_dim: 80\noutput_dim: 10\nencoder_conf:\n  num_blocks: 2.5\n", "encoder_conf.num_blocks", "float 2.5"),
        ("input_dim: 80\noutput_dim: 10\nencoder_conf:\n  normalize_before: 'yes'\n", "encoder_conf.normalize_before", "expected a bool"),
        ("input_dim: 80\noutput_dim: 10\nencoder_conf:\n  input_layer: conv3d\n", "encoder_conf.input_layer", "conv3d"),
        ("input_dim: 80\noutput_dim: 10\nencoder_conf:\n  output_size: 250\n", "encoder_conf.output_size", "multiple of attention_heads"),
        ("input_dim: 80\noutput_dim: 10\ndecoder_conf:\n  dropout_rate: 1.5\n", "decoder_conf.dropout_rate", "[0, 1]"),
        ("input_dim: 80\noutput_dim: 10\ndecoder_conf:\n  tie_word_embedding: true\n", "decoder_conf.tie_word_embedding", "only bool false"),
        ("input_dim: 80\noutput_dim: 10\nencoder_conf: 3\n", "encoder_conf", "expected a mapping"),
        ("input_dim: 80\n", "output_dim", "missing"),
        ("input_dim: 80\noutput_dim: 10\ncmvn: global_cmvn\n", "cmvn_conf.cmvn_file", "missing"),
        ("input_dim: 80\noutput_dim: 10\nencoder: branchformer\n", "encoder", "branchformer"),
    ];
    for (y, key, msg) in cases {
        let e = parse(y).unwrap_err().to_string();
        assert!(e.contains(&format!("`{key}`")) && e.contains(msg), "{y:?} gave: {e}");
    }
}

#[test]
fn override_config_sets_nested_keys_with_type_checks() {
    let mut v: Value = serde_yaml_ng::from_str("a:\n  b:\n    c: 1\n    f: 0.5\n    s: x\n    t: true\n").unwrap();
    apply_override(&mut v, "a.b.c 7").unwrap();
    apply_override(&mut v, "a.b.f 2").unwrap();
    apply_override(&mut v, "a.b.s hello").unwrap();
    apply_override(&mut v, "a.b.t False").unwrap();
    let b = &v["a"]["b"];
    assert_eq!((b["c"].as_i64(), b["f"].as_f64(), b["s"].as_str(), b["t"].as_bool()), (Some(7), Some(2.0), Some("hello"), Some(false)));
    assert!(b["f"].is_f64(), "an integer written over a float stays a float");
    let e = apply_override(&mut v, "a.b.missing 3").unwrap_err().to_string();
    assert!(e.contains("`a.b.missing`") && e.contains("no such key"), "{e}");
    let e = apply_override(&mut v, "a.x.c 3").unwrap_err().to_string();
    assert!(e.contains("`a.x`"), "{e}");
    let e = apply_override(&mut v, "a.b.c 1.5").unwrap_err().to_string();
    assert!(e.contains("`a.b.c`") && e.contains("integer 7") && e.contains("float 1.5"), "{e}");
    let e = apply_override(&mut v, "a.b.t maybe").unwrap_err().to_string();
    assert!(e.contains("`a.b.t`") && e.contains("bool"), "{e}");
    assert!(apply_override(&mut v, "a.b.c").is_err());
}

#[test]
fn model_info_prints_tree_count_and_keys() {
    let args =
        ModelInfoArgs { config: conf("train_conformer.yaml"), override_config: vec!["output_dim 100".into(), "encoder_conf.num_blocks 2".into()], keys: true };
    let out = run_model_info(&args).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2 * 40 + 6 * 26 + 19);
    assert!(lines.contains(&"encoder.encoders.1.conv_module.depthwise_conv.weight 256x1x15"));
    assert!(lines.contains(&"encoder.encoders.1.conv_module.norm.num_batches_tracked scalar"));
    assert!(lines.contains(&"ctc.ctc_lo.weight 100x256"));
    assert!(!out.contains("encoder.encoders.2."));
    let tiny = run_model_info(&ModelInfoArgs { config: conf("tiny.yaml"), override_config: vec![], keys: false }).unwrap();
    assert!(tiny.starts_with("ASRModel (\n  (encoder): ConformerEncoder (\n"), "{}", &tiny[..200]);
    assert!(tiny.contains("(depthwise_conv): Conv1d(64, 64, kernel_size=(7,), stride=(1,), padding=(3,), groups=64)"));
    // embed 640 + 36,928 + 77,888; 2 blocks × (attention 20,864 + 2 FFN 66,176 + conv 13,120 + norms 640);
    // after_norm 128; decoder 4,096 + 2 × 66,752 + 128 + 4,160; ctc 4,160.
    assert!(tiny.trim_end().ends_with("the number of model params: 463,232"), "{}", tiny.lines().last().unwrap());
    let e =
        run_model_info(&ModelInfoArgs { config: conf("tiny.yaml"), override_config: vec!["encoder_conf.nope 1".into()], keys: true }).unwrap_err().to_string();
    assert!(e.contains("`encoder_conf.nope`"), "{e}");
    let e = run_model_info(&ModelInfoArgs { config: conf("absent.yaml"), override_config: vec![], keys: true }).unwrap_err().to_string();
    assert!(e.contains("absent.yaml"), "{e}");
}

#[test]
fn u2pp_config_parses_as_a_causal_dynamic_chunk_conformer_with_a_bidirectional_decoder() {
    let root = load_yaml(&conf("train_u2++_conformer.yaml")).unwrap();
    let (c, w) = ModelConfig::from_yaml(&root).unwrap();
    assert!(w.is_empty(), "{w:?}");
    let e = &c.encoder_conf;
    assert!(e.causal && e.use_dynamic_chunk && !e.use_dynamic_left_chunk);
    assert_eq!((e.cnn_module_kernel, e.cnn_module_norm, e.static_chunk_size), (8, ConvNorm::LayerNorm, 0));
    assert_eq!((c.decoder, c.decoder_conf.num_blocks, c.decoder_conf.r_num_blocks), (DecoderType::BiTransformer, 3, 3));
    assert_eq!((c.model_conf.ctc_weight, c.model_conf.reverse_weight, c.model_conf.lsm_weight), (0.3, 0.3, 0.1));
}
