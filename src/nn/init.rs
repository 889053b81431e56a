//! PyTorch's default initialisations, drawn from an explicit generator.

use crate::error::Result;
use crate::tensor::{DType, Device, Rng, Tensor};

/// The bound of `kaiming_uniform_(a=√5)` on a weight with `fan_in` inputs,
/// which is PyTorch's default for Linear and Conv weights: `1/√fan_in`.
pub fn kaiming_uniform_bound(fan_in: usize) -> f64 {
    // gain = √(2/(1+a²)) with a = √5, bound = gain·√(3/fan_in) = 1/√fan_in.
    1.0 / (fan_in.max(1) as f64).sqrt()
}

/// The bound of `xavier_uniform_` on a 2-D `[fan_out, fan_in]` tensor.
pub fn xavier_uniform_bound(fan_in: usize, fan_out: usize) -> f64 {
    (6.0 / (fan_in + fan_out).max(1) as f64).sqrt()
}

/// A trainable leaf with entries uniform in `(-bound, bound)`.
pub fn uniform_param(shape: &[usize], bound: f64, dtype: DType, rng: &mut Rng) -> Result<Tensor> {
    Ok(Tensor::rand(shape.to_vec(), -bound, bound, dtype, rng, &Device::Cpu)?.requires_grad_())
}

/// A trainable leaf filled with `v`.
pub fn full_param(shape: &[usize], v: f64, dtype: DType) -> Result<Tensor> {
    Ok(Tensor::full(shape.to_vec(), v, dtype, &Device::Cpu)?.requires_grad_())
}
