//! The CPU backend: the reference implementation of every op.
//!
//! Kernels are generic over [`Float`] (f32 and f64; f64 exists for gradient
//! checks) and work on contiguous row-major slices. Work above
//! [`PAR_THRESHOLD`] elements is split over rayon's pool in fixed-size chunks,
//! so results do not depend on the number of threads.

pub mod attention;
pub mod conv;
pub mod ctc;
pub mod elementwise;
pub mod index;
pub mod layout;
pub mod loss;
pub mod matmul;
pub mod norm;
pub mod optim;
pub mod pool;
pub mod reduce;
pub mod softmax;

use crate::error::{Error, Result};
use crate::tensor::DType;
use half::{bf16, f16};

/// Below this many elements a kernel runs on the calling thread.
pub const PAR_THRESHOLD: usize = 1 << 15;

/// Contiguous host storage of one dtype.
#[derive(Debug, Clone, PartialEq)]
pub enum CpuStorage {
    F32(Vec<f32>),
    F64(Vec<f64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I64(Vec<i64>),
    U8(Vec<u8>),
}

impl CpuStorage {
    /// The elements as bytes (native endianness), for copies to a GPU or a peer.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            CpuStorage::F32(v) => bytemuck::cast_slice(v),
            CpuStorage::F64(v) => bytemuck::cast_slice(v),
            CpuStorage::F16(v) => bytemuck::cast_slice(v),
            CpuStorage::BF16(v) => bytemuck::cast_slice(v),
            CpuStorage::I64(v) => bytemuck::cast_slice(v),
            CpuStorage::U8(v) => v,
        }
    }
    /// The elements as writable bytes.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        match self {
            CpuStorage::F32(v) => bytemuck::cast_slice_mut(v),
            CpuStorage::F64(v) => bytemuck::cast_slice_mut(v),
            CpuStorage::F16(v) => bytemuck::cast_slice_mut(v),
            CpuStorage::BF16(v) => bytemuck::cast_slice_mut(v),
            CpuStorage::I64(v) => bytemuck::cast_slice_mut(v),
            CpuStorage::U8(v) => v,
        }
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F64(_) => DType::F64,
            CpuStorage::F16(_) => DType::F16,
            CpuStorage::BF16(_) => DType::BF16,
            CpuStorage::I64(_) => DType::I64,
            CpuStorage::U8(_) => DType::U8,
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            CpuStorage::F32(v) => v.len(),
            CpuStorage::F64(v) => v.len(),
            CpuStorage::F16(v) => v.len(),
            CpuStorage::BF16(v) => v.len(),
            CpuStorage::I64(v) => v.len(),
            CpuStorage::U8(v) => v.len(),
        }
    }
    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// `n` copies of `v` in `dtype`, or an error when the host cannot allocate them.
    pub fn try_full(dtype: DType, n: usize, v: f64) -> Result<CpuStorage> {
        // The element converted as `full` converts it: one rounding rule for every fill.
        Ok(match CpuStorage::full(dtype, 1, v) {
            CpuStorage::F32(x) => CpuStorage::F32(try_filled("tensor (f32)", x[0], n)?),
            CpuStorage::F64(x) => CpuStorage::F64(try_filled("tensor (f64)", x[0], n)?),
            CpuStorage::F16(x) => CpuStorage::F16(try_filled("tensor (f16)", x[0], n)?),
            CpuStorage::BF16(x) => CpuStorage::BF16(try_filled("tensor (bf16)", x[0], n)?),
            CpuStorage::I64(x) => CpuStorage::I64(try_filled("tensor (i64)", x[0], n)?),
            CpuStorage::U8(x) => CpuStorage::U8(try_filled("tensor (u8)", x[0], n)?),
        })
    }
    /// `n` copies of `v` in `dtype`.
    pub fn full(dtype: DType, n: usize, v: f64) -> CpuStorage {
        match dtype {
            DType::F32 => CpuStorage::F32(vec![v as f32; n]),
            DType::F64 => CpuStorage::F64(vec![v; n]),
            DType::F16 => CpuStorage::F16(vec![crate::tensor::halfconv::f16_from_f64(v); n]),
            DType::BF16 => CpuStorage::BF16(vec![crate::tensor::halfconv::bf16_from_f64(v); n]),
            DType::I64 => CpuStorage::I64(vec![v as i64; n]),
            DType::U8 => CpuStorage::U8(vec![v as u8; n]),
        }
    }
    /// Every element as f64 (exact for all dtypes but large i64).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match self {
            CpuStorage::F32(v) => v.iter().map(|&x| x as f64).collect(),
            CpuStorage::F64(v) => v.clone(),
            CpuStorage::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            CpuStorage::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
            CpuStorage::I64(v) => v.iter().map(|&x| x as f64).collect(),
            CpuStorage::U8(v) => v.iter().map(|&x| x as f64).collect(),
        }
    }
    /// Converts to `dtype` (round to nearest for the half types; truncation
    /// toward zero for integers, as PyTorch's `.to()`).
    pub fn to_dtype(&self, dtype: DType) -> CpuStorage {
        if dtype == self.dtype() {
            return self.clone();
        }
        match (self, dtype) {
            (CpuStorage::F32(v), DType::F16) => CpuStorage::F16(v.iter().map(|&x| f16::from_f32(x)).collect()),
            (CpuStorage::F32(v), DType::BF16) => CpuStorage::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
            (CpuStorage::F16(v), DType::F32) => CpuStorage::F32(v.iter().map(|x| x.to_f32()).collect()),
            (CpuStorage::BF16(v), DType::F32) => CpuStorage::F32(v.iter().map(|x| x.to_f32()).collect()),
            (CpuStorage::I64(v), DType::F32) => CpuStorage::F32(v.iter().map(|&x| x as f32).collect()),
            (CpuStorage::U8(v), DType::F32) => CpuStorage::F32(v.iter().map(|&x| x as f32).collect()),
            _ => {
                let f = self.to_f64_vec();
                match dtype {
                    DType::F32 => CpuStorage::F32(f.iter().map(|&x| x as f32).collect()),
                    DType::F64 => CpuStorage::F64(f),
                    DType::F16 => CpuStorage::F16(f.iter().map(|&x| crate::tensor::halfconv::f16_from_f64(x)).collect()),
                    DType::BF16 => CpuStorage::BF16(f.iter().map(|&x| crate::tensor::halfconv::bf16_from_f64(x)).collect()),
                    DType::I64 => CpuStorage::I64(f.iter().map(|&x| x as i64).collect()),
                    DType::U8 => CpuStorage::U8(f.iter().map(|&x| x as u8).collect()),
                }
            }
        }
    }
    /// The i64 elements, or a dtype error naming `op`.
    pub fn as_i64(&self, op: &'static str) -> Result<&[i64]> {
        match self {
            CpuStorage::I64(v) => Ok(v),
            o => Err(Error::DTypeMismatch { op, expected: DType::I64, got: o.dtype() }),
        }
    }
    /// The u8 elements, or a dtype error naming `op`.
    pub fn as_u8(&self, op: &'static str) -> Result<&[u8]> {
        match self {
            CpuStorage::U8(v) => Ok(v),
            o => Err(Error::DTypeMismatch { op, expected: DType::U8, got: o.dtype() }),
        }
    }
}

/// The error for a dtype a float kernel does not take.
pub fn unsupported(op: &'static str, dtype: DType) -> Error {
    Error::UnsupportedDType { op, dtype, supported: "f32, f64 (f16/bf16 compute runs on the GPU; convert with to_dtype on the CPU)" }
}

/// The element types the CPU kernels compute in.
pub trait Float: pool::Pooled + num_traits::Float + num_traits::FromPrimitive + Send + Sync + Default + std::fmt::Debug + std::iter::Sum + 'static {
    /// This type's dtype.
    const DTYPE: DType;
    /// Lossy conversion from f64.
    fn of(v: f64) -> Self;
    /// Widening to f64.
    fn f64(self) -> f64;
    /// The error function.
    fn erf(self) -> Self;
    /// `eˣ` in a form the compiler vectorises (f32: [`exp_f32`]; f64: `exp`).
    fn exp_v(self) -> Self;
    /// Wraps a vector as storage.
    fn store(v: Vec<Self>) -> CpuStorage;
}

impl Float for f32 {
    const DTYPE: DType = DType::F32;
    fn of(v: f64) -> Self {
        v as f32
    }
    fn f64(self) -> f64 {
        self as f64
    }
    fn erf(self) -> Self {
        libm::erff(self)
    }
    #[inline]
    fn exp_v(self) -> Self {
        exp_f32(self)
    }
    fn store(v: Vec<Self>) -> CpuStorage {
        CpuStorage::F32(v)
    }
}

impl Float for f64 {
    const DTYPE: DType = DType::F64;
    fn of(v: f64) -> Self {
        v
    }
    fn f64(self) -> f64 {
        self
    }
    fn erf(self) -> Self {
        libm::erf(self)
    }
    #[inline]
    fn exp_v(self) -> Self {
        self.exp()
    }
    fn store(v: Vec<Self>) -> CpuStorage {
        CpuStorage::F64(v)
    }
}

/// `eˣ` for f32 without a library call, so loops over it vectorise: x =
/// n·ln2 + r with n = round(x·log₂e) and r in [−ln2/2, ln2/2] (Cody–Waite:
/// ln2 split in a high part exact in n·ln2_hi for |n| ≤ 256 and a low part),
/// eʳ by its Taylor series to r⁷ (truncation under 1.2e-9 relative, below
/// f32's half ulp), and 2ⁿ built from exponent bits in two halves so that
/// results down to the subnormals are scaled without overflow. Within 2 ulp
/// of the correctly rounded value over the whole range; inf above 88.8, 0
/// below −104, NaN for NaN.
#[inline]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75; // 0x3f317200: 16 significant bits
    const LN2_LO: f32 = 1.428_606_8e-6; // ln 2 − LN2_HI
                                        // 1.5·2²³: adding and subtracting it rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(-104.0, 89.0);
    let n = (xc * LOG2E + ROUND) - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    let i = n as i32;
    let (i1, i2) = (i >> 1, i - (i >> 1));
    p * f32::from_bits(((i1 + 127) << 23) as u32) * f32::from_bits(((i2 + 127) << 23) as u32)
}

/// Element types a tensor can be built from and read back as.
pub trait WithDType: Copy + Send + Sync + 'static {
    /// This type's dtype.
    const DTYPE: DType;
    /// Wraps a vector as storage.
    fn into_storage(v: Vec<Self>) -> CpuStorage;
    /// The elements, if the storage is of this type.
    fn slice(s: &CpuStorage) -> Option<&[Self]>;
}

macro_rules! with_dtype {
    ($t:ty, $v:ident, $d:ident) => {
        impl WithDType for $t {
            const DTYPE: DType = DType::$d;
            fn into_storage(v: Vec<Self>) -> CpuStorage {
                CpuStorage::$v(v)
            }
            fn slice(s: &CpuStorage) -> Option<&[Self]> {
                match s {
                    CpuStorage::$v(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
with_dtype!(f32, F32, F32);
with_dtype!(f64, F64, F64);
with_dtype!(f16, F16, F16);
with_dtype!(bf16, BF16, BF16);
with_dtype!(i64, I64, I64);
with_dtype!(u8, U8, U8);

/// Runs `$body` with `$x` bound to the float slice of `$s` (f32 or f64).
/// `$body` must give the same type in both arms (use [`Float::store`]).
#[macro_export]
macro_rules! float_match {
    ($op:expr, $s:expr, |$x:ident| $body:expr) => {
        match $s {
            $crate::backend::cpu::CpuStorage::F32($x) => $body,
            $crate::backend::cpu::CpuStorage::F64($x) => $body,
            other => return Err($crate::backend::cpu::unsupported($op, other.dtype())),
        }
    };
    ($op:expr, ($s1:expr, $s2:expr), |$x:ident, $y:ident| $body:expr) => {
        match ($s1, $s2) {
            ($crate::backend::cpu::CpuStorage::F32($x), $crate::backend::cpu::CpuStorage::F32($y)) => $body,
            ($crate::backend::cpu::CpuStorage::F64($x), $crate::backend::cpu::CpuStorage::F64($y)) => $body,
            (a, b) if a.dtype() != b.dtype() => return Err($crate::error::Error::DTypeMismatch { op: $op, expected: a.dtype(), got: b.dtype() }),
            (a, _) => return Err($crate::backend::cpu::unsupported($op, a.dtype())),
        }
    };
    ($op:expr, ($s1:expr, $s2:expr, $s3:expr), |$x:ident, $y:ident, $z:ident| $body:expr) => {
        match ($s1, $s2, $s3) {
            ($crate::backend::cpu::CpuStorage::F32($x), $crate::backend::cpu::CpuStorage::F32($y), $crate::backend::cpu::CpuStorage::F32($z)) => $body,
            ($crate::backend::cpu::CpuStorage::F64($x), $crate::backend::cpu::CpuStorage::F64($y), $crate::backend::cpu::CpuStorage::F64($z)) => $body,
            (a, b, c) if a.dtype() != b.dtype() || a.dtype() != c.dtype() => {
                let got = if a.dtype() != b.dtype() { b.dtype() } else { c.dtype() };
                return Err($crate::error::Error::DTypeMismatch { op: $op, expected: a.dtype(), got });
            }
            (a, _, _) => return Err($crate::backend::cpu::unsupported($op, a.dtype())),
        }
    };
}

/// A loop for [`simd`]. Its `run` must be `#[inline(always)]`: only code
/// inlined into the dispatched function is compiled with its instruction
/// set (a closure body, called from each arm of the dispatch, is not).
pub trait SimdLoop {
    /// What the loop returns.
    type Output;
    /// The loop.
    fn run(self) -> Self::Output;
}

struct Dispatch<L>(L);

impl<L: SimdLoop> pulp::WithSimd for Dispatch<L> {
    type Output = L::Output;
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> L::Output {
        self.0.run()
    }
}

/// Runs `l` compiled for the widest vector instructions the CPU has
/// (AVX-512 or AVX2 + FMA on x86-64, detected at run time; the baseline
/// build targets SSE2 only), so an elementwise loop vectorises 16 or 8
/// lanes wide instead of 4. Results do not change: the loop performs the
/// same IEEE operations (Rust never contracts `a·b + c` into an FMA), only
/// more of them per instruction.
#[inline(always)]
pub fn simd<L: SimdLoop>(l: L) -> L::Output {
    pulp::Arch::new().dispatch(Dispatch(l))
}

/// `out[i] = f(x[i])` as a [`SimdLoop`].
pub struct Zip1<'a, T, U, F> {
    pub out: &'a mut [T],
    pub x: &'a [U],
    pub f: &'a F,
}

impl<T, U: Copy, F: Fn(U) -> T> SimdLoop for Zip1<'_, T, U, F> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        for (o, &a) in self.out.iter_mut().zip(self.x) {
            *o = (self.f)(a);
        }
    }
}

/// `out[i] = f(x[i], y[i])` as a [`SimdLoop`].
pub struct Zip2<'a, T, F> {
    pub out: &'a mut [T],
    pub x: &'a [T],
    pub y: &'a [T],
    pub f: &'a F,
}

impl<T: Copy, F: Fn(T, T) -> T> SimdLoop for Zip2<'_, T, F> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        for ((o, &a), &b) in self.out.iter_mut().zip(self.x).zip(self.y) {
            *o = (self.f)(a, b);
        }
    }
}

/// `out[i] = f(x[i], y[i], z[i])` as a [`SimdLoop`].
pub struct Zip3<'a, T, F> {
    pub out: &'a mut [T],
    pub x: &'a [T],
    pub y: &'a [T],
    pub z: &'a [T],
    pub f: &'a F,
}

impl<T: Copy, F: Fn(T, T, T) -> T> SimdLoop for Zip3<'_, T, F> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        for (((o, &a), &b), &c) in self.out.iter_mut().zip(self.x).zip(self.y).zip(self.z) {
            *o = (self.f)(a, b, c);
        }
    }
}

/// Fills `out` by calling `f(chunk_start, chunk)` over fixed-size chunks, in
/// parallel when `out` is large. Chunking never depends on the thread count.
pub fn par_chunks<T: Send>(out: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync + Send) {
    use rayon::prelude::*;
    let chunk = chunk.max(1);
    if out.len() >= PAR_THRESHOLD && out.len() > chunk {
        out.par_chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i * chunk, c));
    } else {
        for (i, c) in out.chunks_mut(chunk).enumerate() {
            f(i * chunk, c);
        }
    }
}

/// `par_chunks` over rows of `row_len`: `f(row_index, row)`, parallel when the
/// whole buffer is large.
pub fn par_rows<T: Send>(out: &mut [T], row_len: usize, f: impl Fn(usize, &mut [T]) + Sync + Send) {
    use rayon::prelude::*;
    if row_len == 0 {
        return;
    }
    if out.len() >= PAR_THRESHOLD {
        let rows_per = (PAR_THRESHOLD / 8 / row_len).max(1);
        out.par_chunks_mut(rows_per * row_len).enumerate().for_each(|(ci, c)| {
            for (ri, r) in c.chunks_mut(row_len).enumerate() {
                f(ci * rows_per + ri, r);
            }
        });
    } else {
        for (ri, r) in out.chunks_mut(row_len).enumerate() {
            f(ri, r);
        }
    }
}

/// Runs `$body` with `$x` bound to the elements of `$s` whatever its dtype;
/// `$body` gives a `Vec` of the same element type, wrapped back.
#[macro_export]
macro_rules! any_map {
    ($s:expr, |$x:ident| $body:expr) => {
        match $s {
            $crate::backend::cpu::CpuStorage::F32($x) => $crate::backend::cpu::CpuStorage::F32($body),
            $crate::backend::cpu::CpuStorage::F64($x) => $crate::backend::cpu::CpuStorage::F64($body),
            $crate::backend::cpu::CpuStorage::F16($x) => $crate::backend::cpu::CpuStorage::F16($body),
            $crate::backend::cpu::CpuStorage::BF16($x) => $crate::backend::cpu::CpuStorage::BF16($body),
            $crate::backend::cpu::CpuStorage::I64($x) => $crate::backend::cpu::CpuStorage::I64($body),
            $crate::backend::cpu::CpuStorage::U8($x) => $crate::backend::cpu::CpuStorage::U8($body),
        }
    };
}

/// The elements of `s` as the same float type as `like` (a dtype error otherwise).
pub fn slice_as<'a, T: Float + WithDType>(s: &'a CpuStorage, _like: &[T]) -> Result<&'a [T]> {
    T::slice(s).ok_or(Error::DTypeMismatch { op: "kernel", expected: <T as WithDType>::DTYPE, got: s.dtype() })
}

/// `n` zeros of the element type of `like` (anchors type inference in dispatch bodies).
pub fn zeros_as<T: Float>(_like: &[T], n: usize) -> Vec<T> {
    pool::zeroed(n)
}

/// `v` in the element type of `like`.
pub fn of_as<T: Float>(_like: &[T], v: f64) -> T {
    T::of(v)
}

/// An empty vector with room for `n` elements, or [`Error::HostOutOfMemory`]
/// naming `op` when the host refuses (instead of the allocator's abort).
pub fn try_with_capacity<T>(op: &'static str, n: usize) -> Result<Vec<T>> {
    let bytes = n.saturating_mul(std::mem::size_of::<T>());
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::HostOutOfMemory { op, bytes, gib: bytes as f64 / (1u64 << 30) as f64 })?;
    Ok(v)
}

/// `n` copies of `x`, allocated with [`try_with_capacity`].
pub fn try_filled<T: Clone>(op: &'static str, x: T, n: usize) -> Result<Vec<T>> {
    let mut v = try_with_capacity(op, n)?;
    v.resize(n, x);
    Ok(v)
}
