//! WAV formats, first-channel selection, segments, and data.list line formats.

mod data_common;

use std::path::PathBuf;

use asrforge::data::audio::{decode_wav, load_audio};
use asrforge::data::list::{parse_raw_line, AudioSource};
use asrforge::data::SkipReason;
use data_common::{sine, write_wav, write_wav_channels};

fn decode(path: &std::path::Path, start: Option<f64>, end: Option<f64>) -> asrforge::data::audio::Waveform {
    decode_wav(std::io::BufReader::new(std::fs::File::open(path).unwrap()), start, end).unwrap()
}

#[test]
fn every_pcm_width_and_float_decode_to_the_same_signal() {
    let dir = data_common::tmpdir("audio-formats");
    let x = sine(440.0, 16000, 0.2, 0.5);
    for (bits, tol) in [(8u16, 1.0 / 128.0), (16, 1.0 / 32768.0), (24, 1e-6), (32, 1e-6), (0, 1e-7)] {
        let p = dir.join(format!("b{bits}.wav"));
        write_wav(&p, &x, 16000, bits);
        let w = decode(&p, None, None);
        assert_eq!((w.sample_rate, w.samples.len()), (16000, x.len()), "{bits}-bit");
        let err = w.samples.iter().zip(&x).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(err <= tol as f32, "{bits}-bit: max error {err}");
    }
}

#[test]
fn stereo_keeps_the_first_channel() {
    let dir = data_common::tmpdir("audio-stereo");
    let x = sine(300.0, 8000, 0.1, 0.4);
    let p = dir.join("st.wav");
    write_wav_channels(&p, &x, 8000, 16, 2);
    let w = decode(&p, None, None);
    assert_eq!(w.samples.len(), x.len());
    // The second channel holds -x: keeping it would flip the sign.
    let err = w.samples.iter().zip(&x).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(err < 1e-4, "{err}");
}

#[test]
fn segments_cut_start_and_end_seconds() {
    let dir = data_common::tmpdir("audio-segment");
    let x: Vec<f32> = (0..16000).map(|i| i as f32 / 32768.0).collect();
    let p = dir.join("ramp.wav");
    write_wav(&p, &x, 16000, 16);
    let w = decode(&p, Some(0.25), Some(0.5));
    assert_eq!(w.samples.len(), 4000);
    assert!((w.samples[0] * 32768.0 - 4000.0).abs() < 0.5, "{}", w.samples[0] * 32768.0);
    // An end past the file is clipped; a start past it is an error.
    assert_eq!(decode(&p, Some(0.75), Some(9.0)).samples.len(), 4000);
    let e = decode_wav(std::io::BufReader::new(std::fs::File::open(&p).unwrap()), Some(2.0), None).unwrap_err();
    assert!(e.contains("empty"), "{e}");
    // Through a JSON line.
    let line = format!(r#"{{"key": "seg", "wav": "{}", "txt": "A B", "start": 0.5, "end": 0.75}}"#, p.display());
    let utt = parse_raw_line(&line, 1).unwrap();
    assert_eq!(load_audio(&utt.key, &utt.audio).unwrap().samples.len(), 4000);
}

#[test]
fn truncated_files_are_corrupt_not_short() {
    let dir = data_common::tmpdir("audio-trunc");
    let p = dir.join("t.wav");
    write_wav(&p, &sine(440.0, 16000, 0.5, 0.5), 16000, 16);
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 1001]).unwrap();
    let src = AudioSource::File { path: p.clone(), start: None, end: None };
    let skip = load_audio("t", &src).unwrap_err();
    assert_eq!(skip.reason, SkipReason::CorruptAudio);
    assert!(skip.detail.contains("t.wav"), "{}", skip.detail);
}

#[test]
fn plain_and_json_lines() {
    let u = parse_raw_line("utt1 /data/a.wav HELLO WORLD", 3).unwrap();
    assert_eq!(u.key, "utt1");
    assert_eq!(u.txt, "HELLO WORLD");
    assert_eq!(u.audio, AudioSource::File { path: PathBuf::from("/data/a.wav"), start: None, end: None });
    let u = parse_raw_line("utt2\t/b.wav", 1).unwrap();
    assert_eq!(u.txt, "", "wav.scp lines have no transcript");
    let u = parse_raw_line(r#"{"key": "k", "wav": "/c.wav", "txt": "X", "start": 1, "end": 2.5}"#, 1).unwrap();
    assert_eq!(u.audio, AudioSource::File { path: PathBuf::from("/c.wav"), start: Some(1.0), end: Some(2.5) });
    let s = parse_raw_line(r#"{"key": "k", "txt": "X"}"#, 7).unwrap_err();
    assert_eq!(s.reason, SkipReason::MalformedLine);
    assert_eq!(s.key, "line 7");
    assert!(s.detail.contains("`wav`"), "{}", s.detail);
    assert_eq!(parse_raw_line("lonely", 2).unwrap_err().reason, SkipReason::MalformedLine);
}
