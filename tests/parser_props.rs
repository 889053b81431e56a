//! Property tests of the parsers a user feeds, with a seeded generator and a
//! fixed number of cases (each test runs in a few seconds): `units.txt`,
//! `train.yaml` with `--override_config`, DeepSpeed JSON, and safetensors
//! headers (WAV headers and data.list lines: tests/data_fuzz.rs). Inputs are
//! valid files with random edits (bytes flipped, spans cut or doubled,
//! pieces of the format's own syntax inserted) and plain noise. Property:
//! the parser never panics; it returns a value or an error whose message
//! names the input (its path, or the override key it was given).

mod train_common;

use asrforge::models::checkpoint::{load_checkpoint, save_checkpoint};
use asrforge::models::{AsrModel, ModelConfig};
use asrforge::tensor::rng::Rng;
use asrforge::DType;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// One random edit of `base`, or noise; `pieces` are tokens of the format.
fn mutate(rng: &mut Rng, base: &[u8], pieces: &[&str]) -> Vec<u8> {
    if rng.below(10) == 0 {
        return (0..rng.below(300)).map(|_| rng.below(256) as u8).collect();
    }
    let mut d = base.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(d.len() + 1);
        match rng.below(5) {
            0 if !d.is_empty() => {
                let i = at.min(d.len() - 1);
                d[i] = rng.below(256) as u8;
            }
            1 => {
                let end = (at + rng.below(20)).min(d.len());
                d.drain(at..end);
            }
            2 => {
                let end = (at + rng.below(40)).min(d.len());
                let span = d[at..end].to_vec();
                d.splice(at..at, span);
            }
            _ => {
                let p = pieces[rng.below(pieces.len())].as_bytes().to_vec();
                d.splice(at..at, p);
            }
        }
    }
    d
}

/// Runs `parse` on `input`, failing with the input shown when it panics.
fn no_panic<T>(what: &str, input: &[u8], parse: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(parse)) {
        Ok(v) => v,
        Err(_) => panic!("{what} panicked on the input {:?}", String::from_utf8_lossy(input)),
    }
}

#[test]
fn units_txt_never_panics_and_errors_name_the_file() {
    let mut rng = Rng::new(1);
    let pieces = ["<blank> 0\n", "<unk> 1\n", " ", "\t", "\n", "-1", "99999999999999999999", "A", "A 3\n", "<sos/eos>", "é", "\r\n", "#"];
    let (mut ok, mut err) = (0, 0);
    for _ in 0..4000 {
        let input = mutate(&mut rng, train_common_units().as_bytes(), &pieces);
        let text = String::from_utf8_lossy(&input).into_owned();
        match no_panic("SymbolTable::parse", &input, || asrforge::data::tokenizer::SymbolTable::parse(&text, "fuzz/units.txt")) {
            Ok(_) => ok += 1,
            Err(e) => {
                assert!(e.to_string().contains("fuzz/units.txt"), "the error names the file: {e}");
                err += 1;
            }
        }
    }
    println!("units.txt: {ok} parsed, {err} refused");
    assert!(ok > 0 && err > 0, "the cases reach both outcomes: {ok} ok, {err} errors");
}

fn train_common_units() -> String {
    "<blank> 0\n<unk> 1\n\u{2581} 2\nA 3\nB 4\nC 5\nD 6\nE 7\n<sos/eos> 8\n".to_string()
}

#[test]
fn train_yaml_with_overrides_never_panics_and_errors_name_the_file_or_key() {
    let dir = train_common::tmpdir("props-yaml");
    let base = format!("input_dim: 20\noutput_dim: 9\n{}", train_common::tiny_yaml(0.1, 2, 3, ""));
    let mut rng = Rng::new(2);
    let pieces =
        [": ", "\n", "    ", "- ", "[", "]", "{", "}", "null", "1e999", "-7", ".nan", "&a", "*a", "!!binary", "'", "\"", "encoder_conf:", "output_size: "];
    let keys = ["max_epoch", "optim_conf.lr", "encoder_conf.output_size", "dataset_conf.batch_conf.batch_size", "a.b.c", "", ".", "model_conf..x"];
    let values = ["1", "-1", "1e999", "nan", "abc", "[1, 2]", "{", "", "0", "true"];
    let (mut ok, mut err) = (0, 0);
    for i in 0..1500 {
        let input = if i % 3 == 0 { base.as_bytes().to_vec() } else { mutate(&mut rng, base.as_bytes(), &pieces) };
        let path = dir.join("train.yaml");
        std::fs::write(&path, &input).unwrap();
        let overrides: Vec<String> = (0..rng.below(3)).map(|_| format!("{} {}", keys[rng.below(keys.len())], values[rng.below(values.len())])).collect();
        let r = no_panic("read_config + parse_train_config + ModelConfig::from_yaml", &input, || {
            let root = asrforge::train::read_config(&path, &overrides)?;
            asrforge::train::parse_train_config(&root)?;
            ModelConfig::from_yaml(&root)
        });
        match r {
            Ok(_) => ok += 1,
            Err(e) => {
                let m = e.to_string();
                let named = m.contains("train.yaml")
                    || overrides.iter().any(|o| m.contains(o.split(' ').next().unwrap_or("")) && !o.starts_with(' '))
                    || m.contains("config key");
                assert!(named, "the error names the file or the key: {m}\noverrides {overrides:?}");
                err += 1;
            }
        }
    }
    println!("train.yaml: {ok} parsed, {err} refused");
    assert!(ok > 0 && err > 0, "{ok} ok, {err} errors");
}

#[test]
fn deepspeed_json_never_panics_and_errors_name_the_file() {
    let base = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/conf/ds_stage2.json")).unwrap();
    let mut rng = Rng::new(3);
    let pieces = [
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "\"",
        "null",
        "true",
        "1e999",
        "-1",
        "\"auto\"",
        "\"fp16\": {\"enabled\": true}",
        "\"zero_optimization\"",
        "\"stage\": 3",
    ];
    let (mut ok, mut err) = (0, 0);
    for _ in 0..4000 {
        let input = mutate(&mut rng, &base, &pieces);
        let text = String::from_utf8_lossy(&input).into_owned();
        match no_panic("parse_deepspeed_config", &input, || asrforge::engine::deepspeed::parse_deepspeed_config(&text, "fuzz/ds.json")) {
            Ok((cfg, _)) => {
                // What parsed is usable without a panic too.
                let _ = no_panic("DeepSpeedConfig accessors", &input, || (cfg.precision().is_ok(), cfg.scaler_config(), cfg.zero_options()));
                ok += 1;
            }
            Err(e) => {
                assert!(e.to_string().contains("fuzz/ds.json"), "the error names the file: {e}");
                err += 1;
            }
        }
    }
    println!("DeepSpeed JSON: {ok} parsed, {err} refused");
    assert!(ok > 0 && err > 0, "{ok} ok, {err} errors");
}

#[test]
fn safetensors_headers_never_panic_and_errors_name_the_file() {
    let dir = train_common::tmpdir("props-safetensors");
    let yaml = train_common::tiny_yaml(0.0, 2, 1, "");
    let root: serde_yaml_ng::Value = serde_yaml_ng::from_str(&format!("input_dim: 20\noutput_dim: 9\n{yaml}")).unwrap();
    let (mcfg, _) = ModelConfig::from_yaml(&root).unwrap();
    let model = AsrModel::new(&mcfg, DType::F32, &mut Rng::new(1)).unwrap();
    let good = dir.join("good.safetensors");
    save_checkpoint(&model, &good, &serde_yaml_ng::Value::Mapping(Default::default())).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = bytes[..8 + header_len].to_vec();
    let body = bytes[8 + header_len..].to_vec();
    let mut rng = Rng::new(4);
    let pieces = [
        "{",
        "}",
        "\"dtype\":\"F64\"",
        "\"shape\":[99999999,99999999]",
        "\"data_offsets\":[0,18446744073709551615]",
        "\"F32\"",
        ",",
        "\"__metadata__\":{}",
        "\"I8\"",
    ];
    let path = dir.join("fuzz.safetensors");
    let (mut ok, mut err) = (0, 0);
    for i in 0..600 {
        // Edits inside the header (the length prefix included), the body kept.
        let mut input = if i % 10 == 0 { header.clone() } else { mutate(&mut rng, &header, &pieces) };
        if i % 4 == 0 {
            let n = (input.len().saturating_sub(8)) as u64;
            if input.len() >= 8 {
                input[..8].copy_from_slice(&n.to_le_bytes());
            }
        }
        input.extend_from_slice(&body);
        std::fs::write(&path, &input).unwrap();
        match no_panic("load_checkpoint", &input[..input.len().min(8 + header_len + 64)], || load_checkpoint(&model, &path, true)) {
            Ok(_) => ok += 1,
            Err(e) => {
                assert!(e.to_string().contains("fuzz.safetensors"), "the error names the file: {e}");
                err += 1;
            }
        }
    }
    println!("safetensors: {ok} loaded, {err} refused");
    assert!(ok > 0 && err > 0, "{ok} ok, {err} errors");
}

/// Sentences that reach the normaliser's and the encoders' corner cases.
const SPM_TEXTS: [&str; 5] = ["The quick  brown fox", "  café 你好 <NOISE>x ", "ＦＵＬＬ ﬁ ½", "", "😀😀 zz"];

#[test]
fn sentencepiece_models_never_panic_and_errors_name_the_file() {
    use asrforge::data::sentencepiece::SentencePiece;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/spm");
    let mut rng = Rng::new(15);
    // Protobuf keys and values of the schema: a piece (field 1), its type
    // (3: unknown, byte, user-defined), trainer and normalizer specs, long
    // varints, a 32-bit float key.
    let pieces = [
        "\n",
        "\u{12}",
        "\u{1a}",
        "\u{15}",
        "\u{18}\u{02}",
        "\u{18}\u{06}",
        "\u{18}\u{04}",
        "\u{18}\u{05}",
        "\u{08}\u{7f}",
        "<0x41>",
        "\u{7f}\u{7f}\u{7f}\u{7f}\u{7f}",
        "\n\u{01}A",
    ];
    let check =
        |input: &[u8], cases: &mut (usize, usize)| match no_panic("SentencePiece::from_bytes", input, || SentencePiece::from_bytes(input, "fuzz/x.model")) {
            Ok(spm) => {
                for t in SPM_TEXTS {
                    let got = no_panic("SentencePiece::encode", input, || spm.encode(t));
                    if !spm.proto().byte_fallback {
                        let joined: String = got.iter().map(|p| p.piece.as_str()).collect();
                        assert_eq!(joined, spm.normalize(t), "the pieces spell the normalised text `{t}`");
                    }
                }
                cases.0 += 1;
            }
            Err(e) => {
                assert!(e.to_string().contains("fuzz/x.model"), "the error names the file: {e}");
                cases.1 += 1;
            }
        };
    let small = std::fs::read(dir.join("bpe_identity.model")).unwrap();
    let mut counts = (0, 0);
    for _ in 0..3000 {
        check(&mutate(&mut rng, &small, &pieces), &mut counts);
    }
    // The nmt_nfkc model: edits inside its 240 kB character map reach the trie reader.
    let big = std::fs::read(dir.join("unigram.model")).unwrap();
    for _ in 0..100 {
        check(&mutate(&mut rng, &big, &pieces), &mut counts);
    }
    let (ok, err) = counts;
    println!("sentencepiece .model: {ok} parsed, {err} refused");
    assert!(ok > 0 && err > 0, "the cases reach both outcomes: {ok} ok, {err} errors");
}
