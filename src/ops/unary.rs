//! Unary maps (exp, log, activations, ...), affine `x·a + b`, powers and GLU.
//! Backward of a map: `g · f'(x)` from the saved input and output.

use super::{cpu, out};
use crate::autograd::record;
use crate::backend::cpu::elementwise::{self as k, Unary};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

fn unary(op: Unary, x: &Tensor) -> Result<Tensor> {
    let y = out(k::unary(op, cpu("unary", &x.storage())?)?, x.shape().clone());
    let (xs, ys) = (x.detach(), y.detach());
    Ok(record(op.name(), &[x], y, vec![xs.clone(), ys.clone()], move |g, _| {
        let gx = k::unary_backward(op, cpu("unary", &xs.storage())?, cpu("unary", &ys.storage())?, cpu("unary", &g.storage())?)?;
        Ok(vec![Some(out(gx, xs.shape().clone()))])
    }))
}

/// `−x`.
pub fn neg(x: &Tensor) -> Result<Tensor> {
    affine(x, -1.0, 0.0)
}
/// `eˣ`.
pub fn exp(x: &Tensor) -> Result<Tensor> {
    unary(Unary::Exp, x)
}
/// Natural logarithm.
pub fn log(x: &Tensor) -> Result<Tensor> {
    unary(Unary::Log, x)
}
/// Square root.
pub fn sqrt(x: &Tensor) -> Result<Tensor> {
    unary(Unary::Sqrt, x)
}
/// `1/√x`.
pub fn rsqrt(x: &Tensor) -> Result<Tensor> {
    unary(Unary::Rsqrt, x)
}
/// `|x|` (gradient 0 at 0, as PyTorch).
pub fn abs(x: &Tensor) -> Result<Tensor> {
    unary(Unary::Abs, x)
}
/// `max(x, 0)`.
pub fn relu(x: &Tensor) -> Result<Tensor> {
    unary(Unary::Relu, x)
}
/// `x·σ(x)` (swish).
pub fn silu(x: &Tensor) -> Result<Tensor> {
    unary(Unary::Silu, x)
}
/// The exact GELU `x·Φ(x)`.
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    unary(Unary::Gelu, x)
}
/// The logistic sigmoid.
pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    unary(Unary::Sigmoid, x)
}
/// Hyperbolic tangent.
pub fn tanh(x: &Tensor) -> Result<Tensor> {
    unary(Unary::Tanh, x)
}

/// `x·a + b` for scalars a and b.
pub fn affine(x: &Tensor, a: f64, b: f64) -> Result<Tensor> {
    let y = out(k::affine(cpu("unary", &x.storage())?, a, b)?, x.shape().clone());
    Ok(record("affine", &[x], y, vec![], move |g, _| Ok(vec![Some(affine(g, a, 0.0)?)])))
}

/// `x^p` for a scalar exponent.
pub fn pow(x: &Tensor, p: f64) -> Result<Tensor> {
    let y = out(k::powf(cpu("unary", &x.storage())?, p)?, x.shape().clone());
    let xs = x.detach();
    Ok(record("pow", &[x], y, vec![xs.clone()], move |g, _| {
        let d = affine(&pow(&xs, p - 1.0)?, p, 0.0)?;
        Ok(vec![Some(super::mul(g, &d)?)])
    }))
}

/// Gated linear unit over `dim`: the first half times the sigmoid of the second.
pub fn glu(x: &Tensor, dim: isize) -> Result<Tensor> {
    let d = x.shape().dim("glu", dim)?;
    let n = x.dims()[d];
    if n % 2 != 0 {
        return Err(Error::ShapeMismatch { op: "glu", expected: format!("an even size along dim {dim}"), got: format!("shape {}", x.shape()) });
    }
    let a = super::narrow(x, d as isize, 0, n / 2)?;
    let b = super::narrow(x, d as isize, n / 2, n / 2)?;
    super::mul(&a, &sigmoid(&b)?)
}
