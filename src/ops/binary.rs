//! Broadcasting add, sub, mul, div, the fused `a + c·b` and the scalar affine shortcuts.
//! Backward: the output gradient (times the other operand for mul/div),
//! summed back to each operand's shape over its broadcast dims. A half
//! operand meeting an f32 one is promoted to f32 first (autocast's mix).

use super::{mixed, out_storage, same_kind};
use crate::autograd::record;
use crate::backend::cpu::elementwise::{self as k, Bcast, Binary};
use crate::backend::{cuda, Storage};
use crate::error::Result;
use crate::tensor::{DType, Shape, Tensor};

/// The common type of a half and an f32 operand (f32, as PyTorch promotes
/// autocast's half activations meeting f32 tensors); `None` for any other
/// pair of different types, which stays an error.
fn promoted(a: DType, b: DType) -> Option<DType> {
    let half = |d: DType| matches!(d, DType::F16 | DType::BF16);
    (a != b && ((half(a) && b == DType::F32) || (half(b) && a == DType::F32))).then_some(DType::F32)
}

fn binary(op: Binary, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if let Some(t) = promoted(a.dtype(), b.dtype()) {
        // A half activation meeting an f32 parameter under autocast: the
        // parameter's half copy (cast once per step), the result stays half.
        if super::autocast_dtype() == Some(a.dtype()) {
            if let Some(bh) = super::autocast::param_half(b)? {
                return binary(op, a, &bh);
            }
        } else if super::autocast_dtype() == Some(b.dtype()) {
            if let Some(ah) = super::autocast::param_half(a)? {
                return binary(op, &ah, b);
            }
        }
        if a.device() == b.device() {
            return binary(op, &super::to_dtype(a, t)?, &super::to_dtype(b, t)?);
        }
    }
    same_kind(op.name(), a, b)?;
    let shape = Shape::broadcast(op.name(), a.shape(), b.shape())?;
    let bc = Bcast { sa: a.shape().broadcast_strides(&shape), sb: b.shape().broadcast_strides(&shape), out_dims: shape.dims().to_vec() };
    let y = match (&*a.storage(), &*b.storage()) {
        (Storage::Cpu(x), Storage::Cpu(y)) => Storage::Cpu(k::binary(op, x, y, &bc)?),
        (Storage::Cuda(x), Storage::Cuda(y)) => Storage::Cuda(cuda::elementwise::binary(op, x, y, &bc)?),
        _ => return Err(mixed(op.name())),
    };
    let y = out_storage(y, shape);
    let (sa, sb) = (a.shape().clone(), b.shape().clone());
    let saved = match op {
        Binary::Mul | Binary::Div => vec![a.detach(), b.detach()],
        _ => vec![],
    };
    let (ad, bd) = (a.detach(), b.detach());
    Ok(record(op.name(), &[a, b], y, saved, move |g, needs| {
        let (ga, gb) = match op {
            Binary::Add => (needs[0].then(|| g.clone()), needs[1].then(|| g.clone())),
            Binary::Sub => (needs[0].then(|| g.clone()), if needs[1] { Some(super::neg(g)?) } else { None }),
            Binary::Mul => (if needs[0] { Some(mul(g, &bd)?) } else { None }, if needs[1] { Some(mul(g, &ad)?) } else { None }),
            Binary::Div => {
                (if needs[0] { Some(div(g, &bd)?) } else { None }, if needs[1] { Some(super::neg(&div(&mul(g, &ad)?, &mul(&bd, &bd)?)?)?) } else { None })
            }
        };
        Ok(vec![ga.map(|g| sum_to_shape(&g, &sa)).transpose()?, gb.map(|g| sum_to_shape(&g, &sb)).transpose()?])
    }))
}

/// `a + b`, broadcasting.
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(Binary::Add, a, b)
}
/// `a − b`, broadcasting.
pub fn sub(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(Binary::Sub, a, b)
}
/// `a · b` elementwise, broadcasting.
pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(Binary::Mul, a, b)
}
/// `a / b` elementwise, broadcasting.
pub fn div(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(Binary::Div, a, b)
}
/// `a + c·b` for operands of one shape and type in one elementwise launch
/// (the macaron residual `x + ½·ff(x)`); backward: `ga = g`, `gb = c·g`.
/// Other shapes or types (broadcasting, autocast's half/f32 mix) go
/// through `add(a, mul_scalar(b, c))`.
pub fn add_scaled(a: &Tensor, b: &Tensor, c: f64) -> Result<Tensor> {
    if a.shape() != b.shape() || a.dtype() != b.dtype() {
        return add(a, &mul_scalar(b, c)?);
    }
    same_kind("add_scaled", a, b)?;
    let y = match (&*a.storage(), &*b.storage()) {
        (Storage::Cpu(x), Storage::Cpu(y)) => Storage::Cpu(k::add_scaled(x, y, c)?),
        (Storage::Cuda(x), Storage::Cuda(y)) => Storage::Cuda(cuda::elementwise::add_scaled(x, y, c)?),
        _ => return Err(mixed("add_scaled")),
    };
    let y = out_storage(y, a.shape().clone());
    Ok(record("add_scaled", &[a, b], y, vec![], move |g, needs| {
        let gb = if needs[1] { Some(super::affine(g, c, 0.0)?) } else { None };
        Ok(vec![needs[0].then(|| g.clone()), gb])
    }))
}
/// `x + c`.
pub fn add_scalar(x: &Tensor, c: f64) -> Result<Tensor> {
    super::affine(x, 1.0, c)
}
/// `x · c`.
pub fn mul_scalar(x: &Tensor, c: f64) -> Result<Tensor> {
    super::affine(x, c, 0.0)
}

/// Sums `g` over the dims along which a tensor of `shape` was broadcast to
/// `g`'s shape (the backward of broadcasting).
pub fn sum_to_shape(g: &Tensor, shape: &Shape) -> Result<Tensor> {
    if g.shape() == shape {
        return Ok(g.clone());
    }
    let lead = g.rank() - shape.rank();
    // The broadcast dims, as dims of `g`: the leading ones, then those where
    // `shape` has size 1. They are summed in one accumulation (f32 for
    // halves) and rounded to g's dtype once.
    let ds: Vec<usize> = (0..g.rank()).filter(|&d| d < lead || (shape.dims()[d - lead] == 1 && g.dims()[d] != 1)).collect();
    let summed = super::reduce::sum_acc(&g.storage(), &super::reduce::sum_steps(g.dims(), &ds))?;
    match summed {
        Some(c) => Ok(out_storage(super::reduce::round_to(c, g.dtype())?, shape.clone())),
        None => Ok(g.reshaped(shape.clone(), false)),
    }
}
