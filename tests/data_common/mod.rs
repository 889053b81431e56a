//! Helpers shared by the data tests: WAV writing, test signals, tiny corpora.
#![allow(dead_code)]

use std::path::Path;

#[path = "../common/tempdir.rs"]
mod tempdir;
pub use tempdir::TempDir;

/// A fresh, empty directory under the system temp dir, unique to this test
/// and removed when the test passes.
pub fn tmpdir(name: &str) -> TempDir {
    TempDir::new(name)
}

/// Writes mono `samples` in [-1, 1) as `bits`-bit PCM (or 32-bit float when `bits == 0`).
pub fn write_wav(path: &Path, samples: &[f32], sr: u32, bits: u16) {
    write_wav_channels(path, samples, sr, bits, 1);
}

/// As `write_wav`, repeating each sample on `channels` channels, negated on the others.
pub fn write_wav_channels(path: &Path, samples: &[f32], sr: u32, bits: u16, channels: u16) {
    let float = bits == 0;
    let spec = hound::WavSpec {
        channels,
        sample_rate: sr,
        bits_per_sample: if float { 32 } else { bits },
        sample_format: if float { hound::SampleFormat::Float } else { hound::SampleFormat::Int },
    };
    let mut w = hound::WavWriter::create(path, spec).expect("create wav");
    let full = if float { 1.0 } else { (1u64 << (bits - 1)) as f64 };
    for &s in samples {
        for c in 0..channels {
            let v = if c == 0 { s } else { -s };
            if float {
                w.write_sample(v).expect("write");
            } else {
                let i = ((v as f64 * full).round()).clamp(-full, full - 1.0) as i32;
                w.write_sample(i).expect("write");
            }
        }
    }
    w.finalize().expect("finalize");
}

/// A sine of `freq` Hz, `secs` long, amplitude `amp`.
pub fn sine(freq: f64, sr: u32, secs: f64, amp: f64) -> Vec<f32> {
    let n = (secs * sr as f64).round() as usize;
    (0..n).map(|i| (amp * (2.0 * std::f64::consts::PI * freq * i as f64 / sr as f64).sin()) as f32).collect()
}

/// Deterministic uniform noise in [-amp, amp) from a 64-bit LCG.
pub fn noise(n: usize, amp: f32, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amp
        })
        .collect()
}

/// The units of the tiny corpora: blank, unk, the letters A-E, space, sos/eos.
pub const UNITS: &str = "<blank> 0\n<unk> 1\n\u{2581} 2\nA 3\nB 4\nC 5\nD 6\nE 7\n<sos/eos> 8\n";

/// Writes `n` utterances `utt000..` of varied length (0.2–1.4 s tone + noise at `sr`)
/// with transcripts of 1–5 letters; returns the data.list lines (JSON).
pub fn make_corpus(dir: &Path, n: usize, sr: u32) -> Vec<String> {
    let letters = ["A", "B", "C", "D", "E"];
    (0..n)
        .map(|i| {
            let secs = 0.2 + 0.1 * ((i * 7) % 13) as f64;
            let mut x = sine(200.0 + 50.0 * (i % 9) as f64, sr, secs, 0.3);
            let nz = noise(x.len(), 0.05, i as u64);
            for (v, e) in x.iter_mut().zip(nz) {
                *v += e;
            }
            let key = format!("utt{i:03}");
            let path = dir.join(format!("{key}.wav"));
            write_wav(&path, &x, sr, 16);
            let txt: Vec<&str> = (0..1 + i % 5).map(|k| letters[(i + k) % 5]).collect();
            format!(r#"{{"key": "{key}", "wav": "{}", "txt": "{}"}}"#, path.display(), txt.join(" "))
        })
        .collect()
}
