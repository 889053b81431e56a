//! Global gradient-norm clipping (`torch.nn.utils.clip_grad_norm_`): the L2
//! norm over every gradient, accumulated in f64 in parameter order (the same
//! on every run); gradients scaled by max_norm/(norm + 1e-6) when above it.

use crate::backend::Storage;
use crate::error::Result;
use crate::tensor::{Device, Tensor};

/// The global L2 norm of the parameters' gradients (0 when none has one).
///
/// When every gradient is on a GPU the sum of squares runs there: per-block
/// f64 partials summed in a fixed order, so the norm is the same on every run.
pub fn grad_norm(params: &[(String, Tensor)]) -> Result<f64> {
    let grads: Vec<Tensor> = params.iter().filter_map(|(_, p)| p.grad()).collect();
    if !grads.is_empty() && grads.iter().all(|g| matches!(g.device(), Device::Cuda(_))) {
        let guards: Vec<_> = grads.iter().map(|g| g.storage()).collect();
        let st: Vec<&crate::backend::cuda::CudaStorage> = guards.iter().filter_map(|s| if let Storage::Cuda(c) = &**s { Some(c) } else { None }).collect();
        return Ok(crate::backend::cuda::optim::sum_squares(&st)?.sqrt());
    }
    let mut sq = 0.0f64;
    for (_, p) in params {
        if let Some(g) = p.grad() {
            sq += match &*g.storage() {
                Storage::Cpu(c) => crate::backend::cpu::reduce::sum_squares_f64(c),
                _ => g.to_f64_vec()?.iter().map(|x| x * x).sum::<f64>(),
            };
        }
    }
    Ok(sq.sqrt())
}

/// Clips the gradients to a global norm of `max_norm` and returns the norm
/// before clipping. A non-finite norm is returned unclipped: the caller skips the step.
pub fn clip_grad_norm(params: &[(String, Tensor)], max_norm: f64) -> Result<f64> {
    let norm = grad_norm(params)?;
    if norm.is_finite() && norm > max_norm {
        let c = max_norm / (norm + 1e-6);
        crate::autograd::no_grad(|| -> Result<()> {
            for (_, p) in params {
                if let Some(g) = p.grad() {
                    p.set_grad(Some(crate::ops::mul_scalar(&g, c)?))?;
                }
            }
            Ok(())
        })?;
    }
    Ok(norm)
}
