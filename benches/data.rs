//! Utterances per second through decode → fbank → spec_aug → batch (with
//! dither, speed perturbation and sorting, as in training), on 1 and 2
//! worker threads. The corpus is 64 generated 16 kHz WAVs of 1-3 s.

use std::path::PathBuf;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

use asrforge::data::config::{BatchConf, DatasetConf};
use asrforge::data::list::{DataList, ListFormat};
use asrforge::data::loader::{DataLoader, LoaderConf};
use asrforge::data::process::Processor;
use asrforge::data::tokenizer::{SymbolTable, TokenizeMode, Tokenizer};

const N: usize = 64;

fn corpus() -> (PathBuf, Vec<String>) {
    let dir = std::env::temp_dir().join(format!("asrforge-bench-data-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench dir");
    let spec = hound::WavSpec { channels: 1, sample_rate: 16000, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let mut lines = Vec::new();
    let mut s = 1u64;
    for i in 0..N {
        let path = dir.join(format!("b{i}.wav"));
        let mut w = hound::WavWriter::create(&path, spec).expect("wav");
        let n = 16000 + (i % 9) * 4000;
        for k in 0..n {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let noise = ((s >> 40) as f64 / (1u64 << 24) as f64 - 0.5) * 2000.0;
            let tone = 8000.0 * (2.0 * std::f64::consts::PI * (200.0 + i as f64 * 10.0) * k as f64 / 16000.0).sin();
            w.write_sample((tone + noise) as i16).expect("sample");
        }
        w.finalize().expect("finalize");
        lines.push(format!(r#"{{"key": "b{i}", "wav": "{}", "txt": "ABC DE"}}"#, path.display()));
    }
    (dir, lines)
}

fn bench(c: &mut Criterion) {
    let (dir, lines) = corpus();
    let table = SymbolTable::parse("<blank> 0\n<unk> 1\n\u{2581} 2\nA 3\nB 4\nC 5\nD 6\nE 7\n<sos/eos> 8\n", "units").expect("units");
    let tok = Arc::new(Tokenizer::new(table, TokenizeMode::Char, vec![]));
    let mut conf = DatasetConf::default();
    conf.fbank_conf.num_mel_bins = 80;
    conf.fbank_conf.dither = 0.1;
    conf.speed_perturb = true;
    conf.spec_aug = true;
    conf.shuffle_conf.shuffle_size = 32;
    conf.sort_conf.sort_size = 16;
    conf.batch_conf = BatchConf { batch_type: "static".into(), batch_size: 8, ..Default::default() };
    let mut group = c.benchmark_group("data_pipeline");
    group.throughput(Throughput::Elements(N as u64));
    group.sample_size(10);
    for workers in [1, 2] {
        let list = DataList::from_lines("bench", ListFormat::Raw, lines.clone());
        let proc = Processor::new(&conf, Some(tok.clone())).expect("processor");
        let lconf = LoaderConf { num_workers: workers, prefetch: 4, log: false, ..Default::default() };
        let loader = DataLoader::new(list, proc, lconf).expect("loader");
        group.bench_function(format!("utterances_{workers}_threads"), |b| {
            let mut epoch = 0;
            b.iter(|| {
                epoch += 1;
                let n: usize = loader.epoch(epoch).map(|b| b.len()).sum();
                assert_eq!(n, N);
            })
        });
    }
    group.finish();
    let _ = std::fs::remove_dir_all(dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
