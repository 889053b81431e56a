//! Elementwise ops on the GPU (`cuda/elementwise.cu`), the twin of
//! `cpu/elementwise.rs`: unary maps and their backward, affine, pow, and
//! binary ops with broadcasting. Float dtypes: f32, f64, f16, bf16.

use super::kernels::elementwise as k;
use super::{CudaStorage, LaunchConfig};
use crate::backend::cpu::elementwise::{Bcast, Binary, Unary};
use crate::error::{Error, Result};

use super::fastdiv::{coalesce, strided32_words, IndexWidth};
use super::nn_common::MAX_DIMS;

/// The error for a dtype an elementwise kernel does not take.
fn float_only(op: &'static str, x: &CudaStorage) -> Result<()> {
    if x.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::UnsupportedDType { op, dtype: x.dtype(), supported: "f32, f64, f16, bf16" })
    }
}

fn same(op: &'static str, a: &CudaStorage, b: &CudaStorage) -> Result<()> {
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch { op, expected: a.dtype(), got: b.dtype() });
    }
    if a.len() != b.len() {
        return Err(Error::invalid(op, format!("operands of {} and {} elements", a.len(), b.len())));
    }
    Ok(())
}

/// `y = f(x)`.
pub fn unary(op: Unary, x: &CudaStorage) -> Result<CudaStorage> {
    float_only(op.name(), x)?;
    let dev = x.device();
    let y = dev.alloc(x.dtype(), x.len())?;
    let f = match op {
        Unary::Exp => k::exp_fwd,
        Unary::Log => k::log_fwd,
        Unary::Sqrt => k::sqrt_fwd,
        Unary::Rsqrt => k::rsqrt_fwd,
        Unary::Abs => k::abs_fwd,
        Unary::Relu => k::relu_fwd,
        Unary::Silu => k::silu_fwd,
        Unary::Gelu => k::gelu_fwd,
        Unary::Sigmoid => k::sigmoid_fwd,
        Unary::Tanh => k::tanh_fwd,
    };
    f(dev, x.dtype(), LaunchConfig::for_elems(x.len()), x, &y, x.len() as i64)?;
    Ok(y)
}

/// `gx = gy · f'(x)` from the forward's input and output.
pub fn unary_backward(op: Unary, x: &CudaStorage, y: &CudaStorage, gy: &CudaStorage) -> Result<CudaStorage> {
    float_only(op.name(), x)?;
    same(op.name(), x, y)?;
    same(op.name(), x, gy)?;
    let dev = x.device();
    let gx = dev.alloc(x.dtype(), x.len())?;
    let f = match op {
        Unary::Exp => k::exp_bwd,
        Unary::Log => k::log_bwd,
        Unary::Sqrt => k::sqrt_bwd,
        Unary::Rsqrt => k::rsqrt_bwd,
        Unary::Abs => k::abs_bwd,
        Unary::Relu => k::relu_bwd,
        Unary::Silu => k::silu_bwd,
        Unary::Gelu => k::gelu_bwd,
        Unary::Sigmoid => k::sigmoid_bwd,
        Unary::Tanh => k::tanh_bwd,
    };
    f(dev, x.dtype(), LaunchConfig::for_elems(x.len()), x, y, gy, &gx, x.len() as i64)?;
    Ok(gx)
}

/// `y = x·mul + add`.
pub fn affine(x: &CudaStorage, mul: f64, add: f64) -> Result<CudaStorage> {
    float_only("affine", x)?;
    let dev = x.device();
    let y = dev.alloc(x.dtype(), x.len())?;
    k::affine(dev, x.dtype(), LaunchConfig::for_elems(x.len()), x, &y, mul, add, x.len() as i64)?;
    Ok(y)
}

/// `y = a + c·b` over two buffers of one length and type (one launch).
pub fn add_scaled(a: &CudaStorage, b: &CudaStorage, c: f64) -> Result<CudaStorage> {
    float_only("add_scaled", a)?;
    same("add_scaled", a, b)?;
    let dev = a.device();
    let y = dev.alloc(a.dtype(), a.len())?;
    if a.is_empty() {
        return Ok(y);
    }
    k::add_scaled(dev, a.dtype(), LaunchConfig::for_elems(a.len()), a, b, &y, c, a.len() as i64)?;
    Ok(y)
}

/// `y = x^p`.
pub fn pow(x: &CudaStorage, p: f64) -> Result<CudaStorage> {
    float_only("pow", x)?;
    let dev = x.device();
    let y = dev.alloc(x.dtype(), x.len())?;
    k::pow(dev, x.dtype(), LaunchConfig::for_elems(x.len()), x, &y, p, x.len() as i64)?;
    Ok(y)
}

/// The `Bcast` struct of `cuda/common.cuh` as 64-bit words:
/// rank, out[8], sa[8], sb[8] (size-1 dims dropped, contiguous dims merged).
fn bcast_words(op: &'static str, bc: &Bcast) -> Result<[u64; 1 + 3 * MAX_DIMS]> {
    let (out_dims, s) = coalesce(&bc.out_dims, &[&bc.sa, &bc.sb]);
    let bc = Bcast { out_dims, sa: s[0].clone(), sb: s[1].clone() };
    let r = bc.out_dims.len();
    if r > MAX_DIMS {
        return Err(Error::invalid(op, format!("broadcast over {r} dims; the CUDA kernel takes at most {MAX_DIMS}")));
    }
    let mut w = [0u64; 1 + 3 * MAX_DIMS];
    w[0] = r as u64;
    for d in 0..r {
        w[1 + d] = bc.out_dims[d] as u64;
        w[1 + MAX_DIMS + d] = bc.sa[d] as u64;
        w[1 + 2 * MAX_DIMS + d] = bc.sb[d] as u64;
    }
    Ok(w)
}

/// `op(a, b)` broadcast to `bc.out_dims` (strides as the CPU's).
pub(crate) fn binary(op: Binary, a: &CudaStorage, b: &CudaStorage, bc: &Bcast) -> Result<CudaStorage> {
    binary_with(op, a, b, bc, IndexWidth::Auto)
}

/// `op(a, b)` of operands of shapes `a_dims` and `b_dims`, broadcast to
/// their common shape, through the broadcast kernels of the index width
/// chosen by the caller (tests and benches compare the two).
pub fn broadcast_binary_with(op: Binary, a: &CudaStorage, a_dims: &[usize], b: &CudaStorage, b_dims: &[usize], width: IndexWidth) -> Result<CudaStorage> {
    let (sa, sb) = (crate::tensor::Shape::from(a_dims), crate::tensor::Shape::from(b_dims));
    let out = crate::tensor::Shape::broadcast(op.name(), &sa, &sb)?;
    for (x, s, what) in [(a, &sa, "the first operand"), (b, &sb, "the second operand")] {
        if x.len() != s.elem_count() {
            return Err(Error::invalid(op.name(), format!("{what} of shape {:?} needs {} elements, found {}", s.dims(), s.elem_count(), x.len())));
        }
    }
    let bc = Bcast { sa: sa.broadcast_strides(&out), sb: sb.broadcast_strides(&out), out_dims: out.dims().to_vec() };
    binary_with(op, a, b, &bc, width)
}

fn binary_with(op: Binary, a: &CudaStorage, b: &CudaStorage, bc: &Bcast, width: IndexWidth) -> Result<CudaStorage> {
    float_only(op.name(), a)?;
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch { op: op.name(), expected: a.dtype(), got: b.dtype() });
    }
    let n: usize = bc.out_dims.iter().product();
    let dev = a.device();
    let y = dev.alloc(a.dtype(), n)?;
    let dt = a.dtype();
    if n == 0 {
        return Ok(y);
    }
    let aligned = [a.ptr(), b.ptr(), y.ptr()].iter().all(|p| p % 16 == 0);
    if a.len() == n && b.len() == n && aligned {
        let f = match op {
            Binary::Add => k::add,
            Binary::Sub => k::sub,
            Binary::Mul => k::mul,
            Binary::Div => k::div,
        };
        f(dev, dt, LaunchConfig::for_elems(n), a, b, &y, n as i64)?;
    } else if width.use_u32(&[n, a.len(), b.len()]) {
        // u32 indices and host-computed divisors (`Bcast32` of `cuda/common.cuh`).
        let words = strided32_words(op.name(), &bc.out_dims, &[&bc.sa, &bc.sb])?;
        let f = match op {
            Binary::Add => k::add_bcast_u32,
            Binary::Sub => k::sub_bcast_u32,
            Binary::Mul => k::mul_bcast_u32,
            Binary::Div => k::div_bcast_u32,
        };
        f(dev, dt, LaunchConfig::for_elems(n), a, b, &y, &words, n as u32)?;
    } else {
        let words = bcast_words(op.name(), bc)?;
        let f = match op {
            Binary::Add => k::add_bcast,
            Binary::Sub => k::sub_bcast,
            Binary::Mul => k::mul_bcast,
            Binary::Div => k::div_bcast,
        };
        f(dev, dt, LaunchConfig::for_elems(n), a, b, &y, &words, n as i64)?;
    }
    Ok(y)
}
