//! Elementwise kernels: unary maps with their derivatives, affine and power
//! maps, and broadcasting binary ops. Layouts: contiguous row-major; a
//! broadcast operand is read through strides that are 0 on broadcast dims.

use super::{par_chunks, CpuStorage, Float};
use crate::error::Result;
use crate::float_match;

const CHUNK: usize = 1 << 14;

/// Unary maps `y = f(x)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unary {
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Abs,
    Relu,
    /// `x·σ(x)` (swish).
    Silu,
    /// The exact, erf-based GELU (PyTorch's default).
    Gelu,
    Sigmoid,
    Tanh,
}

impl Unary {
    /// The op's name in errors and on the tape.
    pub fn name(self) -> &'static str {
        match self {
            Unary::Exp => "exp",
            Unary::Log => "log",
            Unary::Sqrt => "sqrt",
            Unary::Rsqrt => "rsqrt",
            Unary::Abs => "abs",
            Unary::Relu => "relu",
            Unary::Silu => "silu",
            Unary::Gelu => "gelu",
            Unary::Sigmoid => "sigmoid",
            Unary::Tanh => "tanh",
        }
    }
}

fn sigmoid<T: Float>(x: T) -> T {
    T::one() / (T::one() + (-x).exp())
}

const INV_SQRT2: f64 = std::f64::consts::FRAC_1_SQRT_2;
const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

#[inline]
fn apply<T: Float>(op: Unary, x: T) -> T {
    match op {
        Unary::Exp => x.exp(),
        Unary::Log => x.ln(),
        Unary::Sqrt => x.sqrt(),
        Unary::Rsqrt => T::one() / x.sqrt(),
        Unary::Abs => x.abs(),
        Unary::Relu => x.max(T::zero()),
        Unary::Silu => x * sigmoid(x),
        Unary::Gelu => T::of(0.5) * x * (T::one() + (x * T::of(INV_SQRT2)).erf()),
        Unary::Sigmoid => sigmoid(x),
        Unary::Tanh => x.tanh(),
    }
}

/// `dy/dx` at `x`, given `y = f(x)`.
#[inline]
fn derivative<T: Float>(op: Unary, x: T, y: T) -> T {
    match op {
        Unary::Exp => y,
        Unary::Log => T::one() / x,
        Unary::Sqrt => T::of(0.5) / y,
        Unary::Rsqrt => T::of(-0.5) * y * y * y,
        Unary::Abs => x.signum() * if x == T::zero() { T::zero() } else { T::one() },
        Unary::Relu => {
            if x > T::zero() {
                T::one()
            } else {
                T::zero()
            }
        }
        Unary::Silu => {
            let s = sigmoid(x);
            s * (T::one() + x * (T::one() - s))
        }
        Unary::Gelu => {
            let cdf = T::of(0.5) * (T::one() + (x * T::of(INV_SQRT2)).erf());
            cdf + x * T::of(INV_SQRT_2PI) * (T::of(-0.5) * x * x).exp()
        }
        Unary::Sigmoid => y * (T::one() - y),
        Unary::Tanh => T::one() - y * y,
    }
}

fn map<T: Float>(x: &[T], f: impl Fn(T) -> T + Sync + Send) -> Vec<T> {
    let mut out = vec![T::zero(); x.len()];
    par_chunks(&mut out, CHUNK, |s, o| {
        let n = o.len();
        for (o, &v) in o.iter_mut().zip(&x[s..s + n]) {
            *o = f(v);
        }
    });
    out
}

/// `y = f(x)`.
pub fn unary(op: Unary, x: &CpuStorage) -> Result<CpuStorage> {
    Ok(float_match!(op.name(), x, |x| Float::store(map(x, |v| apply(op, v)))))
}

/// `gx = gy · f'(x)` from the forward's input and output.
pub fn unary_backward(op: Unary, x: &CpuStorage, y: &CpuStorage, gy: &CpuStorage) -> Result<CpuStorage> {
    Ok(float_match!(op.name(), (x, y, gy), |x, y, g| {
        let mut out = super::zeros_as(x, x.len());
        par_chunks(&mut out, CHUNK, |s, o| {
            for (i, o) in o.iter_mut().enumerate() {
                *o = g[s + i] * derivative(op, x[s + i], y[s + i]);
            }
        });
        Float::store(out)
    }))
}

/// `y = x·mul + add`.
pub fn affine(x: &CpuStorage, mul: f64, add: f64) -> Result<CpuStorage> {
    Ok(float_match!("affine", x, |x| {
        let (m, a) = (super::of_as(x, mul), super::of_as(x, add));
        Float::store(map(x, |v| v * m + a))
    }))
}

/// `y = x^p`.
pub fn powf(x: &CpuStorage, p: f64) -> Result<CpuStorage> {
    Ok(float_match!("pow", x, |x| {
        let pp = super::of_as(x, p);
        Float::store(map(x, |v| v.powf(pp)))
    }))
}

/// Broadcasting binary ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    Div,
}

impl Binary {
    /// The op's name.
    pub fn name(self) -> &'static str {
        match self {
            Binary::Add => "add",
            Binary::Sub => "sub",
            Binary::Mul => "mul",
            Binary::Div => "div",
        }
    }
}

#[inline]
fn bin<T: Float>(op: Binary, a: T, b: T) -> T {
    match op {
        Binary::Add => a + b,
        Binary::Sub => a - b,
        Binary::Mul => a * b,
        Binary::Div => a / b,
    }
}

/// Iterates the output of a broadcast in rows of its last dim, giving each
/// row's start offset in both operands.
pub(crate) struct Bcast {
    pub out_dims: Vec<usize>,
    pub sa: Vec<usize>,
    pub sb: Vec<usize>,
}

impl Bcast {
    /// The row length (last output dim, 1 for a scalar).
    pub fn row(&self) -> usize {
        self.out_dims.last().copied().unwrap_or(1)
    }
    /// Start offsets of output row `r` in a and b.
    #[inline]
    pub fn offsets(&self, r: usize) -> (usize, usize) {
        let n = self.out_dims.len();
        if n <= 1 {
            return (0, 0);
        }
        let (mut rem, mut oa, mut ob) = (r, 0, 0);
        for d in (0..n - 1).rev() {
            let i = rem % self.out_dims[d];
            rem /= self.out_dims[d];
            oa += i * self.sa[d];
            ob += i * self.sb[d];
        }
        (oa, ob)
    }
    /// Inner strides (0 or 1) of a and b along the last dim.
    pub fn inner(&self) -> (usize, usize) {
        (self.sa.last().copied().unwrap_or(0), self.sb.last().copied().unwrap_or(0))
    }
}

fn binary_t<T: Float>(op: Binary, a: &[T], b: &[T], bc: &Bcast) -> Vec<T> {
    let n: usize = bc.out_dims.iter().product();
    let mut out = vec![T::zero(); n];
    if a.len() == n && b.len() == n {
        par_chunks(&mut out, CHUNK, |s, o| {
            for (i, o) in o.iter_mut().enumerate() {
                *o = bin(op, a[s + i], b[s + i]);
            }
        });
        return out;
    }
    if b.len() == 1 && a.len() == n {
        let bv = b[0];
        par_chunks(&mut out, CHUNK, |s, o| {
            for (i, o) in o.iter_mut().enumerate() {
                *o = bin(op, a[s + i], bv);
            }
        });
        return out;
    }
    let row = bc.row();
    let (ia, ib) = bc.inner();
    super::par_rows(&mut out, row, |r, o| {
        let (oa, ob) = bc.offsets(r);
        for (j, o) in o.iter_mut().enumerate() {
            *o = bin(op, a[oa + j * ia], b[ob + j * ib]);
        }
    });
    out
}

/// `op(a, b)` broadcast to `out_dims`, with operand strides from
/// [`crate::tensor::Shape::broadcast_strides`].
pub(crate) fn binary(op: Binary, a: &CpuStorage, b: &CpuStorage, bc: &Bcast) -> Result<CpuStorage> {
    Ok(float_match!(op.name(), (a, b), |a, b| Float::store(binary_t(op, a, b, bc))))
}
