//! Dynamic loss scaling for fp16, with `torch.cuda.amp.GradScaler`'s
//! semantics: the loss is multiplied by `scale` before backward; before the
//! step the gradients are unscaled and checked; a step with an inf or NaN
//! gradient is skipped and the scale backs off; after `growth_interval`
//! clean steps in a row the scale grows.
//!
//! DeepSpeed's dynamic scaler (`fp16.loss_scale 0`) is the same machine with
//! three more settings: `hysteresis` overflows are absorbed before the scale
//! halves, `consecutive_hysteresis` restores that allowance after every
//! clean step (instead of only when the scale grows), and the scale never
//! falls below `min_scale`. PyTorch's behaviour is `hysteresis 1`, `min_scale 0`.

use crate::backend::cpu::optim::unscale_and_check;
use crate::backend::Storage;
use crate::error::Result;
use crate::tensor::Tensor;

/// GradScaler settings (PyTorch's defaults).
#[derive(Clone, Copy, Debug)]
pub struct ScalerConfig {
    pub init_scale: f64,
    pub growth_factor: f64,
    pub backoff_factor: f64,
    pub growth_interval: u64,
    /// Overflows taken before the scale backs off (1: every overflow backs off).
    pub hysteresis: u64,
    /// Whether a clean step restores the hysteresis allowance (else only a growth does).
    pub consecutive_hysteresis: bool,
    /// The floor of the scale.
    pub min_scale: f64,
}

impl Default for ScalerConfig {
    fn default() -> Self {
        ScalerConfig {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            hysteresis: 1,
            consecutive_hysteresis: false,
            min_scale: 0.0,
        }
    }
}

/// The scaler's state.
#[derive(Clone, Debug)]
pub struct GradScaler {
    pub config: ScalerConfig,
    pub scale: f64,
    /// Clean steps since the last growth or backoff.
    pub growth_tracker: u64,
    /// Steps skipped for inf/NaN gradients so far.
    pub skipped: u64,
    /// Overflows still absorbed before the next backoff (DeepSpeed's hysteresis).
    pub hysteresis_left: u64,
    found_inf: bool,
}

impl GradScaler {
    /// A scaler at its initial scale.
    pub fn new(config: ScalerConfig) -> Self {
        GradScaler { scale: config.init_scale, config, growth_tracker: 0, skipped: 0, hysteresis_left: config.hysteresis, found_inf: false }
    }

    /// `loss · scale`, to back-propagate.
    pub fn scale_loss(&self, loss: &Tensor) -> Result<Tensor> {
        crate::ops::mul_scalar(loss, self.scale)
    }

    /// Divides every gradient by the scale and records whether any is inf/NaN.
    pub fn unscale(&mut self, params: &[(String, Tensor)]) -> Result<bool> {
        let inv = 1.0 / self.scale;
        let mut bad = false;
        let mut on_gpu: Vec<(&Tensor, Tensor)> = Vec::new();
        for (_, p) in params {
            let Some(g) = p.grad() else { continue };
            if let Storage::Cpu(s) = &*g.storage() {
                let (u, b) = unscale_and_check(s, inv)?;
                bad |= b;
                p.set_grad(Some(Tensor::from_cpu(u, g.shape().clone())?))?;
                continue;
            }
            on_gpu.push((p, g));
        }
        // GPU gradients: one fused launch each into new buffers (a gradient
        // handle may be shared), one found-inf flag, one read-back.
        if !on_gpu.is_empty() {
            let guards: Vec<_> = on_gpu.iter().map(|(_, g)| g.storage()).collect();
            let st: Vec<&crate::backend::cuda::CudaStorage> = guards.iter().filter_map(|s| if let Storage::Cuda(c) = &**s { Some(c) } else { None }).collect();
            let (outs, b) = crate::backend::cuda::optim::unscale_many(&st, inv)?;
            drop(st);
            drop(guards);
            bad |= b;
            for ((p, g), o) in on_gpu.iter().zip(outs) {
                p.set_grad(Some(Tensor::from_storage(Storage::Cuda(o), g.shape().clone())))?;
            }
        }
        self.found_inf = bad;
        Ok(bad)
    }

    /// Whether the step must be skipped (an inf/NaN was found by `unscale`).
    pub fn should_skip(&self) -> bool {
        self.found_inf
    }

    /// Records whether the gradients held an inf/NaN, for an engine that
    /// unscales and checks them itself (the ZeRO engine checks its shard and
    /// agrees with every rank).
    pub fn set_found_inf(&mut self, found: bool) {
        self.found_inf = found;
    }

    /// Updates the scale after a step (taken or skipped).
    pub fn update(&mut self) {
        let c = self.config;
        if self.found_inf {
            if c.hysteresis <= 1 || self.hysteresis_left <= 1 {
                self.scale = (self.scale * c.backoff_factor).max(c.min_scale);
            } else {
                self.hysteresis_left -= 1;
            }
            self.growth_tracker = 0;
            self.skipped += 1;
        } else {
            if c.consecutive_hysteresis {
                self.hysteresis_left = c.hysteresis;
            }
            self.growth_tracker += 1;
            if self.growth_tracker == c.growth_interval {
                if !c.consecutive_hysteresis {
                    self.hysteresis_left = c.hysteresis;
                }
                self.scale *= c.growth_factor;
                self.growth_tracker = 0;
            }
        }
        self.found_inf = false;
    }
}
