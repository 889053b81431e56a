//! Optimizers, learning-rate schedulers, the fp16 loss scaler and gradient
//! clipping, with PyTorch's (and WeNet's) semantics.

mod adam;
mod clip;
mod scaler;
mod scheduler;

pub use crate::backend::cuda::optim::{FusedOptions, FusedOutcome};
pub use adam::{Adam, AdamConfig};
pub use clip::{clip_grad_norm, grad_norm};
pub use scaler::{GradScaler, ScalerConfig};
pub use scheduler::{NoamHoldAnnealing, Scheduler, WarmupLR};
