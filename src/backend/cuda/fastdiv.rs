//! 32-bit index math for the copy and broadcast kernels: division by a
//! divisor known at launch as a multiply-high, an add and a shift, with the
//! multiplier and shift computed once on the host (Granlund and Montgomery,
//! "Division by invariant integers using multiplication", PLDI 1994, §4).
//! The kernels' side is `FastDiv` in `cuda/common.cuh`; shapes travel by
//! value as 64-bit words (`&[u64; N]`), two u32 fields a word.
//!
//! For a divisor d in [1, 2^31], s = ⌈log2 d⌉ and m = ⌊2^32·(2^s − d)/d⌋ + 1;
//! then for every n < 2^31, ⌊n/d⌋ = (mulhi(n, m) + n) >> s (the sum stays
//! below 2^32 because mulhi(n, m) < n). The u32 kernels are used only when
//! every index of the launch is below 2^31 ([`fits_u32`]).

use crate::error::{Error, Result};

/// The largest element count (exclusive) the u32 kernels address.
pub const U32_LIMIT: usize = 1 << 31;

/// Whether launches over these buffer lengths can use the u32 kernels.
pub fn fits_u32(lens: &[usize]) -> bool {
    lens.iter().all(|&n| n < U32_LIMIT)
}

/// A divisor with its multiplier and shift: `FastDiv` of `cuda/common.cuh`
/// (d, m, s and a pad word, 16 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastDiv {
    /// The divisor.
    pub d: u32,
    /// The magic multiplier.
    pub m: u32,
    /// The shift.
    pub s: u32,
}

impl FastDiv {
    /// The multiplier and shift for `d` (1 ≤ d ≤ 2^31; else an error naming `op`).
    pub fn new(op: &'static str, d: usize) -> Result<FastDiv> {
        if d == 0 || d > U32_LIMIT {
            return Err(Error::invalid(op, format!("a 32-bit divisor must be in 1..=2^31, found {d}")));
        }
        let s = usize::BITS - (d - 1).leading_zeros();
        let m = (((1u64 << 32) * ((1u64 << s) - d as u64)) / d as u64 + 1) as u32;
        Ok(FastDiv { d: d as u32, m, s })
    }
    /// ⌊n/d⌋ as the kernels compute it (n < 2^31).
    pub fn div(&self, n: u32) -> u32 {
        let hi = ((n as u64 * self.m as u64) >> 32) as u32;
        (hi + n) >> self.s
    }
    /// The struct's four u32 fields.
    fn fields(&self) -> [u32; 4] {
        [self.d, self.m, self.s, 0]
    }
}

/// u32 fields packed two per 64-bit word, low field first (the byte layout
/// of a C struct of u32 fields on a little-endian GPU or host).
pub fn pack_u32(fields: &[u32]) -> Vec<u64> {
    fields.chunks(2).map(|c| c[0] as u64 | (c.get(1).copied().unwrap_or(0) as u64) << 32).collect()
}

/// One `FastDiv` by value (2 words).
pub fn fast_div_words(op: &'static str, d: usize) -> Result<[u64; 2]> {
    let w = pack_u32(&FastDiv::new(op, d)?.fields());
    Ok([w[0], w[1]])
}

/// Dims of the 32-bit shape structs (as `MAX_DIMS` in `cuda/common.cuh`).
pub const MAX_DIMS: usize = 8;

/// Merges the dims of a row-major walk over `dims` that need no division of
/// their own: size-1 dims go, and dim d joins dim d + 1 when every operand's
/// stride satisfies `stride[d] == stride[d + 1] * dims[d + 1]`. The offsets
/// of every element are unchanged; the kernels divide once per kept dim.
pub fn coalesce(dims: &[usize], strides: &[&[usize]]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut od: Vec<usize> = Vec::new();
    let mut os: Vec<Vec<usize>> = vec![Vec::new(); strides.len()];
    for d in 0..dims.len() {
        if dims[d] == 1 {
            continue;
        }
        let merge = !od.is_empty() && {
            let k = od.len() - 1;
            strides.iter().zip(&os).all(|(s, o)| o[k] == s[d] * dims[d])
        };
        if merge {
            let k = od.len() - 1;
            od[k] *= dims[d];
            for (o, s) in os.iter_mut().zip(strides) {
                o[k] = s[d];
            }
        } else {
            od.push(dims[d]);
            for (o, s) in os.iter_mut().zip(strides) {
                o.push(s[d]);
            }
        }
    }
    (od, os)
}

/// A 32-bit strided walk: `rank`, a pad field, `FastDiv dims[8]`, then
/// `u32 strides[8]` per operand (`Strided32` of `cuda/common.cuh` for one
/// operand, `Bcast32` for two), after [`coalesce`]. Every dim and stride
/// must fit (the caller checked [`fits_u32`] on the buffers). `N`: the
/// struct's words (21 for `Strided32`, 25 for `Bcast32`), as the typed launch
/// function takes them; a count that does not match `strides` is an error.
pub fn strided32_words<const N: usize>(op: &'static str, dims: &[usize], strides: &[&[usize]]) -> Result<[u64; N]> {
    let (dims, strides) = coalesce(dims, strides);
    let r = dims.len();
    if r > MAX_DIMS {
        return Err(Error::invalid(op, format!("expected at most {MAX_DIMS} dims after merging (the CUDA kernel's limit), found {r}")));
    }
    let mut f = vec![r as u32, 0];
    for d in 0..MAX_DIMS {
        f.extend_from_slice(&if d < r { FastDiv::new(op, dims[d])?.fields() } else { [1, 1, 0, 0] });
    }
    for s in &strides {
        for d in 0..MAX_DIMS {
            let v = s.get(d).copied().unwrap_or(0);
            f.push(u32::try_from(v).map_err(|_| Error::invalid(op, format!("a stride of {v} does not fit the 32-bit kernel")))?);
        }
    }
    let words = pack_u32(&f);
    let got = words.len();
    words.try_into().map_err(|_| Error::invalid(op, format!("expected a 32-bit shape struct of {N} words, {} operand(s) make {got}", strides.len())))
}

/// Which kernels a copy or broadcast launch takes: `Auto` the u32 kernels
/// whenever every index fits ([`fits_u32`]), `Wide` always the 64-bit ones
/// (tests and benches compare the two).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexWidth {
    /// u32 where the lengths allow, else 64-bit.
    Auto,
    /// 64-bit indices whatever the size.
    Wide,
}

impl IndexWidth {
    /// Whether a launch over buffers of `lens` elements takes the u32 kernels.
    pub fn use_u32(self, lens: &[usize]) -> bool {
        self == IndexWidth::Auto && fits_u32(lens)
    }
}
