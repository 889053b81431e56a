//! Elementwise kernels: unary maps with their derivatives, affine and power
//! maps, and broadcasting binary ops. Layouts: contiguous row-major; a
//! broadcast operand is read through strides that are 0 on broadcast dims.

use super::{par_chunks, CpuStorage, Float, Zip1, Zip2, Zip3};
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
    /// Whether the backward reads only the input x (else only the output y;
    /// relu's `x > 0` is `y > 0`), so an op saves just that one tensor.
    pub fn backward_reads_x(self) -> bool {
        matches!(self, Unary::Log | Unary::Abs | Unary::Silu | Unary::Gelu)
    }
}

#[inline]
fn sigmoid<T: Float>(x: T) -> T {
    T::one() / (T::one() + (-x).exp_v())
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

/// Every op of [`Unary`] as a constant: `$body` is compiled once per op, so
/// the `match` on the op in [`apply`] and [`derivative`] folds away and the
/// loop over the elements vectorises (a runtime op inside the loop kept it
/// scalar).
macro_rules! per_op {
    ($op:expr, |$k:ident| $body:expr) => {
        match $op {
            Unary::Exp => {
                const $k: Unary = Unary::Exp;
                $body
            }
            Unary::Log => {
                const $k: Unary = Unary::Log;
                $body
            }
            Unary::Sqrt => {
                const $k: Unary = Unary::Sqrt;
                $body
            }
            Unary::Rsqrt => {
                const $k: Unary = Unary::Rsqrt;
                $body
            }
            Unary::Abs => {
                const $k: Unary = Unary::Abs;
                $body
            }
            Unary::Relu => {
                const $k: Unary = Unary::Relu;
                $body
            }
            Unary::Silu => {
                const $k: Unary = Unary::Silu;
                $body
            }
            Unary::Gelu => {
                const $k: Unary = Unary::Gelu;
                $body
            }
            Unary::Sigmoid => {
                const $k: Unary = Unary::Sigmoid;
                $body
            }
            Unary::Tanh => {
                const $k: Unary = Unary::Tanh;
                $body
            }
        }
    };
}

/// `f` over `x` in fixed chunks (parallel when large), through iterators
/// that carry no bounds checks.
fn map<T: Float>(x: &[T], f: impl Fn(T) -> T + Sync + Send) -> Vec<T> {
    let mut out = super::pool::zeroed(x.len());
    par_chunks(&mut out, CHUNK, |s, o| {
        let n = o.len();
        super::simd(Zip1 { out: o, x: &x[s..s + n], f: &f })
    });
    out
}

/// `f(x, y, g)` elementwise over three equal-length slices, as [`map`].
fn map3<T: Float>(x: &[T], y: &[T], g: &[T], f: impl Fn(T, T, T) -> T + Sync + Send) -> Vec<T> {
    let mut out = super::pool::zeroed(x.len());
    par_chunks(&mut out, CHUNK, |s, o| {
        let n = o.len();
        let (x, y, g) = (&x[s..s + n], &y[s..s + n], &g[s..s + n]);
        super::simd(Zip3 { out: o, x, y, z: g, f: &f })
    });
    out
}

/// `y = f(x)`.
pub fn unary(op: Unary, x: &CpuStorage) -> Result<CpuStorage> {
    Ok(float_match!(op.name(), x, |x| per_op!(op, |K| Float::store(map(x, |v| apply(K, v))))))
}

/// `gx = gy · f'(x)` from the forward's input and output.
pub fn unary_backward(op: Unary, x: &CpuStorage, y: &CpuStorage, gy: &CpuStorage) -> Result<CpuStorage> {
    if x.len() != y.len() || x.len() != gy.len() {
        return Err(crate::error::Error::invalid(
            op.name(),
            format!("backward expected x, y and gy of one length, got {}, {} and {}", x.len(), y.len(), gy.len()),
        ));
    }
    Ok(float_match!(op.name(), (x, y, gy), |x, y, g| per_op!(op, |K| Float::store(map3(x, y, g, |a, b, c| c * derivative(K, a, b))))))
}

/// `y = x·mul + add`.
pub fn affine(x: &CpuStorage, mul: f64, add: f64) -> Result<CpuStorage> {
    Ok(float_match!("affine", x, |x| {
        let (m, a) = (super::of_as(x, mul), super::of_as(x, add));
        Float::store(map(x, |v| v * m + a))
    }))
}

/// `y = a + c·b` over two buffers of one length and type.
pub fn add_scaled(a: &CpuStorage, b: &CpuStorage, c: f64) -> Result<CpuStorage> {
    if a.len() != b.len() {
        return Err(crate::error::Error::invalid("add_scaled", format!("expected operands of one length, got {} and {}", a.len(), b.len())));
    }
    Ok(float_match!("add_scaled", (a, b), |a, b| {
        let cc = super::of_as(a, c);
        let mut out = super::pool::zeroed(a.len());
        par_chunks(&mut out, CHUNK, |s, o| {
            let n = o.len();
            for ((o, &x), &y) in o.iter_mut().zip(&a[s..s + n]).zip(&b[s..s + n]) {
                *o = x + cc * y;
            }
        });
        Float::store(out)
    }))
}

/// `y = x^p`.
pub fn pow(x: &CpuStorage, p: f64) -> Result<CpuStorage> {
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
    // One copy of the loops per op (as `per_op!`), so they vectorise.
    match op {
        Binary::Add => binary_k(a, b, bc, |x, y| x + y),
        Binary::Sub => binary_k(a, b, bc, |x, y| x - y),
        Binary::Mul => binary_k(a, b, bc, |x, y| x * y),
        Binary::Div => binary_k(a, b, bc, |x, y| x / y),
    }
}

fn binary_k<T: Float>(a: &[T], b: &[T], bc: &Bcast, f: impl Fn(T, T) -> T + Sync + Send) -> Vec<T> {
    let n: usize = bc.out_dims.iter().product();
    let mut out = super::pool::zeroed(n);
    if a.len() == n && b.len() == n {
        par_chunks(&mut out, CHUNK, |s, o| {
            let m = o.len();
            super::simd(Zip2 { out: o, x: &a[s..s + m], y: &b[s..s + m], f: &f })
        });
        return out;
    }
    if b.len() == 1 && a.len() == n {
        let bv = b[0];
        par_chunks(&mut out, CHUNK, |s, o| {
            let m = o.len();
            super::simd(Zip1 { out: o, x: &a[s..s + m], f: &|x| f(x, bv) })
        });
        return out;
    }
    let row = bc.row();
    let (ia, ib) = bc.inner();
    super::par_rows(&mut out, row, |r, o| {
        let (oa, ob) = bc.offsets(r);
        match (ia, ib) {
            // Both rows contiguous (a bias added to each row, a mask over rows).
            (1, 1) => super::simd(Zip2 { out: o, x: &a[oa..oa + row], y: &b[ob..ob + row], f: &f }),
            (1, 0) => {
                let y = b[ob];
                super::simd(Zip1 { out: o, x: &a[oa..oa + row], f: &|x| f(x, y) })
            }
            (0, 1) => {
                let x = a[oa];
                super::simd(Zip1 { out: o, x: &b[ob..ob + row], f: &|y| f(x, y) })
            }
            _ => {
                for (j, o) in o.iter_mut().enumerate() {
                    *o = f(a[oa + j * ia], b[ob + j * ib]);
                }
            }
        }
    });
    out
}

/// `op(a, b)` broadcast to `out_dims`, with operand strides from
/// [`crate::tensor::Shape::broadcast_strides`].
pub(crate) fn binary(op: Binary, a: &CpuStorage, b: &CpuStorage, bc: &Bcast) -> Result<CpuStorage> {
    Ok(float_match!(op.name(), (a, b), |a, b| Float::store(binary_t(op, a, b, bc))))
}

fn glu_fwd<T: Float>(x: &[T], outer: usize, hi: usize) -> Vec<T> {
    let mut y = super::zeros_as(x, outer * hi);
    super::par_rows(&mut y, hi.max(1), |o, yr| {
        let (a, b) = (&x[o * 2 * hi..o * 2 * hi + hi], &x[o * 2 * hi + hi..(o + 1) * 2 * hi]);
        for ((yv, &av), &bv) in yr.iter_mut().zip(a).zip(b) {
            *yv = av * sigmoid(bv);
        }
    });
    y
}

fn glu_bwd<T: Float>(x: &[T], g: &[T], outer: usize, hi: usize) -> Vec<T> {
    let mut gx = super::zeros_as(x, outer * 2 * hi);
    super::par_rows(&mut gx, (2 * hi).max(1), |o, gr| {
        let (ga, gb) = gr.split_at_mut(hi);
        for j in 0..hi {
            let (av, s, gv) = (x[o * 2 * hi + j], sigmoid(x[o * 2 * hi + hi + j]), g[o * hi + j]);
            ga[j] = gv * s;
            gb[j] = (gv * av) * (s * (T::one() - s));
        }
    });
    gx
}

/// Gated linear unit over x viewed as (outer, 2, hi): `y (outer, hi) = a·σ(b)`
/// for a = x[:, 0], b = x[:, 1]. Half inputs are computed in f32 and rounded
/// once (as the GPU's half kernels do).
pub fn glu(x: &CpuStorage, outer: usize, hi: usize) -> Result<CpuStorage> {
    if matches!(x.dtype(), crate::tensor::DType::F16 | crate::tensor::DType::BF16) {
        return Ok(glu(&x.to_dtype(crate::tensor::DType::F32), outer, hi)?.to_dtype(x.dtype()));
    }
    Ok(float_match!("glu", x, |x| Float::store(glu_fwd(x, outer, hi))))
}

/// The input gradient (outer, 2, hi) of [`glu`]: `g·σ(b)` for a and
/// `(g·a)·(σ(b)·(1 − σ(b)))` for b.
pub fn glu_backward(x: &CpuStorage, g: &CpuStorage, outer: usize, hi: usize) -> Result<CpuStorage> {
    if matches!(x.dtype(), crate::tensor::DType::F16 | crate::tensor::DType::BF16) {
        let f32s = |s: &CpuStorage| s.to_dtype(crate::tensor::DType::F32);
        return Ok(glu_backward(&f32s(x), &f32s(g), outer, hi)?.to_dtype(x.dtype()));
    }
    Ok(float_match!("glu_backward", (x, g), |x, g| Float::store(glu_bwd(x, g, outer, hi))))
}
