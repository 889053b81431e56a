//! asrforge's sentencepiece reader and WeNet BpeTokenizer rules against the
//! output of sentencepiece itself: tests/fixtures/spm/ holds four models
//! (unigram, bpe, unigram with byte fallback and a user-defined symbol, bpe
//! without normalisation rules)
//! trained by scripts/make_spm_fixtures.py, and for 32 sentences the
//! normalised text, pieces and ids that sentencepiece gave, and the tokens of
//! WeNet's BpeTokenizer rules with `<NOISE>` as a non-language symbol.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use asrforge::data::config::TokenizerConf;
use asrforge::data::sentencepiece::proto::{ModelType, PieceType};
use asrforge::data::sentencepiece::SentencePiece;
use asrforge::data::tokenizer::{bpe_text, SymbolTable, Tokenizer};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/spm")
}

fn expected() -> Value {
    let text = std::fs::read_to_string(fixtures().join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_string()).collect()
}

#[test]
fn pieces_and_ids_equal_sentencepiece_for_every_model_and_sentence() {
    let exp = expected();
    let models = exp["models"].as_object().unwrap();
    assert_eq!(models.len(), 4);
    for (name, m) in models {
        let spm = SentencePiece::read(&fixtures().join(m["model"].as_str().unwrap())).unwrap();
        let cases = m["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 32, "{name}");
        for c in cases {
            let text = c["text"].as_str().unwrap();
            assert_eq!(spm.normalize(text), c["normalized"].as_str().unwrap(), "{name}: normalised `{text}`");
            let got = spm.encode(text);
            let pieces: Vec<String> = got.iter().map(|p| p.piece.clone()).collect();
            let ids: Vec<i64> = got.iter().map(|p| p.id as i64).collect();
            assert_eq!(pieces, strings(&c["pieces"]), "{name}: pieces of `{text}`");
            let want_ids: Vec<i64> = c["ids"].as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect();
            assert_eq!(ids, want_ids, "{name}: ids of `{text}`");
        }
    }
}

#[test]
fn models_are_read_with_their_type_and_normaliser() {
    let uni = SentencePiece::read(&fixtures().join("unigram.model")).unwrap();
    let bpe = SentencePiece::read(&fixtures().join("bpe.model")).unwrap();
    let bytes = SentencePiece::read(&fixtures().join("unigram_bytes.model")).unwrap();
    assert_eq!(uni.proto().model_type, ModelType::Unigram);
    assert_eq!(bpe.proto().model_type, ModelType::Bpe);
    assert!(bytes.proto().byte_fallback && !uni.proto().byte_fallback);
    assert_eq!(uni.proto().normalizer.name, "nmt_nfkc");
    // sentencepiece's default layout: <unk> 0, <s> 1, </s> 2.
    assert_eq!(uni.id_to_piece(0), Some("<unk>"));
    assert_eq!(uni.proto().pieces[0].kind, PieceType::Unknown);
    assert_eq!(uni.proto().pieces[1].kind, PieceType::Control);
    assert_eq!(bytes.proto().pieces[3].piece, "<NOISE>");
    assert_eq!(bytes.proto().pieces[3].kind, PieceType::UserDefined);
    assert_eq!(bytes.proto().pieces.iter().filter(|p| p.kind == PieceType::Byte).count(), 256);
    // NFKC maps the full-width A to A and the ligature ﬁ to fi.
    assert_eq!(uni.normalize("\u{ff21} \u{fb01}"), "\u{2581}A\u{2581}fi");
}

fn tokenizer(name: &str, non_lang: bool) -> Tokenizer {
    let dir = fixtures();
    let conf = TokenizerConf {
        symbol_table_path: Some(dir.join(format!("{name}.units.txt")).display().to_string()),
        bpe_path: Some(dir.join(format!("{name}.model")).display().to_string()),
        non_lang_syms_path: None,
        ..TokenizerConf::default()
    };
    let tok = Tokenizer::from_conf(Some("bpe"), &conf, None).unwrap();
    if non_lang {
        let table = SymbolTable::read(Path::new(conf.symbol_table_path.as_deref().unwrap())).unwrap();
        let spm = Arc::new(SentencePiece::read(Path::new(conf.bpe_path.as_deref().unwrap())).unwrap());
        return Tokenizer::bpe(table, spm, Some(vec!["<NOISE>".into()]));
    }
    tok
}

#[test]
fn wenet_bpe_tokens_and_ids_equal_wenets_rules() {
    let exp = expected();
    assert_eq!(strings(&exp["non_lang_syms"]), vec!["<NOISE>"]);
    for (name, m) in exp["models"].as_object().unwrap() {
        let tok = tokenizer(name, true);
        for c in m["cases"].as_array().unwrap() {
            let text = c["text"].as_str().unwrap();
            let want = strings(&c["wenet_tokens"]);
            assert_eq!(tok.tokens(text), want, "{name}: WeNet tokens of `{text}`");
            // ids through units.txt, <unk> (1) where a token is missing.
            let ids: Vec<i64> = want.iter().map(|t| tok.table().get(t).unwrap_or(1)).collect();
            assert_eq!(tok.encode(text), ids, "{name}: ids of `{text}`");
        }
    }
}

#[test]
fn without_non_language_symbols_brackets_go_through_the_model() {
    let tok = tokenizer("bpe", false);
    let spm = SentencePiece::read(&fixtures().join("bpe.model")).unwrap();
    let want: Vec<String> = spm.encode("<NOISE> HELLO").into_iter().map(|p| p.piece).collect();
    assert_eq!(tok.tokens("<noise> hello"), want);
    assert!(want.len() > 2, "the bracketed symbol is split into pieces: {want:?}");
    // With a symbol file that does not list it, WeNet still cuts the line
    // around the bracketed part and encodes the parts one by one.
    let table = SymbolTable::read(&fixtures().join("bpe.units.txt")).unwrap();
    let cut = Tokenizer::bpe(table, Arc::new(spm.clone()), Some(vec![]));
    let mut parts: Vec<String> = Vec::new();
    for p in ["HELLO", "<NOISE>", "WORLD"] {
        parts.extend(spm.encode(p).into_iter().map(|p| p.piece));
    }
    assert_eq!(cut.tokens("hello<noise>world"), parts);
    let whole: Vec<String> = spm.encode("HELLO<NOISE>WORLD").into_iter().map(|p| p.piece).collect();
    assert_eq!(tok.tokens("hello<noise>world"), whole);
    assert_ne!(parts, whole, "cutting changes the pieces here (each part gets its own `▁`)");
}

#[test]
fn units_txt_has_wenets_layout_and_ids_round_trip_to_text() {
    let tok = tokenizer("unigram", false);
    let t = tok.table();
    assert_eq!(t.get("<blank>"), Some(0));
    assert_eq!(t.get("<unk>"), Some(1));
    assert_eq!(t.get("<sos/eos>"), Some(t.len() as i64 - 1));
    let text = "THE QUICK BROWN FOX";
    let ids = tok.encode(text);
    assert!(!ids.contains(&1), "every piece of `{text}` is in units.txt: {ids:?}");
    let by_id: std::collections::HashMap<i64, String> = t.entries().map(|(p, i)| (i, p.to_string())).collect();
    let pieces: Vec<&str> = ids.iter().map(|i| by_id[i].as_str()).collect();
    assert_eq!(bpe_text(&pieces), text);
    // recognize writes hypotheses through the same rule.
    let ids: Vec<usize> = ids.iter().map(|&i| i as usize).collect();
    assert_eq!(asrforge::decode::recognize::Detokenizer::bpe(t).text(&ids).unwrap(), text);
    assert_eq!(bpe_text(&["\u{2581}A", "B", "\u{2581}", "\u{2581}C\u{2581}"]), "AB  C");
}

#[test]
fn bpe_config_errors_name_the_key_and_the_path() {
    let dir = fixtures();
    let units = dir.join("bpe.units.txt").display().to_string();
    let conf = |bpe: Option<&str>| TokenizerConf { symbol_table_path: Some(units.clone()), bpe_path: bpe.map(str::to_string), ..TokenizerConf::default() };
    let e = Tokenizer::from_conf(Some("bpe"), &conf(None), None).unwrap_err().to_string();
    assert!(e.contains("bpe_path") && e.contains("found none"), "{e}");
    let e = Tokenizer::from_conf(Some("bpe"), &conf(Some("no/such.model")), None).unwrap_err().to_string();
    assert!(e.contains("tokenizer_conf.bpe_path") && e.contains("no/such.model") && e.contains("read from the config"), "{e}");
    let e = Tokenizer::from_conf(None, &conf(Some("x.model")), None).unwrap_err().to_string();
    assert!(e.contains("tokenizer: bpe"), "{e}");
    let e = Tokenizer::from_conf(Some("whisper"), &conf(None), None).unwrap_err().to_string();
    assert!(e.contains("expected `char` or `bpe`, found `whisper`"), "{e}");
}

#[test]
fn word_and_char_models_are_refused() {
    let bytes = std::fs::read(fixtures().join("unigram.model")).unwrap();
    let mut proto = asrforge::data::sentencepiece::proto::parse_model(&bytes, "m.model").unwrap();
    proto.model_type = ModelType::Word;
    let e = SentencePiece::from_proto(proto, "m.model").unwrap_err().to_string();
    assert!(e.contains("m.model") && e.contains("expected unigram or bpe, found Word"), "{e}");
}
