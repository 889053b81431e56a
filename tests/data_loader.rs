//! The threaded loader: determinism across thread counts, partitioning,
//! cycle, exact resume, shards.

mod data_common;

use std::collections::HashMap;

use asrforge::data::config::{BatchConf, DatasetConf, FilterConf};
use asrforge::data::list::{DataList, ListFormat};
use asrforge::data::loader::{DataLoader, LoaderConf};
use asrforge::data::process::Processor;
use asrforge::data::tokenizer::{SymbolTable, TokenizeMode, Tokenizer};
use asrforge::data::Batch;

fn conf() -> DatasetConf {
    let mut c = DatasetConf { filter_conf: FilterConf { min_length: 5.0, ..Default::default() }, ..Default::default() };
    c.fbank_conf.num_mel_bins = 20;
    c.fbank_conf.dither = 0.1;
    c.speed_perturb = true;
    c.spec_aug = true;
    c.spec_sub = true;
    c.spec_trim = true;
    c.shuffle_conf.shuffle_size = 7;
    c.sort_conf.sort_size = 5;
    c.batch_conf = BatchConf { batch_type: "static".into(), batch_size: 4, ..Default::default() };
    c
}

fn tokenizer() -> std::sync::Arc<Tokenizer> {
    std::sync::Arc::new(Tokenizer::new(SymbolTable::parse(data_common::UNITS, "units").unwrap(), TokenizeMode::Char, vec![]))
}

fn loader(lines: &[String], dconf: &DatasetConf, lconf: LoaderConf) -> DataLoader {
    let list = DataList::from_lines("test.list", ListFormat::Raw, lines.to_vec());
    DataLoader::new(list, Processor::new(dconf, Some(tokenizer())).unwrap(), LoaderConf { log: false, ..lconf }).unwrap()
}

fn fingerprint(b: &Batch) -> (Vec<String>, Vec<usize>, Vec<u32>, Vec<i64>) {
    let f = b.feats.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect();
    (b.keys.clone(), b.feats_lengths.clone(), f, b.target.to_vec::<i64>().unwrap())
}

#[test]
fn same_batches_for_any_thread_count() {
    let dir = data_common::tmpdir("loader-threads");
    let lines = data_common::make_corpus(&dir, 30, 16000);
    let runs: Vec<Vec<_>> = [1, 2, 3]
        .iter()
        .map(|&n| {
            let l = loader(&lines, &conf(), LoaderConf { num_workers: n, prefetch: 2, seed: 5, ..Default::default() });
            l.epoch(3).map(|b| fingerprint(&b)).collect()
        })
        .collect();
    assert_eq!(runs[0].len(), 8, "30 utterances in batches of 4");
    assert_eq!(runs[0], runs[1]);
    assert_eq!(runs[0], runs[2]);
    // Another epoch reshuffles.
    let l = loader(&lines, &conf(), LoaderConf { num_workers: 2, seed: 5, ..Default::default() });
    let other: Vec<_> = l.epoch(4).map(|b| fingerprint(&b)).collect();
    assert_ne!(runs[0], other);
}

#[test]
fn batches_are_sorted_and_summarised() {
    let dir = data_common::tmpdir("loader-summary");
    let lines = data_common::make_corpus(&dir, 13, 16000);
    let l = loader(&lines, &conf(), LoaderConf::default());
    let mut it = l.epoch(0);
    let mut n = 0;
    for b in it.by_ref() {
        assert!(b.feats_lengths.windows(2).all(|w| w[0] >= w[1]), "{:?}", b.feats_lengths);
        assert_eq!(b.feats.dims()[0], b.len());
        assert_eq!(b.feats.dims()[1], b.feats_lengths[0]);
        assert_eq!(b.feats.dims()[2], 20);
        n += b.len();
    }
    assert_eq!(n, 13);
    let s = it.summary().unwrap();
    assert_eq!((s.utterances, s.batches, s.skips.total()), (13, 4, 0));
    assert_eq!(it.position(), 4);
}

#[test]
fn partition_covers_every_utterance_once() {
    let dir = data_common::tmpdir("loader-partition");
    let lines = data_common::make_corpus(&dir, 25, 16000);
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut per_rank = Vec::new();
    for rank in 0..3 {
        let l = loader(&lines, &conf(), LoaderConf { rank, world_size: 3, num_workers: 2, ..Default::default() });
        let keys: Vec<String> = l.epoch(1).flat_map(|b| b.keys).collect();
        per_rank.push(keys.len());
        for k in keys {
            *seen.entry(k).or_default() += 1;
        }
    }
    assert_eq!(per_rank, vec![9, 8, 8]);
    assert_eq!(seen.len(), 25);
    assert!(seen.values().all(|&c| c == 1), "{seen:?}");
    // cv: not partitioned, every rank gets everything.
    let cv = conf().for_cv();
    for rank in 0..3 {
        let l = loader(&lines, &cv, LoaderConf { rank, world_size: 3, partition: false, ..Default::default() });
        assert_eq!(l.epoch(1).map(|b| b.len()).sum::<usize>(), 25);
    }
}

#[test]
fn cycle_repeats_the_list() {
    let dir = data_common::tmpdir("loader-cycle");
    let lines = data_common::make_corpus(&dir, 10, 16000);
    let mut c = conf();
    c.cycle = 3;
    let l = loader(&lines, &c, LoaderConf::default());
    let mut count: HashMap<String, usize> = HashMap::new();
    for b in l.epoch(0) {
        for k in b.keys {
            *count.entry(k).or_default() += 1;
        }
    }
    assert_eq!(count.len(), 10);
    assert!(count.values().all(|&c| c == 3), "{count:?}");
}

#[test]
fn resume_skips_exactly_the_yielded_batches() {
    let dir = data_common::tmpdir("loader-resume");
    let lines = data_common::make_corpus(&dir, 30, 16000);
    let l = loader(&lines, &conf(), LoaderConf { num_workers: 2, ..Default::default() });
    let full: Vec<_> = l.epoch(2).map(|b| fingerprint(&b)).collect();
    // Stop after 3 batches, as a crash would; the position says where to restart.
    let mut it = l.epoch(2);
    for _ in 0..3 {
        it.next().unwrap();
    }
    let pos = it.position();
    drop(it);
    assert_eq!(pos, 3);
    let resumed = l.resume(2, pos);
    assert_eq!(resumed.position(), 3);
    let rest: Vec<_> = resumed.map(|b| fingerprint(&b)).collect();
    assert_eq!(rest, full[3..].to_vec());
}

#[test]
fn shards_give_the_same_utterances_as_raw() {
    let dir = data_common::tmpdir("loader-shards");
    let lines = data_common::make_corpus(&dir, 12, 16000);
    let mut shard_lines = Vec::new();
    for (s, chunk) in lines.chunks(5).enumerate() {
        let path = dir.join(format!("shard{s}.tar"));
        let mut tar = tar::Builder::new(std::fs::File::create(&path).unwrap());
        for line in chunk {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let key = v["key"].as_str().unwrap();
            tar.append_path_with_name(v["wav"].as_str().unwrap(), format!("{key}.wav")).unwrap();
            let txt = v["txt"].as_str().unwrap().as_bytes();
            let mut h = tar::Header::new_gnu();
            h.set_size(txt.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            tar.append_data(&mut h, format!("{key}.txt"), txt).unwrap();
        }
        tar.finish().unwrap();
        shard_lines.push(path.display().to_string());
    }
    let mut c = conf().for_cv();
    c.sort = false;
    c.batch_conf.batch_size = 100;
    let raw = loader(&lines, &c, LoaderConf::default());
    let list = DataList::from_lines("shards.list", ListFormat::Shard, shard_lines);
    let sharded = DataLoader::new(list, Processor::new(&c, Some(tokenizer())).unwrap(), LoaderConf { log: false, ..Default::default() }).unwrap();
    let a: Vec<_> = raw.epoch(0).map(|b| fingerprint(&b)).collect();
    let b: Vec<_> = sharded.epoch(0).map(|b| fingerprint(&b)).collect();
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].0.len(), 12);
    // Same keys, frames and targets (cv has no dither, so features match too).
    assert_eq!(a, b);
}
