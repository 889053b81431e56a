//! Fuzz-style: random bytes as WAV and random lines as a data list never panic.

mod data_common;

use std::io::Cursor;
use std::sync::Arc;

use asrforge::data::audio::decode_wav;
use asrforge::data::config::DatasetConf;
use asrforge::data::list::{parse_raw_line, DataList, ListFormat};
use asrforge::data::loader::{DataLoader, LoaderConf};
use asrforge::data::process::Processor;
use asrforge::data::tokenizer::{SymbolTable, TokenizeMode, Tokenizer};
use asrforge::tensor::rng::Rng;

fn bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    rng.uniform(n).into_iter().map(|u| (u * 256.0) as u8).collect()
}

#[test]
fn random_and_mutated_wav_bytes_never_panic() {
    let dir = data_common::tmpdir("fuzz-wav");
    let good = dir.join("g.wav");
    data_common::write_wav(&good, &data_common::sine(440.0, 16000, 0.05, 0.3), 16000, 16);
    let valid = std::fs::read(&good).unwrap();
    let mut rng = Rng::new(42);
    let (mut ok, mut err) = (0, 0);
    for i in 0..2000 {
        let data = if i % 2 == 0 {
            let n = rng.below(200);
            let mut d = b"RIFF\x00\x00\x00\x00WAVEfmt ".to_vec();
            d.extend(bytes(&mut rng, n));
            d
        } else {
            // A valid file with a few bytes (often header fields) overwritten, or cut short.
            let mut d = valid.clone();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(60.min(d.len()));
                d[at] = bytes(&mut rng, 1)[0];
            }
            if rng.below(3) == 0 {
                d.truncate(rng.below(d.len()));
            }
            d
        };
        match decode_wav(Cursor::new(data), None, None) {
            Ok(w) => {
                assert!(w.samples.iter().all(|s| s.is_finite() && s.abs() <= 1.0));
                ok += 1
            }
            Err(msg) => {
                assert!(!msg.is_empty());
                err += 1
            }
        }
    }
    assert_eq!(ok + err, 2000);
    assert!(err > 1000, "most random inputs are rejected: {ok} ok, {err} errors");
}

#[test]
fn random_list_lines_never_panic() {
    let dir = data_common::tmpdir("fuzz-list");
    let mut lines = data_common::make_corpus(&dir, 5, 16000);
    let mut rng = Rng::new(7);
    let pieces =
        ["{", "}", "\"key\"", "\"wav\"", "\"txt\"", ":", ",", "\"", "null", "1e999", "-3", "[", "]", " ", "\u{2581}", "é", "\\", "start", "end", "/tmp"];
    for _ in 0..300 {
        let n = rng.below(12);
        let line: String = (0..n).map(|_| pieces[rng.below(pieces.len())]).collect();
        let _ = parse_raw_line(&line, 1);
        lines.push(line);
        let raw = String::from_utf8_lossy(&bytes(&mut rng, 30)).to_string();
        let _ = parse_raw_line(&raw, 1);
        lines.push(raw);
    }
    lines.push(r#"{"key": "neg", "wav": "/x.wav", "txt": "A", "start": -1}"#.into());
    lines.push(r#"{"key": "rev", "wav": "/x.wav", "txt": "A", "start": 2, "end": 1}"#.into());
    let table = SymbolTable::parse(data_common::UNITS, "units").unwrap();
    let tok = Arc::new(Tokenizer::new(table, TokenizeMode::Char, vec![]));
    let mut c = DatasetConf::default();
    c.filter_conf.min_length = 1.0;
    c.fbank_conf.num_mel_bins = 10;
    let list = DataList::from_lines("fuzz.list", ListFormat::Raw, lines.clone());
    let n_lines = list.len();
    let l = DataLoader::new(list, Processor::new(&c, Some(tok)).unwrap(), LoaderConf { log: false, ..Default::default() }).unwrap();
    let mut it = l.epoch(0);
    let got: usize = it.by_ref().map(|b| b.len()).sum();
    let s = it.summary().unwrap();
    assert_eq!(got, 5, "the five real utterances survive");
    assert_eq!(got + s.skips.total(), n_lines, "every other line is one counted skip");
}
