//! `asrforge recognize` end to end on a tiny random model: every mode
//! writes one `key text` line per utterance, each key once, in the symbol
//! table's alphabet; bad flags are typed errors.

#[path = "common/tempdir.rs"]
mod tempdir;

use std::path::Path;
use std::process::Command;

use asrforge::models::{save_checkpoint, AsrModel, ModelConfig};
use asrforge::tensor::{DType, Rng};

const CONFIG: &str = "input_dim: 40
output_dim: 6
encoder: conformer
encoder_conf: {output_size: 32, attention_heads: 2, linear_units: 64, num_blocks: 1, input_layer: conv2d, cnn_module_kernel: 3, pos_enc_layer_type: rel_pos, selfattention_layer_type: rel_selfattn, causal: false, use_dynamic_chunk: false}
decoder: bitransformer
decoder_conf: {attention_heads: 2, linear_units: 64, num_blocks: 1, r_num_blocks: 1}
model_conf: {ctc_weight: 0.3, lsm_weight: 0.1, reverse_weight: 0.3}
cmvn: global_cmvn
cmvn_conf: {cmvn_file: does_not_exist/global_cmvn, is_json_cmvn: true}
dataset_conf:
  fbank_conf: {num_mel_bins: 40, frame_shift: 10, frame_length: 25, dither: 0.1}
  batch_conf: {batch_type: static, batch_size: 8}
tokenizer: char
tokenizer_conf: {symbol_table_path: UNITS, split_with_space: false}
";

fn setup(tag: &str) -> tempdir::TempDir {
    let d = tempdir::TempDir::new(&format!("recognize-{tag}"));
    let units = d.join("units.txt");
    std::fs::write(&units, "<blank> 0\n<unk> 1\nA 2\nB 3\n\u{2581} 4\n<sos/eos> 5\n").unwrap();
    std::fs::write(d.join("train.yaml"), CONFIG.replace("UNITS", units.to_str().unwrap())).unwrap();
    let spec = hound::WavSpec { channels: 1, sample_rate: 16000, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let mut rng = Rng::new(11);
    let mut list = String::new();
    for (i, secs) in [0.45, 0.8, 0.3].iter().enumerate() {
        let wav = d.join(format!("u{i}.wav"));
        let mut w = hound::WavWriter::create(&wav, spec).unwrap();
        for x in rng.normal((16000.0 * secs) as usize) {
            w.write_sample((x * 3000.0) as i16).unwrap();
        }
        w.finalize().unwrap();
        list.push_str(&format!("{{\"key\": \"u{i}\", \"wav\": \"{}\", \"txt\": \"AB A\"}}\n", wav.display()));
    }
    std::fs::write(d.join("data.list"), list).unwrap();
    let root: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(d.join("train.yaml")).unwrap()).unwrap();
    let (cfg, _) = ModelConfig::from_yaml(&root).unwrap();
    let model = AsrModel::without_cmvn_stats(&cfg, DType::F32, &mut Rng::new(5)).unwrap();
    save_checkpoint(&model, &d.join("final.safetensors"), &serde_yaml_ng::Value::Null).unwrap();
    d
}

fn recognize(d: &Path, extra: &[&str]) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_asrforge"));
    c.arg("recognize")
        .arg("--config")
        .arg(d.join("train.yaml"))
        .arg("--test_data")
        .arg(d.join("data.list"))
        .arg("--checkpoint")
        .arg(d.join("final.safetensors"))
        .arg("--result_dir")
        .arg(d.join("result"));
    c.args(extra).output().unwrap()
}

#[test]
fn every_mode_writes_one_line_per_utterance() {
    let d = setup("modes");
    let out = recognize(
        &d,
        &[
            "--beam_size",
            "3",
            "--batch_size",
            "2",
            "--ctc_weight",
            "0.5",
            "--reverse_weight",
            "0.3",
            "--decoding_chunk_size",
            "-1",
            "--modes",
            "ctc_greedy_search",
            "ctc_prefix_beam_search",
            "attention",
            "attention_rescoring",
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for mode in ["ctc_greedy_search", "ctc_prefix_beam_search", "attention", "attention_rescoring"] {
        let text = std::fs::read_to_string(d.join("result").join(mode).join("text")).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{mode}: {text}");
        // A batch is ordered longest first (u1, u0), but the file follows the list.
        let keys: Vec<&str> = lines.iter().map(|l| l.split(' ').next().unwrap()).collect();
        assert_eq!(keys, ["u0", "u1", "u2"], "{mode}");
        for line in &lines {
            let rest = line.split_once(' ').map_or("", |(_, r)| r);
            // Only table tokens come back; ▁ is a space, specials never appear in text.
            assert!(rest.chars().all(|c| "AB <unk>".contains(c)), "{mode}: {line:?}");
            assert!(!rest.contains('\u{2581}') && !rest.contains("sos"), "{mode}: {line:?}");
        }
    }
}

#[test]
fn greedy_and_prefix_beam_agree_with_beam_one() {
    let d = setup("beam1");
    let out = recognize(&d, &["--beam_size", "1", "--modes", "ctc_greedy_search", "ctc_prefix_beam_search"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let read = |m: &str| std::fs::read_to_string(d.join("result").join(m).join("text")).unwrap();
    assert_eq!(read("ctc_greedy_search"), read("ctc_prefix_beam_search"));
}

#[test]
fn unsupported_flags_are_typed_errors() {
    let d = setup("bad");
    let out = recognize(&d, &["--decoding_chunk_size", "0", "--modes", "attention"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("or a chunk size >= 1, found 0"), "{}", String::from_utf8_lossy(&out.stderr));
    // Streaming needs a model trained with chunks.
    let out = recognize(&d, &["--decoding_chunk_size", "4", "--simulate_streaming", "--modes", "ctc_greedy_search"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("use_dynamic_chunk"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = recognize(&d, &["--modes", "joint_decoding"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("found `joint_decoding`"));
    let out = recognize(&d, &["--device", "tpu", "--modes", "attention"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--device: expected cpu or cuda, found `tpu`"), "{}", String::from_utf8_lossy(&out.stderr));
    // Without a usable GPU (and not on the emulated one), cuda is a clear error naming the flag.
    if std::env::var_os("ASRFORGE_CUDA_EMU").is_none() && asrforge::Device::cuda(0).is_err() {
        let out = recognize(&d, &["--device", "cuda", "--modes", "attention"]);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("--device cuda (LOCAL_RANK 0)"), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn wenet_flags_are_accepted_or_refused_with_the_reason() {
    let d = setup("wenetflags");
    let ok =
        recognize(&d, &["--num_decoding_left_chunks", "-1", "--dtype", "fp32", "--blank_penalty", "0.5", "--length_penalty", "0.3", "--modes", "attention"]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let err = |extra: &[&str]| {
        let out = recognize(&d, extra);
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    assert!(err(&["--dtype", "fp16", "--modes", "attention"]).contains("half-precision decoding needs the GPU"));
    assert!(err(&["--dtype", "fp8", "--modes", "attention"]).contains("expected fp32, fp16 or bf16, found `fp8`"));
    assert!(err(&["--blank_penalty", "-1", "--modes", "attention"]).contains("--blank_penalty: expected a finite value >= 0"));
}

#[test]
fn blank_penalty_lets_tokens_through_a_blank_dominated_model() {
    let d = setup("blankpen");
    // The same random model with its blank logit raised by 40: every frame's arg-max is blank.
    let root: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(d.join("train.yaml")).unwrap()).unwrap();
    let (cfg, _) = ModelConfig::from_yaml(&root).unwrap();
    let mut model = AsrModel::without_cmvn_stats(&cfg, DType::F32, &mut Rng::new(5)).unwrap();
    let mut bias = model.ctc.ctc_lo.bias.as_ref().unwrap().to_f64_vec().unwrap();
    bias[0] += 40.0;
    model.ctc.ctc_lo.bias =
        Some(asrforge::Tensor::from_vec(bias.iter().map(|&x| x as f32).collect::<Vec<f32>>(), [bias.len()], &asrforge::Device::Cpu).unwrap());
    save_checkpoint(&model, &d.join("final.safetensors"), &serde_yaml_ng::Value::Null).unwrap();
    let count = |pen: &str| -> usize {
        let out = recognize(&d, &["--blank_penalty", pen, "--modes", "ctc_greedy_search"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = std::fs::read_to_string(d.join("result").join("ctc_greedy_search").join("text")).unwrap();
        assert_eq!(text.lines().count(), 3);
        text.lines().map(|l| l.split_once(' ').map_or(0, |(_, r)| r.replace(' ', "").chars().count())).sum()
    };
    assert_eq!(count("0"), 0, "blank wins every frame without a penalty");
    // A penalty of 1000 takes blank out of every frame's arg-max: each utterance emits at least one token.
    assert!(count("1000") >= 3);
}

#[test]
fn a_missing_units_file_from_train_yaml_says_where_it_came_from() {
    let d = setup("units");
    let cfg = std::fs::read_to_string(d.join("train.yaml")).unwrap().replace(d.join("units.txt").to_str().unwrap(), "data/dict/units.txt");
    std::fs::write(d.join("train.yaml"), cfg).unwrap();
    let out = recognize(&d, &["--modes", "attention"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("tokenizer_conf.symbol_table_path") && err.contains("train.yaml") && err.contains("--symbol_table"), "{err}");
    // Naming the file on the command line fixes it.
    let ok = recognize(&d, &["--symbol_table", d.join("units.txt").to_str().unwrap(), "--modes", "attention"]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
}

#[test]
fn simulated_streaming_writes_what_chunk_masked_decoding_writes() {
    let d = setup("stream");
    // The same weights as a dynamic-chunk model with a causal convolution (same shapes).
    let dynamic = ["--override_config", "encoder_conf.use_dynamic_chunk true", "--override_config", "encoder_conf.causal true"];
    let modes = ["ctc_greedy_search", "ctc_prefix_beam_search", "attention_rescoring"];
    for (chunk, left) in [("2", "-1"), ("1", "1")] {
        let mut texts: Vec<Vec<String>> = Vec::new();
        for stream in [false, true] {
            let mut args: Vec<&str> = dynamic.to_vec();
            args.extend(["--decoding_chunk_size", chunk, "--num_decoding_left_chunks", left, "--beam_size", "3", "--batch_size", "2"]);
            if stream {
                args.push("--simulate_streaming");
            }
            args.push("--modes");
            args.extend(modes);
            let out = recognize(&d, &args);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            texts.push(modes.iter().map(|m| std::fs::read_to_string(d.join("result").join(m).join("text")).unwrap()).collect());
        }
        for (i, m) in modes.iter().enumerate() {
            assert_eq!(texts[0][i].lines().count(), 3, "{m}: {}", texts[0][i]);
            assert_eq!(texts[0][i], texts[1][i], "{m}, chunk {chunk} left {left}");
        }
    }
}

/// Appends utterances of random noise of the given lengths (seconds) to the test list.
fn add_utts(d: &Path, utts: &[(&str, f64)]) {
    let spec = hound::WavSpec { channels: 1, sample_rate: 16000, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let mut rng = Rng::new(12);
    let mut list = std::fs::read_to_string(d.join("data.list")).unwrap();
    for (key, secs) in utts {
        let wav = d.join(format!("{key}.wav"));
        let mut w = hound::WavWriter::create(&wav, spec).unwrap();
        for x in rng.normal((16000.0 * secs) as usize) {
            w.write_sample((x * 3000.0) as i16).unwrap();
        }
        w.finalize().unwrap();
        list.push_str(&format!("{{\"key\": \"{key}\", \"wav\": \"{}\", \"txt\": \"A\"}}\n", wav.display()));
    }
    std::fs::write(d.join("data.list"), list).unwrap();
}

#[test]
fn utterances_too_short_to_encode_are_skipped_and_counted_in_every_decoding() {
    let d = setup("short");
    // 25 ms windows every 10 ms: 0.07 s is 5 feature frames and 0.1 s is 8. conv2d
    // subsampling reads 7 frames per encoder frame: "tiny" gives none, "eight" one.
    add_utts(&d, &[("tiny", 0.07), ("eight", 0.1)]);
    let limits = asrforge::data::ModelLimits { subsampling: vec![(3, 2), (3, 2)], max_encoder_frames: None, ctc: false };
    assert_eq!((limits.min_feature_frames(), limits.encoder_frames(6), limits.encoder_frames(7)), (7, 0, 1));
    let dynamic = ["--override_config", "encoder_conf.use_dynamic_chunk true", "--override_config", "encoder_conf.causal true"];
    let modes = ["ctc_greedy_search", "ctc_prefix_beam_search", "attention", "attention_rescoring"];
    for chunk in [None, Some("4"), Some("1")] {
        for stream in [false, true] {
            if chunk.is_none() && stream {
                continue;
            }
            let mut args: Vec<&str> = dynamic.to_vec();
            args.extend(["--beam_size", "3", "--batch_size", "2", "--attention_ctc_weight", "0.3"]);
            if let Some(c) = chunk {
                args.extend(["--decoding_chunk_size", c]);
            }
            if stream {
                args.push("--simulate_streaming");
            }
            args.push("--modes");
            args.extend(modes);
            let out = recognize(&d, &args);
            let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success(), "chunk {chunk:?} stream {stream}: {said}");
            assert!(said.contains("too_short_to_encode 1") && said.contains("tiny (too_short_to_encode)"), "{said}");
            assert!(said.contains("expected at least 7 feature frames (what one encoder frame reads), found 5"), "{said}");
            for m in modes {
                let text = std::fs::read_to_string(d.join("result").join(m).join("text")).unwrap();
                let keys: Vec<&str> = text.lines().map(|l| l.split(' ').next().unwrap()).collect();
                assert_eq!(keys, ["u0", "u1", "u2", "eight"], "{m}, chunk {chunk:?} stream {stream}");
            }
        }
    }
    let out = recognize(&d, &["--attention_ctc_weight", "1.5", "--modes", "attention"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--attention_ctc_weight: expected a weight in [0, 1], found 1.5"));
}
