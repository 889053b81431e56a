//! Kaldi-compatible log mel filterbank, as `torchaudio.compliance.kaldi.fbank`
//! computes it with WeNet's arguments.
//!
//! Per frame (snip_edges: frames fully inside the signal, hop `frame_shift`):
//! scale by 32768 (WeNet scales the [-1,1] waveform to int16 range) → add
//! `dither * N(0,1)` → subtract the frame mean → (log energy, if used) →
//! pre-emphasis `x[i] -= 0.97 x[i-1]` (`x[0] -= 0.97 x[0]`) → povey window
//! `(0.5 - 0.5 cos(2πn/(N-1)))^0.85` → zero-pad to a power of two → |rfft|² →
//! triangular mel filters (mel = 1127 ln(1 + f/700), 20 Hz to Nyquist) →
//! `ln(max(x, f32::EPSILON))`. Formulas from the torchaudio documentation of
//! `compliance.kaldi` and Kaldi's feature-fbank / feature-window docs.
//!
//! Output layout: `(T, F)` row-major, F = num_mel_bins (+1 with energy first).

use std::sync::Arc;

use realfft::num_complex::Complex;
use realfft::{RealFftPlanner, RealToComplex};

use crate::data::config::FbankConf;
use crate::error::{Error, Result};
use crate::tensor::rng::Rng;

const PREEMPH: f32 = 0.97;
const LOW_FREQ: f64 = 20.0;
/// torchaudio floors with `torch.finfo(torch.float).eps` whatever the dtype.
const EPS: f32 = f32::EPSILON;

/// One triangular mel filter: its first FFT bin and its nonzero weights.
#[derive(Clone, Debug)]
struct MelFilter {
    start: usize,
    weights: Vec<f32>,
}

/// A filterbank computer for one sample rate and configuration; cheap to share across threads.
#[derive(Clone)]
pub struct Fbank {
    conf: FbankConf,
    sample_rate: u32,
    win: usize,
    shift: usize,
    padded: usize,
    window: Vec<f32>,
    filters: Vec<MelFilter>,
    fft: Arc<dyn RealToComplex<f32>>,
}

impl std::fmt::Debug for Fbank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fbank({} Hz, win {}, shift {}, {} bins)", self.sample_rate, self.win, self.shift, self.filters.len())
    }
}

/// `n` standard normal numbers from a SplitMix64 stream (Marsaglia's polar
/// method in f32: no trigonometry, both outputs of each accepted pair used).
fn gaussian(seed: u64, n: usize) -> Vec<f32> {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    // Two 24-bit uniforms in [-1, 1) from one 64-bit draw.
    let scale = 1.0 / (1u32 << 23) as f32;
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        let z = next();
        let u = (z >> 40) as f32 * scale - 1.0;
        let v = ((z >> 16) & 0xFF_FFFF) as f32 * scale - 1.0;
        let s = u * u + v * v;
        if s >= 1.0 || s == 0.0 {
            continue;
        }
        let m = (-2.0 * s.ln() / s).sqrt();
        out.push(u * m);
        out.push(v * m);
    }
    out.truncate(n);
    out
}

fn mel(f: f64) -> f64 {
    1127.0 * (1.0 + f / 700.0).ln()
}

impl Fbank {
    /// Builds the window, the FFT plan and the mel filters.
    pub fn new(conf: &FbankConf, sample_rate: u32) -> Result<Fbank> {
        let sr = sample_rate as f64;
        let win = (sr * conf.frame_length * 0.001) as usize;
        let shift = (sr * conf.frame_shift * 0.001) as usize;
        if win < 2 || shift == 0 {
            return Err(Error::invalid(
                "fbank",
                format!(
                    "expected a window of >= 2 samples and a hop >= 1, found {win} and {shift} ({} ms / {} ms at {sample_rate} Hz)",
                    conf.frame_length, conf.frame_shift
                ),
            ));
        }
        let padded = win.next_power_of_two();
        let nyquist = 0.5 * sr;
        if conf.num_mel_bins == 0 || LOW_FREQ >= nyquist {
            return Err(Error::invalid(
                "fbank",
                format!("expected num_mel_bins > 0 and a Nyquist above {LOW_FREQ} Hz, found {} bins at {sample_rate} Hz", conf.num_mel_bins),
            ));
        }
        let window = (0..win)
            .map(|n| {
                let hann = 0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / (win - 1) as f64).cos();
                hann.powf(0.85) as f32
            })
            .collect();
        // Mel filters over the first padded/2 FFT bins; the Nyquist bin gets weight 0 (as torchaudio pads it).
        let (mel_low, mel_high) = (mel(LOW_FREQ), mel(nyquist));
        let delta = (mel_high - mel_low) / (conf.num_mel_bins + 1) as f64;
        let bin_width = sr / padded as f64;
        let filters = (0..conf.num_mel_bins)
            .map(|m| {
                let left = mel_low + m as f64 * delta;
                let center = left + delta;
                let right = center + delta;
                let w: Vec<f32> = (0..padded / 2)
                    .map(|k| {
                        let x = mel(bin_width * k as f64);
                        let up = (x - left) / (center - left);
                        let down = (right - x) / (right - center);
                        up.min(down).max(0.0) as f32
                    })
                    .collect();
                let start = w.iter().position(|&v| v > 0.0).unwrap_or(0);
                let end = w.iter().rposition(|&v| v > 0.0).map_or(start, |e| e + 1);
                MelFilter { start, weights: w[start..end].to_vec() }
            })
            .collect();
        let fft = RealFftPlanner::<f32>::new().plan_fft_forward(padded);
        Ok(Fbank { conf: conf.clone(), sample_rate, win, shift, padded, window, filters, fft })
    }

    /// The sample rate this filterbank was built for.
    pub fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    /// Feature dimension: mel bins, plus one when the energy is prepended.
    pub fn dim(&self) -> usize {
        self.filters.len() + usize::from(self.conf.use_energy)
    }

    /// Frames for `n` samples (Kaldi's snip_edges: only whole windows).
    pub fn num_frames(&self, n: usize) -> usize {
        if n < self.win {
            0
        } else {
            1 + (n - self.win) / self.shift
        }
    }

    /// Features `(T, dim)` row-major for `samples` in [-1, 1); `rng` drives the dither.
    pub fn compute(&self, samples: &[f32], rng: &mut Rng) -> Vec<f32> {
        let frames = self.num_frames(samples.len());
        let dim = self.dim();
        let mut out = vec![0.0f32; frames * dim];
        let dither = self.conf.dither as f32;
        // One seed per utterance keeps the noise a pure function of the rng
        // state; a SplitMix64 stream then makes it cheaply (Philox per sample
        // cost more than the whole filterbank).
        let noise = if dither != 0.0 {
            let seed = (rng.uniform(1)[0] * 18_446_744_073_709_551_616.0) as u64;
            gaussian(seed, frames * self.win)
        } else {
            Vec::new()
        };
        let mut buf = vec![0.0f32; self.padded];
        let mut spec = vec![Complex::new(0.0f32, 0.0); self.padded / 2 + 1];
        let mut scratch = self.fft.make_scratch_vec();
        let mut power = vec![0.0f32; self.padded / 2 + 1];
        let log_floor = if self.conf.energy_floor > 0.0 { Some((self.conf.energy_floor as f32).ln()) } else { None };
        for t in 0..frames {
            let frame = &samples[t * self.shift..t * self.shift + self.win];
            let x = &mut buf[..self.win];
            for (j, (d, &s)) in x.iter_mut().zip(frame).enumerate() {
                *d = s * 32768.0;
                if dither != 0.0 {
                    *d += dither * noise[t * self.win + j];
                }
            }
            let mean = x.iter().map(|&v| v as f64).sum::<f64>() / self.win as f64;
            x.iter_mut().for_each(|v| *v -= mean as f32);
            let row = &mut out[t * dim..(t + 1) * dim];
            if self.conf.use_energy {
                // raw_energy: measured before pre-emphasis and windowing, as Kaldi's default.
                let e = x.iter().map(|&v| v * v).sum::<f32>().max(EPS).ln();
                row[0] = log_floor.map_or(e, |f| e.max(f));
            }
            for j in (1..self.win).rev() {
                x[j] -= PREEMPH * x[j - 1];
            }
            x[0] -= PREEMPH * x[0];
            x.iter_mut().zip(&self.window).for_each(|(v, w)| *v *= w);
            buf[self.win..].iter_mut().for_each(|v| *v = 0.0);
            // Lengths always match the plan, so the FFT cannot fail; zeros would be returned if it did.
            if self.fft.process_with_scratch(&mut buf, &mut spec, &mut scratch).is_err() {
                continue;
            }
            power.iter_mut().zip(&spec).for_each(|(p, c)| *p = c.norm_sqr());
            let mels = &mut row[usize::from(self.conf.use_energy)..];
            for (m, f) in mels.iter_mut().zip(&self.filters) {
                let e: f32 = power[f.start..f.start + f.weights.len()].iter().zip(&f.weights).map(|(p, w)| p * w).sum();
                *m = e.max(EPS).ln();
            }
        }
        out
    }
}
