//! Every kind of bad input is skipped, counted by reason, and the epoch goes on.

mod data_common;

use std::sync::Arc;

use asrforge::data::config::{BatchConf, DatasetConf, FilterConf};
use asrforge::data::list::{DataList, ListFormat};
use asrforge::data::loader::{DataLoader, LoaderConf};
use asrforge::data::process::Processor;
use asrforge::data::tokenizer::{SymbolTable, TokenizeMode, Tokenizer};
use asrforge::data::SkipReason as R;
use data_common::{sine, write_wav};

fn tok() -> Arc<Tokenizer> {
    Arc::new(Tokenizer::new(SymbolTable::parse(data_common::UNITS, "units").unwrap(), TokenizeMode::Char, vec![]))
}

fn conf() -> DatasetConf {
    let mut c = DatasetConf::default().for_cv();
    c.filter_conf = FilterConf {
        max_length: 150.0,
        min_length: 10.0,
        token_max_length: 8,
        token_min_length: 2,
        min_output_input_ratio: 0.015,
        max_output_input_ratio: 0.5,
    };
    c.fbank_conf.num_mel_bins = 20;
    c.batch_conf = BatchConf { batch_type: "dynamic".into(), max_frames_in_batch: 130, ..Default::default() };
    c
}

fn json(key: &str, wav: &std::path::Path, txt: &str) -> String {
    format!(r#"{{"key": "{key}", "wav": "{}", "txt": "{txt}"}}"#, wav.display())
}

#[test]
fn every_bad_input_kind_is_skipped_and_counted() {
    let dir = data_common::tmpdir("skips");
    let wav = |name: &str, secs: f64| {
        let p = dir.join(format!("{name}.wav"));
        write_wav(&p, &sine(300.0, 16000, secs, 0.3), 16000, 16);
        p
    };
    let mut lines = Vec::new();
    for i in 0..3 {
        lines.push(json(&format!("good{i}"), &wav(&format!("good{i}"), 0.5), "ABC"));
    }
    lines.push(r#"{"key": "broken", "wav": }"#.into()); // malformed JSON
    lines.push(r#"{"wav": "/x.wav", "txt": "A"}"#.into()); // JSON without key
    lines.push("onlyakey".into()); // neither JSON nor `key wav txt`
    lines.push(json("missing", &dir.join("nope.wav"), "AB"));
    lines.push(json("adir", &dir, "AB"));
    let corrupt = dir.join("corrupt.wav");
    std::fs::write(&corrupt, b"RIFF\x10\x00\x00\x00WAVEjunkjunkjunk").unwrap();
    lines.push(json("corrupt", &corrupt, "AB"));
    let trunc = wav("trunc", 0.5);
    let bytes = std::fs::read(&trunc).unwrap();
    std::fs::write(&trunc, &bytes[..bytes.len() / 2]).unwrap();
    lines.push(json("truncated", &trunc, "AB"));
    lines.push(json("empty", &wav("empty", 0.5), ""));
    lines.push(json("blank", &wav("blank", 0.5), "   "));
    lines.push(json("short", &wav("short", 0.05), "AB"));
    lines.push(json("long", &wav("long", 2.0), "AB"));
    lines.push(json("few", &wav("few", 0.5), "A"));
    lines.push(json("many", &wav("many", 1.0), "ABCDEABCD"));
    lines.push(json("ratiohigh", &wav("ratiohigh", 0.12), "ABCDEAB"));
    lines.push(json("ratiolow", &wav("ratiolow", 1.45), "AB"));
    lines.push(json("overbudget", &wav("overbudget", 1.4), "ABCDE"));
    let list = DataList::from_lines("bad.list", ListFormat::Raw, lines);
    let l = DataLoader::new(list, Processor::new(&conf(), Some(tok())).unwrap(), LoaderConf { log: false, ..Default::default() }).unwrap();
    let mut it = l.epoch(0);
    let keys: Vec<String> = it.by_ref().flat_map(|b| b.keys).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(sorted, vec!["good0", "good1", "good2"]);
    let s = &it.summary().unwrap().skips;
    let expect = [
        (R::MalformedLine, 3),
        (R::MissingFile, 1),
        (R::UnreadableFile, 1),
        (R::CorruptAudio, 2),
        (R::EmptyTranscript, 2),
        (R::TooShort, 1),
        (R::TooLong, 1),
        (R::TooFewTokens, 1),
        (R::TooManyTokens, 1),
        (R::RatioTooHigh, 1),
        (R::RatioTooLow, 1),
        (R::OverBatchBudget, 1),
    ];
    for (reason, n) in expect {
        assert_eq!(s.count(reason), n, "{reason}: {}", s.summary());
    }
    assert_eq!(s.total(), 16);
    // The first skips are kept with their key and what was wrong.
    assert_eq!(s.first().len(), 5);
    assert_eq!(s.first()[0].key, "line 4");
    assert!(s.first()[0].detail.contains("invalid JSON"), "{}", s.first()[0].detail);
    assert_eq!(s.first()[3].key, "missing");
    assert!(s.first()[3].detail.contains("nope.wav"), "{}", s.first()[3].detail);
    assert!(s.summary().starts_with("skipped 16 (malformed_line 3, missing_file 1"), "{}", s.summary());
}

#[test]
fn bad_shards_are_skipped_and_the_good_part_kept() {
    let dir = data_common::tmpdir("skips-shards");
    let wav = dir.join("a.wav");
    write_wav(&wav, &sine(300.0, 16000, 0.5, 0.3), 16000, 16);
    let make = |name: &str, keys: &[&str], with_txt: bool| {
        let path = dir.join(name);
        let mut tar = tar::Builder::new(std::fs::File::create(&path).unwrap());
        for k in keys {
            tar.append_path_with_name(&wav, format!("{k}.wav")).unwrap();
            if with_txt {
                let mut h = tar::Header::new_gnu();
                h.set_size(3);
                h.set_mode(0o644);
                h.set_cksum();
                tar.append_data(&mut h, format!("{k}.txt"), &b"ABC"[..]).unwrap();
            }
        }
        tar.finish().unwrap();
        path
    };
    let good = make("good.tar", &["s1", "s2"], true);
    let notxt = make("notxt.tar", &["n1"], false);
    let full = make("trunc.tar", &["t1", "t2", "t3"], true);
    // Cut inside the third member pair: t1 and t2 survive, the damage is one bad_shard.
    let bytes = std::fs::read(&full).unwrap();
    let trunc = dir.join("truncated.tar");
    std::fs::write(&trunc, &bytes[..bytes.len() * 3 / 4]).unwrap();
    let garbage = dir.join("garbage.tar");
    std::fs::write(&garbage, vec![0x5a; 1500]).unwrap();
    let lines = [&good, &notxt, &trunc, &garbage, &dir.join("absent.tar")].iter().map(|p| p.display().to_string()).collect();
    let list = DataList::from_lines("shards", ListFormat::Shard, lines);
    let mut c = conf();
    c.batch_conf = BatchConf::default();
    let l = DataLoader::new(list, Processor::new(&c, Some(tok())).unwrap(), LoaderConf { log: false, ..Default::default() }).unwrap();
    let mut it = l.epoch(0);
    let mut keys: Vec<String> = it.by_ref().flat_map(|b| b.keys).collect();
    keys.sort();
    assert_eq!(keys, vec!["s1", "s2", "t1", "t2"]);
    let s = &it.summary().unwrap().skips;
    assert_eq!(s.count(R::EmptyTranscript), 1, "{}", s.summary());
    assert_eq!(s.count(R::BadShard), 2, "{}", s.summary());
    assert_eq!(s.count(R::MissingFile), 1, "{}", s.summary());
    assert_eq!(s.total(), 4);
}
