//! The compute-cmvn and compute-feats subcommands, end to end.

mod data_common;

use std::process::Command;

use asrforge::data::audio::decode_wav;
use asrforge::data::config::FbankConf;
use asrforge::data::fbank::Fbank;
use asrforge::data::feats_dump::read_feats;
use asrforge::tensor::rng::Rng;

const YAML: &str = "dataset_conf:\n  fbank_conf:\n    num_mel_bins: 20\n    frame_shift: 10\n    frame_length: 25\n    dither: 0.0\n  resample_conf:\n    resample_rate: 16000\n  batch_conf:\n    batch_type: static\n    batch_size: 4\n";

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_asrforge"))
}

fn features(wav: &str) -> (usize, Vec<f32>) {
    let w = decode_wav(std::io::BufReader::new(std::fs::File::open(wav).unwrap()), None, None).unwrap();
    let fb = Fbank::new(&FbankConf { num_mel_bins: 20, ..Default::default() }, 16000).unwrap();
    let f = fb.compute(&w.samples, &mut Rng::new(0));
    (f.len() / 20, f)
}

fn setup(name: &str) -> (data_common::TempDir, Vec<String>) {
    let dir = data_common::tmpdir(name);
    let mut lines = data_common::make_corpus(&dir, 6, 16000);
    // One 8 kHz file: resampled to 16 kHz before fbank.
    let low = dir.join("low.wav");
    data_common::write_wav(&low, &data_common::sine(300.0, 8000, 0.5, 0.3), 8000, 16);
    lines.push(format!(r#"{{"key": "low", "wav": "{}", "txt": "A"}}"#, low.display()));
    lines.push(r#"{"key": "gone", "wav": "/no/such.wav", "txt": "A"}"#.into());
    std::fs::write(dir.join("data.list"), lines.join("\n")).unwrap();
    std::fs::write(dir.join("train.yaml"), YAML).unwrap();
    (dir, lines)
}

fn wav_of(line: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    v["wav"].as_str().unwrap().to_string()
}

#[test]
fn compute_cmvn_writes_wenet_json() {
    let (dir, lines) = setup("cli-cmvn");
    let mut outs = Vec::new();
    for workers in ["1", "2"] {
        let out = dir.join(format!("cmvn{workers}.json"));
        let r = bin()
            .args(["compute-cmvn", "--num_workers", workers, "--train_config"])
            .arg(dir.join("train.yaml"))
            .arg("--data_list")
            .arg(dir.join("data.list"))
            .arg("--out_cmvn")
            .arg(&out)
            .output()
            .unwrap();
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        assert!(String::from_utf8_lossy(&r.stderr).contains("missing_file 1"));
        outs.push(std::fs::read_to_string(&out).unwrap());
    }
    assert_eq!(outs[0], outs[1], "same statistics for 1 and 2 workers");
    let v: serde_json::Value = serde_json::from_str(&outs[0]).unwrap();
    let (mut frames, mut sum0, mut sq0) = (0u64, 0.0f64, 0.0f64);
    for line in &lines[..6] {
        let (t, f) = features(&wav_of(line));
        frames += t as u64;
        for r in 0..t {
            sum0 += f[r * 20] as f64;
            sq0 += (f[r * 20] as f64).powi(2);
        }
    }
    // The 8 kHz file adds 0.5 s = 48 frames at 16 kHz.
    assert_eq!(v["frame_num"].as_u64().unwrap(), frames + 48);
    assert_eq!(v["mean_stat"].as_array().unwrap().len(), 20);
    assert_eq!(v["var_stat"].as_array().unwrap().len(), 20);
    // Bin 0 of the 16 kHz files plus whatever the resampled file adds: check the 16 kHz part bounds it.
    let m0 = v["mean_stat"][0].as_f64().unwrap();
    let v0 = v["var_stat"][0].as_f64().unwrap();
    assert!(m0 > sum0 && v0 > sq0, "{m0} vs {sum0}, {v0} vs {sq0}");
}

#[test]
fn compute_cmvn_without_the_bad_and_low_rate_lines_is_exact() {
    let (dir, lines) = setup("cli-cmvn-exact");
    std::fs::write(dir.join("good.list"), lines[..6].join("\n")).unwrap();
    let out = dir.join("cmvn.json");
    let r = bin()
        .args(["compute-cmvn", "--train_config"])
        .arg(dir.join("train.yaml"))
        .arg("--data_list")
        .arg(dir.join("good.list"))
        .arg("--out_cmvn")
        .arg(&out)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let mut mean = [0.0f64; 20];
    let mut var = [0.0f64; 20];
    let mut frames = 0;
    for line in &lines[..6] {
        let (t, f) = features(&wav_of(line));
        frames += t;
        for r in 0..t {
            for d in 0..20 {
                mean[d] += f[r * 20 + d] as f64;
                var[d] += (f[r * 20 + d] as f64).powi(2);
            }
        }
    }
    assert_eq!(v["frame_num"].as_u64().unwrap() as usize, frames);
    for d in 0..20 {
        let (m, s) = (v["mean_stat"][d].as_f64().unwrap(), v["var_stat"][d].as_f64().unwrap());
        assert!((m - mean[d]).abs() <= 1e-9 * mean[d].abs().max(1.0), "mean {d}: {m} vs {}", mean[d]);
        assert!((s - var[d]).abs() <= 1e-9 * var[d].abs().max(1.0), "var {d}: {s} vs {}", var[d]);
    }
}

#[test]
fn compute_feats_dumps_every_utterance() {
    let (dir, lines) = setup("cli-feats");
    let out = dir.join("feats.safetensors");
    let r = bin()
        .args(["compute-feats", "--config"])
        .arg(dir.join("train.yaml"))
        .arg("--data_list")
        .arg(dir.join("data.list"))
        .arg("--out")
        .arg(&out)
        .args(["--num_workers", "2"])
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let feats = read_feats(&out).unwrap();
    assert_eq!(feats.len(), 7, "six 16 kHz files and the resampled one; the missing one skipped");
    for (i, line) in lines[..6].iter().enumerate() {
        let (t, f) = features(&wav_of(line));
        let (frames, dim, got) = &feats[&format!("utt{i:03}")];
        assert_eq!((*frames, *dim), (t, 20));
        assert_eq!(got, &f);
    }
    assert_eq!(feats["low"].0, 48);
}

#[test]
fn errors_are_one_line_and_exit_1() {
    let r = bin().args(["compute-cmvn", "--train_config", "/no/such.yaml", "--in_scp", "/no/scp"]).output().unwrap();
    assert_eq!(r.status.code(), Some(1));
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: /no/such.yaml:"), "{err}");
    let r = bin().args(["compute-feats", "--bogus"]).output().unwrap();
    assert_eq!(r.status.code(), Some(1));
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: ") && err.contains("--bogus"), "{err}");
    // A config that is not what it should be says where and what.
    let dir = data_common::tmpdir("cli-badconf");
    let yaml = dir.join("t.yaml");
    std::fs::write(&yaml, "dataset_conf:\n  batch_conf:\n    batch_type: elastic\n").unwrap();
    let r = bin().args(["compute-feats", "--config"]).arg(&yaml).args(["--data_list", "/x", "--out", "/y"]).output().unwrap();
    assert_eq!(r.status.code(), Some(1));
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("batch_type") && err.contains("elastic"), "{err}");
}
