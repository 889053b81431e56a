//! Dynamic loss scaling for fp16, with `torch.cuda.amp.GradScaler`'s
//! semantics: the loss is multiplied by `scale` before backward; before the
//! step the gradients are unscaled and checked; a step with an inf or NaN
//! gradient is skipped and the scale backs off; after `growth_interval`
//! clean steps in a row the scale grows.

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
}

impl Default for ScalerConfig {
    fn default() -> Self {
        ScalerConfig { init_scale: 65536.0, growth_factor: 2.0, backoff_factor: 0.5, growth_interval: 2000 }
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
    found_inf: bool,
}

impl GradScaler {
    /// A scaler at its initial scale.
    pub fn new(config: ScalerConfig) -> Self {
        GradScaler { scale: config.init_scale, config, growth_tracker: 0, skipped: 0, found_inf: false }
    }

    /// `loss · scale`, to back-propagate.
    pub fn scale_loss(&self, loss: &Tensor) -> Result<Tensor> {
        crate::ops::mul_scalar(loss, self.scale)
    }

    /// Divides every gradient by the scale and records whether any is inf/NaN.
    pub fn unscale(&mut self, params: &[(String, Tensor)]) -> Result<bool> {
        let inv = 1.0 / self.scale;
        let mut bad = false;
        for (_, p) in params {
            let Some(g) = p.grad() else { continue };
            let (u, b) = match &*g.storage() {
                Storage::Cpu(s) => unscale_and_check(s, inv)?,
                Storage::Cuda(_) => return Err(crate::error::Error::Msg(format!("unscale: gradient on {:?}: the unscale kernel has no CUDA implementation yet", g.device()))),
            };
            bad |= b;
            p.set_grad(Some(Tensor::from_cpu(u, g.shape().clone())?))?;
        }
        self.found_inf = bad;
        Ok(bad)
    }

    /// Whether the step must be skipped (an inf/NaN was found by `unscale`).
    pub fn should_skip(&self) -> bool {
        self.found_inf
    }

    /// Updates the scale after a step (taken or skipped).
    pub fn update(&mut self) {
        if self.found_inf {
            self.scale *= self.config.backoff_factor;
            self.growth_tracker = 0;
            self.skipped += 1;
        } else {
            self.growth_tracker += 1;
            if self.growth_tracker == self.config.growth_interval {
                self.scale *= self.config.growth_factor;
                self.growth_tracker = 0;
            }
        }
        self.found_inf = false;
    }
}
