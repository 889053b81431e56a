//! fbank against torchaudio.compliance.kaldi.fbank reference values
//! (tests/fixtures/fbank_reference.json, made by scripts/make_fbank_reference.py).

mod data_common;

use std::path::Path;

use asrforge::data::audio::decode_wav;
use asrforge::data::config::FbankConf;
use asrforge::data::fbank::Fbank;
use asrforge::tensor::rng::Rng;

fn fixtures() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures"))
}

#[test]
fn fbank_matches_torchaudio_reference() {
    let text = std::fs::read_to_string(fixtures().join("fbank_reference.json")).unwrap();
    let refs: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = refs["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 2);
    for case in cases {
        let wav = case["wav"].as_str().unwrap();
        let file = std::fs::File::open(fixtures().join(wav)).unwrap();
        let w = decode_wav(std::io::BufReader::new(file), None, None).unwrap();
        let sr = case["sample_rate"].as_u64().unwrap() as u32;
        assert_eq!(w.sample_rate, sr);
        let conf = FbankConf {
            num_mel_bins: case["num_mel_bins"].as_u64().unwrap() as usize,
            frame_length: case["frame_length"].as_f64().unwrap(),
            frame_shift: case["frame_shift"].as_f64().unwrap(),
            dither: 0.0,
            energy_floor: case["energy_floor"].as_f64().unwrap(),
            use_energy: case.get("use_energy").and_then(|v| v.as_bool()).unwrap_or(false),
        };
        let fb = Fbank::new(&conf, sr).unwrap();
        let frames = case["frames"].as_u64().unwrap() as usize;
        let dim = case["dim"].as_u64().unwrap() as usize;
        assert_eq!(fb.num_frames(w.samples.len()), frames, "{wav}: frame count");
        assert_eq!(fb.dim(), dim, "{wav}: dim");
        let got = fb.compute(&w.samples, &mut Rng::new(0));
        assert_eq!(got.len(), frames * dim);
        let mut worst = 0.0f64;
        for (t, row) in case["feats"].as_array().unwrap().iter().enumerate() {
            for (d, v) in row.as_array().unwrap().iter().enumerate() {
                let want = v.as_f64().unwrap();
                let rel = (got[t * dim + d] as f64 - want).abs() / want.abs().max(1.0);
                worst = worst.max(rel);
                assert!(rel <= 1e-4, "{wav} frame {t} bin {d}: got {} want {want} (rel {rel:e})", got[t * dim + d]);
            }
        }
        eprintln!("{wav}: worst relative error {worst:e}");
    }
}

#[test]
fn frame_count_follows_snip_edges() {
    let fb = Fbank::new(&FbankConf { num_mel_bins: 80, ..Default::default() }, 16000).unwrap();
    // 25 ms window = 400 samples, 10 ms hop = 160.
    assert_eq!(fb.num_frames(399), 0);
    assert_eq!(fb.num_frames(400), 1);
    assert_eq!(fb.num_frames(559), 1);
    assert_eq!(fb.num_frames(560), 2);
    assert_eq!(fb.num_frames(16000), 98);
}

#[test]
fn dither_is_seeded_and_small() {
    let x = data_common::sine(440.0, 16000, 0.5, 0.3);
    let plain = Fbank::new(&FbankConf { num_mel_bins: 40, ..Default::default() }, 16000).unwrap();
    let dithered = Fbank::new(&FbankConf { num_mel_bins: 40, dither: 1.0, ..Default::default() }, 16000).unwrap();
    let a = dithered.compute(&x, &mut Rng::new(5));
    let b = dithered.compute(&x, &mut Rng::new(5));
    let c = dithered.compute(&x, &mut Rng::new(6));
    let p = plain.compute(&x, &mut Rng::new(5));
    assert_eq!(a, b, "same seed, same features");
    assert_ne!(a, c, "another seed, other noise");
    // Dither of 1 (int16 units) on a 0.3-amplitude tone barely moves the loud bins.
    let max_loud_diff = a.iter().zip(&p).filter(|(_, q)| **q > 10.0).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
    assert!(max_loud_diff < 0.05, "dither moved a loud bin by {max_loud_diff}");
}
