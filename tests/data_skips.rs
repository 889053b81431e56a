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

/// Runs one epoch of `lines` through a processor with `limits`; returns (keys in batches, skips).
fn epoch_with_limits(
    lines: Vec<String>,
    dir: &std::path::Path,
    c: DatasetConf,
    limits: asrforge::data::ModelLimits,
) -> (Vec<String>, asrforge::data::SkipStats) {
    let list_path = dir.join("data.list");
    std::fs::write(&list_path, lines.join("\n")).unwrap();
    let list = DataList::read(&list_path, ListFormat::Raw).unwrap();
    let proc = Processor::new(&c, Some(tok())).unwrap().with_limits(limits);
    let loader = DataLoader::new(list, proc, LoaderConf { num_workers: 2, log: false, ..Default::default() }).unwrap();
    let mut it = loader.epoch(0);
    let mut keys: Vec<String> = it.by_ref().flat_map(|b| b.keys).collect();
    keys.sort();
    (keys, it.summary().unwrap().skips.clone())
}

fn loose_conf() -> DatasetConf {
    let mut c = DatasetConf::default().for_cv();
    c.filter_conf =
        FilterConf { max_length: 1e9, min_length: 0.0, token_max_length: 1000, token_min_length: 0, min_output_input_ratio: 0.0, max_output_input_ratio: 1e9 };
    c.fbank_conf.num_mel_bins = 20;
    c.batch_conf = BatchConf { batch_type: "static".into(), batch_size: 4, ..Default::default() };
    c
}

#[test]
fn utterances_past_the_positional_table_are_skipped_with_their_own_reason() {
    let dir = data_common::tmpdir("skips-beyond");
    // conv2d subsampling (k3 s2, k3 s2) and a table of 10 rows: at most 10·2+2 = 22 → 22·2+2 = 46 feature frames.
    let limits = asrforge::data::ModelLimits { subsampling: vec![(3, 2), (3, 2)], max_encoder_frames: Some(10), ctc: false };
    assert_eq!(limits.max_feature_frames(), Some(46));
    assert_eq!((limits.encoder_frames(46), limits.encoder_frames(47)), (10, 11));
    // 25 ms windows every 10 ms at 16 kHz: n frames need 400 + 160·(n − 1) samples.
    let wav = |name: &str, frames: usize| {
        let p = dir.join(format!("{name}.wav"));
        write_wav(&p, &sine(300.0, 16000, (400 + 160 * (frames - 1)) as f64 / 16000.0, 0.3), 16000, 16);
        p
    };
    let lines = vec![json("fits", &wav("fits", 46), "AB"), json("long", &wav("long", 47), "AB"), json("short", &wav("short", 20), "AB")];
    let (keys, skips) = epoch_with_limits(lines, &dir, loose_conf(), limits);
    assert_eq!(keys, ["fits", "short"]);
    assert_eq!(skips.count(R::BeyondModel), 1, "{}", skips.summary());
    assert_eq!(skips.total(), 1);
    let s = &skips.first()[0];
    assert_eq!(s.key, "long");
    assert!(s.detail.contains("at most 10 encoder frames") && s.detail.contains("found 11"), "{}", s.detail);
}

#[test]
fn ctc_targets_longer_than_the_subsampled_input_are_skipped_before_batching() {
    let dir = data_common::tmpdir("skips-ctc");
    let limits = asrforge::data::ModelLimits { subsampling: vec![(3, 2), (3, 2)], max_encoder_frames: None, ctc: true };
    // 19 feature frames → (19−3)/2+1 = 9 → (9−3)/2+1 = 4 encoder frames.
    assert_eq!(limits.encoder_frames(19), 4);
    let p = dir.join("u.wav");
    write_wav(&p, &sine(300.0, 16000, (400 + 160 * 18) as f64 / 16000.0, 0.3), 16000, 16);
    // "ABCD" needs 4 frames: fits. "ABCDE" needs 5; "AABB" needs 4 + 2 blanks = 6: both infeasible,
    // though 5 and 4 tokens over 19 feature frames pass any tokens-per-feature-frame ratio up to 0.27.
    let lines = vec![json("fits", &p, "ABCD"), json("five", &p, "ABCDE"), json("repeats", &p, "AABB")];
    let (keys, skips) = epoch_with_limits(lines, &dir, loose_conf(), limits);
    assert_eq!(keys, ["fits"]);
    assert_eq!(skips.count(R::CtcInfeasible), 2, "{}", skips.summary());
    let details: Vec<String> = skips.first().iter().map(|s| format!("{}: {}", s.key, s.detail)).collect();
    assert!(details.iter().any(|d| d.starts_with("repeats") && d.contains("at least 6 encoder frames")), "{details:?}");
}

#[test]
fn non_finite_audio_is_skipped_as_non_finite_features() {
    let dir = data_common::tmpdir("skips-nan");
    let mut bad = sine(300.0, 16000, 0.5, 0.3);
    bad[1000] = f32::NAN;
    let mut huge = sine(300.0, 16000, 0.5, 0.3);
    huge[2000] = 1e30;
    let (pn, ph, pg) = (dir.join("nan.wav"), dir.join("huge.wav"), dir.join("good.wav"));
    write_wav(&pn, &bad, 16000, 0);
    write_wav(&ph, &huge, 16000, 0);
    write_wav(&pg, &sine(300.0, 16000, 0.5, 0.3), 16000, 0);
    let lines = vec![json("nan", &pn, "AB"), json("huge", &ph, "AB"), json("good", &pg, "AB")];
    let limits = asrforge::data::ModelLimits { subsampling: vec![], max_encoder_frames: None, ctc: false };
    let (keys, skips) = epoch_with_limits(lines, &dir, loose_conf(), limits);
    // A NaN sample is read as 0 (audio.rs); a 1e30 sample overflows the f32 power spectrum to +inf.
    assert_eq!(keys, ["good", "nan"]);
    assert_eq!(skips.count(R::NonFiniteFeatures), 1, "{}", skips.summary());
    assert_eq!(skips.first()[0].key, "huge");
}
