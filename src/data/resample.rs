//! Band-limited resampling (rubato's FFT resampler) and speed perturbation.
//!
//! Sample rates are integers, so every conversion is a rational ratio and the
//! synchronous FFT resampler applies: it low-pass filters properly (no
//! aliasing, unlike linear interpolation) and is several times faster than
//! the asynchronous sinc one. For ratios whose reduced input term is odd
//! (441:160 for 44.1 kHz → 16 kHz) its output lags by half an input sample
//! (≤ 45 µs), a constant shift that does not matter for features. Resamplers are cached per thread and per rate
//! pair because building one plans its FFTs.

use std::cell::RefCell;
use std::collections::HashMap;

use rubato::audioadapter_buffers::direct::InterleavedSlice;
use rubato::{Fft, FixedSync, Indexing, Resampler};

use crate::tensor::rng::Rng;

/// Input frames per FFT chunk: long enough for good filters, short enough for a small delay.
const CHUNK: usize = 1024;

thread_local! {
    static CACHE: RefCell<HashMap<(u32, u32), Fft<f32>>> = RefCell::new(HashMap::new());
}

/// Resamples `samples` from `from` Hz to `to` Hz; the output has `ceil(len * to / from)` samples.
pub fn resample(samples: &[f32], from: u32, to: u32) -> std::result::Result<Vec<f32>, String> {
    if from == to || samples.is_empty() {
        return Ok(samples.to_vec());
    }
    if from == 0 || to == 0 {
        return Err(format!("expected sample rates > 0, found {from} -> {to}"));
    }
    CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        let rs = match cache.entry((from, to)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let r = Fft::<f32>::new(from as usize, to as usize, CHUNK, 1, FixedSync::Input)
                    .map_err(|e| format!("cannot build a {from} -> {to} Hz resampler: {e}"))?;
                v.insert(r)
            }
        };
        rs.reset();
        let n = samples.len();
        let delay = rs.output_delay();
        let expected = (n as f64 * to as f64 / from as f64).ceil() as usize;
        // Room for the delay, the expected output and one chunk of overshoot.
        let cap = rs.process_all_needed_output_len(n);
        let mut out = vec![0.0f32; cap];
        let input = InterleavedSlice::new(samples, 1, n).map_err(|e| format!("resampler input: {e}"))?;
        let mut output = InterleavedSlice::new_mut(&mut out, 1, cap).map_err(|e| format!("resampler output: {e}"))?;
        // Our own loop rather than rubato's process_all_into_buffer: its delay
        // trimming (4.0) moves only `delay` frames, leaving stale samples when
        // the first chunks produce more than twice the delay. We trim at the end.
        let mut idx = Indexing { input_offset: 0, output_offset: 0, active_channels_mask: None, partial_len: None };
        let fail = |e: rubato::ResampleError| format!("resampling {from} -> {to} Hz failed: {e}");
        let mut left = n;
        while left > rs.input_frames_next() {
            let (nin, nout) = rs.process_into_buffer(&input, &mut output, Some(&idx)).map_err(fail)?;
            left -= nin;
            idx.input_offset += nin;
            idx.output_offset += nout;
        }
        if left > 0 {
            idx.partial_len = Some(left);
            let (_, nout) = rs.process_into_buffer(&input, &mut output, Some(&idx)).map_err(fail)?;
            idx.output_offset += nout;
        }
        // Flush the filter with silence until the delayed tail is out.
        idx.partial_len = Some(0);
        while idx.output_offset < delay + expected {
            let (_, nout) = rs.process_into_buffer(&input, &mut output, Some(&idx)).map_err(fail)?;
            if nout == 0 {
                return Err(format!("resampler {from} -> {to} Hz produced no output while flushing"));
            }
            idx.output_offset += nout;
        }
        out.truncate(delay + expected);
        out.drain(..delay);
        Ok(out)
    })
}

/// The speeds WeNet's speed_perturb picks from, uniformly.
pub const SPEEDS: [f64; 3] = [0.9, 1.0, 1.1];

/// Speed perturbation as sox's `speed s` + `rate sr` (what WeNet runs): the
/// signal is read as if recorded at `sr * s` and resampled back to `sr`, so it
/// plays `s` times faster, with pitch shifted, and has `len / s` samples.
/// Returns the chosen speed with the new samples.
pub fn speed_perturb(samples: &[f32], sample_rate: u32, rng: &mut Rng) -> std::result::Result<(f64, Vec<f32>), String> {
    let speed = SPEEDS[rng.below(SPEEDS.len())];
    if speed == 1.0 {
        return Ok((speed, samples.to_vec()));
    }
    let from = (sample_rate as f64 * speed).round() as u32;
    Ok((speed, resample(samples, from, sample_rate)?))
}
