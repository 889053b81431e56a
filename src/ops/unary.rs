//! Unary maps (exp, log, activations, ...), affine `x·a + b`, powers and GLU.
//! Backward of a map: `g · f'(x)` from the saved input or output (whichever
//! the derivative reads; see [`Unary::backward_reads_x`]).

use super::{mixed, out_storage};
use crate::autograd::record;
use crate::backend::cpu::elementwise::{self as k, Unary};
use crate::backend::{cuda, Storage};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

fn unary(op: Unary, x: &Tensor) -> Result<Tensor> {
    let y = match &*x.storage() {
        Storage::Cpu(c) => Storage::Cpu(k::unary(op, c)?),
        Storage::Cuda(c) => Storage::Cuda(cuda::elementwise::unary(op, c)?),
    };
    let y = out_storage(y, x.shape().clone());
    // Only the tensor the derivative reads is kept, passed as both x and y:
    // relu's input (the subsampling's conv outputs) is then freed at once.
    let keep = if op.backward_reads_x() { x.detach() } else { y.detach() };
    let ks = keep.clone();
    Ok(record(op.name(), &[x], y, vec![keep], move |g, _| {
        let gx = match (&*ks.storage(), &*g.storage()) {
            (Storage::Cpu(v), Storage::Cpu(g)) => Storage::Cpu(k::unary_backward(op, v, v, g)?),
            (Storage::Cuda(v), Storage::Cuda(g)) => Storage::Cuda(cuda::elementwise::unary_backward(op, v, v, g)?),
            _ => return Err(mixed(op.name())),
        };
        Ok(vec![Some(out_storage(gx, ks.shape().clone()))])
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
    let y = match &*x.storage() {
        Storage::Cpu(c) => Storage::Cpu(k::affine(c, a, b)?),
        Storage::Cuda(c) => Storage::Cuda(cuda::elementwise::affine(c, a, b)?),
    };
    let y = out_storage(y, x.shape().clone());
    Ok(record("affine", &[x], y, vec![], move |g, _| Ok(vec![Some(affine(g, a, 0.0)?)])))
}

/// `x^p` for a scalar exponent.
pub fn pow(x: &Tensor, p: f64) -> Result<Tensor> {
    let y = match &*x.storage() {
        Storage::Cpu(c) => Storage::Cpu(k::pow(c, p)?),
        Storage::Cuda(c) => Storage::Cuda(cuda::elementwise::pow(c, p)?),
    };
    let y = out_storage(y, x.shape().clone());
    let xs = x.detach();
    Ok(record("pow", &[x], y, vec![xs.clone()], move |g, _| {
        let d = affine(&pow(&xs, p - 1.0)?, p, 0.0)?;
        Ok(vec![Some(super::mul(g, &d)?)])
    }))
}

/// Gated linear unit over `dim`: the first half times the sigmoid of the
/// second, in one kernel each way (x viewed as (outer, 2, h·inner)).
pub fn glu(x: &Tensor, dim: isize) -> Result<Tensor> {
    let d = x.shape().dim("glu", dim)?;
    let n = x.dims()[d];
    if n % 2 != 0 {
        return Err(Error::ShapeMismatch { op: "glu", expected: format!("an even size along dim {dim}"), got: format!("shape {}", x.shape()) });
    }
    let outer: usize = x.dims()[..d].iter().product();
    let hi = n / 2 * x.dims()[d + 1..].iter().product::<usize>();
    let y = match &*x.storage() {
        Storage::Cpu(c) => Storage::Cpu(k::glu(c, outer, hi)?),
        Storage::Cuda(c) => Storage::Cuda(cuda::glu::glu(c, outer, hi)?),
    };
    let mut dims = x.dims().to_vec();
    dims[d] = n / 2;
    let y = out_storage(y, dims);
    let xs = x.detach();
    Ok(record("glu", &[x], y, vec![xs.clone()], move |g, _| {
        let gx = match (&*xs.storage(), &*g.storage()) {
            (Storage::Cpu(a), Storage::Cpu(b)) => Storage::Cpu(k::glu_backward(a, b, outer, hi)?),
            (Storage::Cuda(a), Storage::Cuda(b)) => Storage::Cuda(cuda::glu::glu_backward(a, b, outer, hi)?),
            _ => return Err(mixed("glu_backward")),
        };
        Ok(vec![Some(out_storage(gx, xs.shape().clone()))])
    }))
}
