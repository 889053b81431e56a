//! softmax and log_softmax over the last dim, with their backward kernels.

use super::{cpu, out};
use crate::autograd::record;
use crate::backend::cpu::softmax as k;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

fn last(op: &'static str, x: &Tensor) -> Result<usize> {
    match x.dims().last() {
        Some(&n) if n > 0 => Ok(n),
        _ => Err(Error::ShapeMismatch { op, expected: "a non-empty last dim".into(), got: format!("shape {}", x.shape()) }),
    }
}

/// Softmax over the last dim.
pub fn softmax(x: &Tensor) -> Result<Tensor> {
    let n = last("softmax", x)?;
    let y = out(k::softmax(cpu("softmax", &x.storage())?, n)?, x.shape().clone());
    let ys = y.detach();
    Ok(record("softmax", &[x], y, vec![ys.clone()], move |g, _| {
        Ok(vec![Some(out(k::softmax_backward(cpu("softmax", &ys.storage())?, cpu("softmax", &g.storage())?, n)?, ys.shape().clone()))])
    }))
}

/// Log-softmax over the last dim.
pub fn log_softmax(x: &Tensor) -> Result<Tensor> {
    let n = last("log_softmax", x)?;
    let y = out(k::log_softmax(cpu("softmax", &x.storage())?, n)?, x.shape().clone());
    let ys = y.detach();
    Ok(record("log_softmax", &[x], y, vec![ys.clone()], move |g, _| {
        Ok(vec![Some(out(k::log_softmax_backward(cpu("softmax", &ys.storage())?, cpu("softmax", &g.storage())?, n)?, ys.shape().clone()))])
    }))
}
