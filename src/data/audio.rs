//! WAV decoding to mono f32 in [-1, 1), with hound.
//!
//! PCM 8/16/24/32-bit and 32-bit float are accepted; of several channels the
//! first is kept (as WeNet keeps channel 0). A truncated file, a header that
//! lies about its size, or zero samples are errors: the caller skips the
//! utterance rather than training on a fragment.

use std::fs::File;
use std::io::{BufReader, Cursor, Read, Seek};

use crate::data::list::AudioSource;
use crate::data::skip::{Skip, SkipReason};

/// Mono samples in [-1, 1) and their sample rate.
#[derive(Clone, Debug, PartialEq)]
pub struct Waveform {
    /// Samples of the first channel, scaled to [-1, 1).
    pub samples: Vec<f32>,
    /// Samples per second.
    pub sample_rate: u32,
}

impl Waveform {
    /// Duration in seconds.
    pub fn seconds(&self) -> f64 {
        self.samples.len() as f64 / self.sample_rate as f64
    }
}

/// Decodes the audio of utterance `key` from a file (optionally a segment) or shard bytes.
pub fn load_audio(key: &str, source: &AudioSource) -> std::result::Result<Waveform, Skip> {
    match source {
        AudioSource::Bytes(bytes) => decode_wav(Cursor::new(bytes.as_slice()), None, None).map_err(|msg| Skip::new(SkipReason::CorruptAudio, key, msg)),
        AudioSource::File { path, start, end } => {
            let file = File::open(path).map_err(|e| {
                let reason = if e.kind() == std::io::ErrorKind::NotFound { SkipReason::MissingFile } else { SkipReason::UnreadableFile };
                Skip::new(reason, key, format!("{}: {e}", path.display()))
            })?;
            if file.metadata().map(|m| !m.is_file()).unwrap_or(true) {
                return Err(Skip::new(SkipReason::UnreadableFile, key, format!("{}: expected a regular file", path.display())));
            }
            decode_wav(BufReader::new(file), *start, *end).map_err(|msg| Skip::new(SkipReason::CorruptAudio, key, format!("{}: {msg}", path.display())))
        }
    }
}

/// Decodes WAV from `reader`, keeping `[start, end)` seconds when given.
pub fn decode_wav<R: Read + Seek>(reader: R, start: Option<f64>, end: Option<f64>) -> std::result::Result<Waveform, String> {
    let mut wav = hound::WavReader::new(reader).map_err(|e| format!("expected a WAV file: {e}"))?;
    let spec = wav.spec();
    if spec.channels == 0 || spec.sample_rate == 0 {
        return Err(format!("expected >= 1 channel and a sample rate > 0, found {} channels at {} Hz", spec.channels, spec.sample_rate));
    }
    let total = wav.duration() as usize;
    let sr = spec.sample_rate as f64;
    let first = start.map(|s| (s * sr) as usize).unwrap_or(0);
    let last = end.map(|e| ((e * sr) as usize).min(total)).unwrap_or(total);
    if first >= last {
        return Err(format!("segment [{:?}, {:?}) s is empty in a file of {total} samples at {} Hz", start, end, spec.sample_rate));
    }
    if first > 0 {
        wav.seek(first as u32).map_err(|e| format!("cannot seek to sample {first}: {e}"))?;
    }
    let channels = spec.channels as usize;
    let wanted = (last - first) * channels;
    let mut samples = Vec::with_capacity(last - first);
    match spec.sample_format {
        hound::SampleFormat::Float => {
            if spec.bits_per_sample != 32 {
                return Err(format!("expected 32-bit float samples, found {}-bit float", spec.bits_per_sample));
            }
            first_channel(wav.samples::<f32>(), wanted, channels, first, &mut samples, |s| if s.is_finite() { s } else { 0.0 })?;
        }
        hound::SampleFormat::Int => {
            let bits = spec.bits_per_sample;
            if !(bits == 8 || bits == 16 || bits == 24 || bits == 32) {
                return Err(format!("expected 8, 16, 24 or 32-bit PCM, found {bits}-bit"));
            }
            let scale = 1.0 / (1u64 << (bits - 1)) as f64;
            first_channel(wav.samples::<i32>(), wanted, channels, first, &mut samples, |s| (s as f64 * scale) as f32)?;
        }
    }
    // hound stops early, without an error, when the data chunk is shorter than its header says.
    if samples.len() != last - first {
        return Err(format!("truncated data: header promises {} samples, found {}", last - first, samples.len()));
    }
    Ok(Waveform { samples, sample_rate: spec.sample_rate })
}

/// Appends the first channel of `wanted` interleaved samples, converted by
/// `conv`; a read error names the frame (counted from `first`) it hit.
fn first_channel<S>(
    iter: impl Iterator<Item = hound::Result<S>>,
    wanted: usize,
    channels: usize,
    first: usize,
    samples: &mut Vec<f32>,
    conv: impl Fn(S) -> f32,
) -> std::result::Result<(), String> {
    for (i, s) in iter.take(wanted).enumerate() {
        let s = s.map_err(|e| format!("truncated or corrupt data at sample {}: {e}", first + i / channels))?;
        if i % channels == 0 {
            samples.push(conv(s));
        }
    }
    Ok(())
}
