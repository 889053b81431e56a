//! Correctly rounded f64 → f16 / bf16: one rounding, to nearest, ties to
//! even, as CUDA's `__double2half` / `__double2bfloat16` do.
//!
//! `half`'s `from_f64` rounds twice: with the x86 F16C instruction it goes
//! through f32 (`f as f32`, then f32 → f16), and without it, and always for
//! bf16, it drops the low 32 bits of the f64 mantissa before rounding, so a
//! value just above a half-way point is taken for the tie and rounded to
//! even. (1 + 2⁻¹¹ + 2⁻⁴⁰ must round up to the f16 after 1; both paths give
//! 1.) Here the rounding sees every bit, in exact integer arithmetic.

use half::{bf16, f16};

/// The layout of a small binary float: mantissa bits (without the hidden
/// one), exponent bias, and the all-ones exponent field.
struct Format {
    man_bits: u32,
    bias: i32,
    exp_max: u32,
}

const F16: Format = Format { man_bits: 10, bias: 15, exp_max: 0x1f };
const BF16: Format = Format { man_bits: 7, bias: 127, exp_max: 0xff };

/// `m · 2⁻ˢ` rounded to the nearest integer, ties to even.
fn shift_round(m: u64, s: u32) -> u64 {
    if s == 0 {
        return m;
    }
    if s > 63 {
        // m < 2⁵³ < 2⁶³ ≤ 2^(s−1): below one half.
        return 0;
    }
    let q = m >> s;
    let rem = m & ((1u64 << s) - 1);
    let half = 1u64 << (s - 1);
    if rem > half || (rem == half && q & 1 == 1) {
        q + 1
    } else {
        q
    }
}

/// The bits of finite `v`'s magnitude rounded once to `fmt` (inf on overflow).
fn round_bits(v: f64, fmt: &Format) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 63) as u16) << 15;
    let e = ((bits >> 52) & 0x7ff) as i32;
    let frac = bits & ((1u64 << 52) - 1);
    if e == 0 && frac == 0 {
        return sign;
    }
    // |v| = m · 2^exp exactly, m an integer below 2⁵³.
    let (m, exp) = if e == 0 { (frac, -1074) } else { (frac | (1u64 << 52), e - 1075) };
    // The exponent of v's leading bit, and the target's quantum there
    // (subnormals share the quantum of the smallest normal binade).
    let lead = exp + 63 - m.leading_zeros() as i32;
    let emin = 1 - fmt.bias;
    let quantum = lead.max(emin) - fmt.man_bits as i32;
    // The significand in units of the quantum: a left shift (exact) when v
    // has no more significant bits than the target, else one rounding.
    let mut r = if exp >= quantum { m << (exp - quantum) as u32 } else { shift_round(m, (quantum - exp) as u32) };
    let mut q = quantum;
    // Rounding up may carry into a new binade: 2^(man_bits+1) → 2^man_bits.
    if r >> (fmt.man_bits + 1) != 0 {
        r >>= 1;
        q += 1;
    }
    if r < (1u64 << fmt.man_bits) {
        // Subnormal (or zero after rounding): exponent field 0.
        return sign | r as u16;
    }
    let field = q + fmt.man_bits as i32 + fmt.bias;
    if field >= fmt.exp_max as i32 {
        return sign | ((fmt.exp_max as u16) << fmt.man_bits);
    }
    sign | ((field as u16) << fmt.man_bits) | (r as u16 & ((1u16 << fmt.man_bits) - 1))
}

/// `v` rounded once to the nearest f16 (ties to even; ±inf past the range).
pub fn f16_from_f64(v: f64) -> f16 {
    if v.is_nan() || v.is_infinite() {
        // NaN and inf convert exactly; f32 keeps them.
        return f16::from_f32(v as f32);
    }
    f16::from_bits(round_bits(v, &F16))
}

/// `v` rounded once to the nearest bf16 (ties to even; ±inf past the range).
pub fn bf16_from_f64(v: f64) -> bf16 {
    if v.is_nan() || v.is_infinite() {
        return bf16::from_f32(v as f32);
    }
    bf16::from_bits(round_bits(v, &BF16))
}
