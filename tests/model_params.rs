//! The AISHELL-1 conformer of conf/train_conformer.yaml: WeNet's parameter
//! count, and the exact keys and shapes of one encoder and one decoder layer.

use asrforge::models::config::{load_yaml, ModelConfig};
use asrforge::models::summary::{model_summary, state_dict_keys};
use asrforge::models::AsrModel;
use asrforge::nn::{format_shape, Module};
use asrforge::tensor::{DType, Rng};
use std::path::Path;
use std::sync::RwLock;

/// `an_absurd_model_is_refused_before_any_allocation` reads the process-wide
/// count of live tensor bytes, so it runs alone (write); the other tests of
/// this file, which build models, share the lock (read).
static ALLOCS: RwLock<()> = RwLock::new(());

fn aishell() -> AsrModel {
    let root = load_yaml(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/conf/train_conformer.yaml"))).unwrap();
    let (cfg, warnings) = ModelConfig::from_yaml(&root).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!((cfg.input_dim, cfg.output_dim), (80, 4233));
    AsrModel::without_cmvn_stats(&cfg, DType::F32, &mut Rng::new(0)).unwrap()
}

#[test]
fn aishell_conformer_has_wenets_parameter_count() {
    let _shared = ALLOCS.read().unwrap_or_else(|e| e.into_inner());
    let m = aishell();
    let (d, ff, v) = (256usize, 2048usize, 4233usize);
    let lin = |i: usize, o: usize| i * o + o;
    // Conv2dSubsampling4: conv 1→256 k3, conv 256→256 k3, Linear(256·19 → 256), 19 = ((80−1)//2 − 1)//2.
    let embed = (d * 9 + d) + (d * d * 9 + d) + lin(d * 19, d);
    assert_eq!(embed, 2_560 + 590_080 + 1_245_440);
    // Rel-pos attention: q, k, v, out with bias, linear_pos without, pos_bias_u/v [4, 64].
    let rel_attn = 4 * lin(d, d) + d * d + 2 * 4 * 64;
    assert_eq!(rel_attn, 329_216);
    let ffn = lin(d, ff) + lin(ff, d);
    assert_eq!(ffn, 1_050_880);
    // Conv module: pointwise 256→512, depthwise [256,1,15]+bias, batch norm weight+bias, pointwise 256→256.
    let conv = (2 * d * d + 2 * d) + (d * 15 + d) + 2 * d + (d * d + d);
    assert_eq!(conv, 201_984);
    let enc_layer = rel_attn + 2 * ffn + conv + 5 * 2 * d;
    assert_eq!(enc_layer, 2_635_520);
    let encoder = embed + 12 * enc_layer + 2 * d;
    assert_eq!(encoder, 33_464_832);
    let dec_layer = 2 * (4 * lin(d, d)) + ffn + 3 * 2 * d;
    assert_eq!(dec_layer, 1_578_752);
    let decoder = v * d + 6 * dec_layer + 2 * d + lin(d, v);
    assert_eq!(decoder, 11_644_553);
    let ctc = lin(d, v);
    let total = encoder + decoder + ctc;
    assert_eq!(total, 46_197_266);
    assert_eq!(m.num_parameters(), total);
    assert!(model_summary(&m).ends_with("the number of model params: 46,197,266\n"));
}

#[test]
fn aishell_layer_keys_and_shapes_are_wenets() {
    let _shared = ALLOCS.read().unwrap_or_else(|e| e.into_inner());
    let m = aishell();
    let keys = state_dict_keys(&m);
    let layer3: Vec<&str> = keys.lines().filter(|l| l.starts_with("encoder.encoders.3.")).collect();
    let p = "encoder.encoders.3.";
    let want: Vec<String> = [
        ("self_attn.pos_bias_u", "4x64"),
        ("self_attn.pos_bias_v", "4x64"),
        ("self_attn.linear_q.weight", "256x256"),
        ("self_attn.linear_q.bias", "256"),
        ("self_attn.linear_k.weight", "256x256"),
        ("self_attn.linear_k.bias", "256"),
        ("self_attn.linear_v.weight", "256x256"),
        ("self_attn.linear_v.bias", "256"),
        ("self_attn.linear_out.weight", "256x256"),
        ("self_attn.linear_out.bias", "256"),
        ("self_attn.linear_pos.weight", "256x256"),
        ("feed_forward.w_1.weight", "2048x256"),
        ("feed_forward.w_1.bias", "2048"),
        ("feed_forward.w_2.weight", "256x2048"),
        ("feed_forward.w_2.bias", "256"),
        ("feed_forward_macaron.w_1.weight", "2048x256"),
        ("feed_forward_macaron.w_1.bias", "2048"),
        ("feed_forward_macaron.w_2.weight", "256x2048"),
        ("feed_forward_macaron.w_2.bias", "256"),
        ("conv_module.pointwise_conv1.weight", "512x256x1"),
        ("conv_module.pointwise_conv1.bias", "512"),
        ("conv_module.depthwise_conv.weight", "256x1x15"),
        ("conv_module.depthwise_conv.bias", "256"),
        ("conv_module.norm.weight", "256"),
        ("conv_module.norm.bias", "256"),
        ("conv_module.norm.running_mean", "256"),
        ("conv_module.norm.running_var", "256"),
        ("conv_module.norm.num_batches_tracked", "scalar"),
        ("conv_module.pointwise_conv2.weight", "256x256x1"),
        ("conv_module.pointwise_conv2.bias", "256"),
        ("norm_ff.weight", "256"),
        ("norm_ff.bias", "256"),
        ("norm_mha.weight", "256"),
        ("norm_mha.bias", "256"),
        ("norm_ff_macaron.weight", "256"),
        ("norm_ff_macaron.bias", "256"),
        ("norm_conv.weight", "256"),
        ("norm_conv.bias", "256"),
        ("norm_final.weight", "256"),
        ("norm_final.bias", "256"),
    ]
    .iter()
    .map(|(k, s)| format!("{p}{k} {s}"))
    .collect();
    assert_eq!(layer3, want);

    let dec0: Vec<&str> = keys.lines().filter(|l| l.starts_with("decoder.decoders.0.")).collect();
    let mut want = Vec::new();
    for att in ["self_attn", "src_attn"] {
        for lin in ["linear_q", "linear_k", "linear_v", "linear_out"] {
            want.push(format!("decoder.decoders.0.{att}.{lin}.weight 256x256"));
            want.push(format!("decoder.decoders.0.{att}.{lin}.bias 256"));
        }
    }
    want.extend(
        ["feed_forward.w_1.weight 2048x256", "feed_forward.w_1.bias 2048", "feed_forward.w_2.weight 256x2048", "feed_forward.w_2.bias 256"]
            .map(|s| format!("decoder.decoders.0.{s}")),
    );
    for n in ["norm1", "norm2", "norm3"] {
        want.push(format!("decoder.decoders.0.{n}.weight 256"));
        want.push(format!("decoder.decoders.0.{n}.bias 256"));
    }
    assert_eq!(dec0, want);

    // The keys outside the blocks, in state-dict order.
    let outer: Vec<&str> = keys.lines().filter(|l| !l.contains(".encoders.") && !l.contains(".decoders.")).collect();
    assert_eq!(
        outer,
        [
            "encoder.global_cmvn.mean 80",
            "encoder.global_cmvn.istd 80",
            "encoder.embed.conv.0.weight 256x1x3x3",
            "encoder.embed.conv.0.bias 256",
            "encoder.embed.conv.2.weight 256x256x3x3",
            "encoder.embed.conv.2.bias 256",
            "encoder.embed.out.0.weight 256x4864",
            "encoder.embed.out.0.bias 256",
            "encoder.embed.pos_enc.pe 1x5000x256",
            "encoder.after_norm.weight 256",
            "encoder.after_norm.bias 256",
            "decoder.embed.0.weight 4233x256",
            "decoder.embed.1.pe 1x5000x256",
            "decoder.after_norm.weight 256",
            "decoder.after_norm.bias 256",
            "decoder.output_layer.weight 4233x256",
            "decoder.output_layer.bias 4233",
            "ctc.ctc_lo.weight 4233x256",
            "ctc.ctc_lo.bias 4233",
        ]
    );
    // 12 encoder blocks × 40 keys + 6 decoder blocks × 26 keys + 19 outer keys.
    assert_eq!(keys.lines().count(), 12 * 40 + 6 * 26 + 19);
    // Buffers: CMVN, the two positional tables and each block's batch-norm statistics.
    let bufs = m.named_buffers();
    assert_eq!(bufs.len(), 2 + 2 + 12 * 3);
    let nbt = bufs.iter().find(|(k, _)| k == "encoder.encoders.0.conv_module.norm.num_batches_tracked").unwrap();
    assert_eq!((nbt.1.dtype(), format_shape(nbt.1.dims())), (DType::I64, "scalar".to_string()));
    // Parameters are leaves that take gradients; buffers are not.
    assert!(m.named_parameters().iter().all(|(_, t)| t.is_leaf() && t.requires_grad()));
    assert!(bufs.iter().all(|(_, t)| !t.requires_grad()));
}

#[test]
fn parameter_order_is_stable_and_init_is_seeded() {
    let _shared = ALLOCS.read().unwrap_or_else(|e| e.into_inner());
    let cfg_root: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/conf/tiny.yaml")).unwrap()).unwrap();
    let (cfg, _) = ModelConfig::from_yaml(&cfg_root).unwrap();
    let a = AsrModel::new(&cfg, DType::F32, &mut Rng::new(42)).unwrap();
    let b = AsrModel::new(&cfg, DType::F32, &mut Rng::new(42)).unwrap();
    let (pa, pb) = (a.named_parameters(), b.named_parameters());
    assert_eq!(pa.iter().map(|p| &p.0).collect::<Vec<_>>(), pb.iter().map(|p| &p.0).collect::<Vec<_>>());
    for ((n, x), (_, y)) in pa.iter().zip(&pb) {
        assert_eq!(x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap(), "{n}");
    }
    // PyTorch defaults: Linear weights within ±1/√fan_in, LayerNorm ones/zeros, embedding ~ N(0, 1).
    let w = pa.iter().find(|p| p.0 == "encoder.encoders.0.feed_forward.w_1.weight").unwrap().1.to_vec::<f32>().unwrap();
    let bound = 1.0 / (64f32).sqrt();
    assert!(w.iter().all(|x| x.abs() <= bound) && w.iter().any(|x| x.abs() > 0.9 * bound));
    let ln = pa.iter().find(|p| p.0 == "encoder.after_norm.weight").unwrap().1.to_vec::<f32>().unwrap();
    assert!(ln.iter().all(|&x| x == 1.0));
    let e = pa.iter().find(|p| p.0 == "decoder.embed.0.weight").unwrap().1.to_vec::<f32>().unwrap();
    let var = e.iter().map(|x| x * x).sum::<f32>() / e.len() as f32;
    assert!((var - 1.0).abs() < 0.1, "embedding variance {var}");
}

/// `m.children_mut()` lists the children of `m.children()`, in the same order (this level only).
fn same_children(m: &mut dyn Module, path: &str) {
    let named: Vec<(String, String)> = m.children().iter().map(|(n, c)| (n.clone(), c.describe())).collect();
    let muts: Vec<String> = m.children_mut().iter().map(|c| c.describe()).collect();
    let want: Vec<String> = named.iter().map(|(_, d)| d.clone()).collect();
    assert_eq!(muts, want, "{path}: children_mut against children {named:?}");
}

#[test]
fn children_mut_follows_children_in_the_model_and_its_encoder_layers() {
    let _shared = ALLOCS.read().unwrap_or_else(|e| e.into_inner());
    // Conformer layers (macaron, conv module, five norms) and the model's
    // three heads; other modules list in children_mut only the children
    // with a training mode.
    let mut m = aishell();
    same_children(&mut m, "model");
    same_children(&mut m.ctc, "model.ctc");
    let n = m.encoder.encoders.len();
    for (i, l) in m.encoder.encoders.iter_mut().enumerate() {
        same_children(l, &format!("encoder.encoders.{i}"));
    }
    assert_eq!(n, 12);
}

/// Builds the model of `yaml` and returns it with its config.
fn build(yaml: &str) -> (ModelConfig, AsrModel) {
    let root: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).unwrap();
    let (cfg, _) = ModelConfig::from_yaml(&root).unwrap();
    let m = AsrModel::without_cmvn_stats(&cfg, DType::F32, &mut Rng::new(0)).unwrap();
    (cfg, m)
}

#[test]
fn model_size_from_the_config_equals_the_built_model() {
    let _shared = ALLOCS.read().unwrap_or_else(|e| e.into_inner());
    use asrforge::models::limits::model_size;
    let m = aishell();
    let root = load_yaml(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/conf/train_conformer.yaml"))).unwrap();
    let (cfg, _) = ModelConfig::from_yaml(&root).unwrap();
    assert_eq!(model_size(&cfg).parameters, 46_197_266);
    assert_eq!(model_size(&cfg).parameters, m.num_parameters() as u128);
    let buffers = |m: &AsrModel| m.named_buffers().iter().map(|(_, t)| t.elem_count() as u128).sum::<u128>();
    assert_eq!(model_size(&cfg).buffers, buffers(&m));
    // Every variant of the formula: transformer / conformer, each input layer, both conv norms, both decoders, CMVN.
    let variants = [
        "encoder: transformer\nencoder_conf: {output_size: 8, attention_heads: 2, linear_units: 12, num_blocks: 2, input_layer: linear}\ndecoder: transformer\ndecoder_conf: {attention_heads: 2, linear_units: 6, num_blocks: 1}",
        "encoder: conformer\nencoder_conf: {output_size: 8, attention_heads: 2, linear_units: 12, num_blocks: 1, input_layer: conv2d6, cnn_module_kernel: 5, cnn_module_norm: layer_norm}\ndecoder: bitransformer\ndecoder_conf: {attention_heads: 2, linear_units: 6, num_blocks: 2, r_num_blocks: 1}",
        "encoder: conformer\nencoder_conf: {output_size: 8, attention_heads: 2, linear_units: 12, num_blocks: 2, input_layer: conv2d8, macaron_style: false, pos_enc_layer_type: abs_pos, selfattention_layer_type: selfattn}\ndecoder: transformer\ndecoder_conf: {attention_heads: 4, linear_units: 6, num_blocks: 1}",
        "encoder: conformer\nencoder_conf: {output_size: 8, attention_heads: 2, linear_units: 12, num_blocks: 1, use_cnn_module: false, pos_enc_layer_type: no_pos}\ndecoder: transformer\ndecoder_conf: {attention_heads: 2, linear_units: 6, num_blocks: 1}",
    ];
    for v in variants {
        let (cfg, m) = build(&format!("input_dim: 40\noutput_dim: 7\ncmvn: global_cmvn\ncmvn_conf: {{cmvn_file: x.json}}\n{v}\n"));
        let size = model_size(&cfg);
        assert_eq!(size.parameters, m.num_parameters() as u128, "{v}");
        assert_eq!(size.buffers, buffers(&m), "{v}");
    }
}

#[test]
fn an_absurd_model_is_refused_before_any_allocation() {
    let _alone = ALLOCS.write().unwrap_or_else(|e| e.into_inner());
    use asrforge::models::limits::{check_model_size, DEFAULT_MAX_MODEL_BYTES};
    let yaml = "input_dim: 80\noutput_dim: 10\nencoder_conf: {output_size: 100000000, attention_heads: 4}\n";
    let root: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).unwrap();
    let (cfg, _) = ModelConfig::from_yaml(&root).unwrap();
    let before = asrforge::tensor::live_bytes();
    let e = AsrModel::without_cmvn_stats(&cfg, DType::F32, &mut Rng::new(0)).unwrap_err().to_string();
    assert!(e.starts_with("config key `encoder_conf.output_size`:") && e.contains("output_size 100000000") && e.contains("ASRFORGE_MAX_MODEL_BYTES"), "{e}");
    assert!(asrforge::tensor::live_bytes() <= before, "no tensor was allocated");
    // The limit is a limit: the AISHELL conformer (46 M parameters, about 0.2 GiB) passes it and fails a 100 MiB one.
    let root = load_yaml(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/conf/train_conformer.yaml"))).unwrap();
    let (cfg, _) = ModelConfig::from_yaml(&root).unwrap();
    assert!(check_model_size(&cfg, DEFAULT_MAX_MODEL_BYTES).is_ok());
    assert!(check_model_size(&cfg, 100 << 20).is_err());
}

#[test]
fn a_host_allocation_the_system_refuses_is_an_error_not_an_abort() {
    let _shared = ALLOCS.read().unwrap_or_else(|e| e.into_inner());
    let e = asrforge::Tensor::zeros([1usize << 62], DType::F32, &asrforge::Device::Cpu).unwrap_err().to_string();
    assert!(e.starts_with("tensor (f32): out of host memory, cannot allocate"), "{e}");
    let e = asrforge::Tensor::rand([1usize << 61], 0.0, 1.0, DType::F32, &mut Rng::new(0), &asrforge::Device::Cpu).unwrap_err().to_string();
    assert!(e.starts_with("rand: out of host memory"), "{e}");
}
