//! Learning-rate schedules, stepped once per optimizer step.
//!
//! WarmupLR (WeNet; the Noam schedule with the peak at `base_lr`), with
//! n = steps taken + 1:  lr = base·w^0.5·min(n^−0.5, n·w^−1.5)  (w > 0),
//! lr = base·n^−0.5 (w = 0); never below `min_lr` once warmup is over.
//!
//! NoamHoldAnnealing (SqueezeFormer, Kim et al. 2022, as WeNet takes it from
//! NeMo), with s = steps taken: linear warmup base·(s+1)/(w+1) while s ≤ w;
//! the peak `base` held while s < h (h = warmup + hold steps); then
//! base·max(1, w^d)/max(1, (s−h)^d), never below `min_lr`; `min_lr` after `max_steps`.

/// A schedule: the learning rate for the current step.
pub trait Scheduler {
    /// The learning rate to use for the next optimizer step.
    fn lr(&self) -> f64;
    /// Advances by one optimizer step.
    fn step(&mut self);
    /// Steps taken (saved in checkpoints and restored on resume).
    fn steps(&self) -> u64;
    /// Restores the step count.
    fn set_steps(&mut self, s: u64);
}

/// WeNet's WarmupLR.
#[derive(Clone, Debug)]
pub struct WarmupLR {
    pub base_lr: f64,
    pub warmup_steps: f64,
    pub min_lr: f64,
    pub steps: u64,
}

impl Scheduler for WarmupLR {
    fn lr(&self) -> f64 {
        let n = (self.steps + 1) as f64;
        let w = self.warmup_steps;
        if w == 0.0 {
            return (self.base_lr * n.powf(-0.5)).max(self.min_lr);
        }
        let lr = self.base_lr * w.sqrt() * n.powf(-0.5).min(n * w.powf(-1.5));
        if n < w {
            lr
        } else {
            lr.max(self.min_lr)
        }
    }
    fn step(&mut self) {
        self.steps += 1;
    }
    fn steps(&self) -> u64 {
        self.steps
    }
    fn set_steps(&mut self, s: u64) {
        self.steps = s;
    }
}

/// NoamHoldAnnealing.
#[derive(Clone, Debug)]
pub struct NoamHoldAnnealing {
    pub base_lr: f64,
    pub max_steps: u64,
    pub warmup_steps: u64,
    /// Warmup plus hold steps.
    pub hold_until: u64,
    pub decay_rate: f64,
    pub min_lr: f64,
    pub steps: u64,
}

impl NoamHoldAnnealing {
    /// From WeNet's scheduler_conf: warmup and hold given as steps or as ratios of `max_steps`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        base_lr: f64,
        max_steps: u64,
        warmup_steps: Option<u64>,
        warmup_ratio: f64,
        hold_steps: Option<u64>,
        hold_ratio: f64,
        decay_rate: f64,
        min_lr: f64,
    ) -> Self {
        let warmup = warmup_steps.unwrap_or((warmup_ratio * max_steps as f64) as u64);
        let hold = hold_steps.unwrap_or((hold_ratio * max_steps as f64) as u64);
        NoamHoldAnnealing { base_lr, max_steps, warmup_steps: warmup, hold_until: warmup + hold, decay_rate, min_lr, steps: 0 }
    }
}

impl Scheduler for NoamHoldAnnealing {
    fn lr(&self) -> f64 {
        let (s, w, h) = (self.steps, self.warmup_steps, self.hold_until);
        if w > 0 && s <= w {
            return self.base_lr * (s + 1) as f64 / (w + 1) as f64;
        }
        if s < h {
            return self.base_lr;
        }
        if s > self.max_steps {
            return self.min_lr;
        }
        let up = (w as f64).powf(self.decay_rate).max(1.0);
        let down = ((s - h) as f64).powf(self.decay_rate).max(1.0);
        (self.base_lr * up / down).max(self.min_lr)
    }
    fn step(&mut self) {
        self.steps += 1;
    }
    fn steps(&self) -> u64 {
        self.steps
    }
    fn set_steps(&mut self, s: u64) {
        self.steps = s;
    }
}
