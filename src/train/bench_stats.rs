//! Step-time statistics of `bench-train`: the median, min and max of the
//! steady-state steps (the warm-up steps excluded), and the rate of valid
//! (unpadded) feature frames at the median step time.

use std::time::Duration;

/// Median, min and max of a bench's timed steps.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepStats {
    /// Steps timed.
    pub steps: usize,
    /// Median step time, ms (the mean of the two middle ones for an even count).
    pub median_ms: f64,
    /// Fastest step, ms.
    pub min_ms: f64,
    /// Slowest step, ms.
    pub max_ms: f64,
}

impl StepStats {
    /// The statistics of `times` (all zero when empty).
    pub fn of(times: &[Duration]) -> StepStats {
        if times.is_empty() {
            return StepStats::default();
        }
        let mut ms: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let n = ms.len();
        let median_ms = if n % 2 == 1 { ms[n / 2] } else { 0.5 * (ms[n / 2 - 1] + ms[n / 2]) };
        StepStats { steps: n, median_ms, min_ms: ms[0], max_ms: ms[n - 1] }
    }

    /// Valid frames per second at the median step time (0 when nothing was timed).
    pub fn frames_per_s(&self, valid_frames: usize) -> f64 {
        if self.median_ms > 0.0 {
            valid_frames as f64 / (self.median_ms / 1e3)
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_min_max_of_odd_and_even_counts() {
        let d = |v: &[u64]| v.iter().map(|&x| Duration::from_millis(x)).collect::<Vec<_>>();
        let s = StepStats::of(&d(&[30, 10, 20]));
        assert_eq!((s.steps, s.median_ms, s.min_ms, s.max_ms), (3, 20.0, 10.0, 30.0));
        let s = StepStats::of(&d(&[40, 10, 20, 30]));
        assert_eq!((s.median_ms, s.min_ms, s.max_ms), (25.0, 10.0, 40.0));
        // 1000 valid frames in a 25 ms median step: 40000 frames/s.
        assert!((s.frames_per_s(1000) - 40000.0).abs() < 1e-9);
        assert_eq!(StepStats::of(&[]).frames_per_s(1000), 0.0);
    }
}
