//! The CPU reference's f64 → f16 / bf16 conversion rounds once, to nearest,
//! ties to even (as CUDA's `__double2half` / `__double2bfloat16`): checked
//! at hand-computed points where rounding through f32, or dropping the low
//! 32 bits of the f64 mantissa, gives another answer, and at every half-way
//! point between two neighbouring codes of both types (the tie goes to the
//! even code, one f64 ulp either side goes to the nearer code).

use asrforge::backend::cpu::CpuStorage;
use asrforge::tensor::halfconv::{bf16_from_f64, f16_from_f64};
use asrforge::DType;
use half::{bf16, f16};

const P40: f64 = 1.0 / (1u64 << 40) as f64;

/// (value, expected f16 bits, why), each worked out by hand.
fn f16_cases() -> Vec<(f64, u16, &'static str)> {
    let u = 1.0 / 1024.0; // the f16 ulp at 1
    vec![
        (1.0 + u / 2.0, 0x3c00, "tie between 1 and 1+2^-10: to the even code 0x3c00"),
        (1.0 + u / 2.0 + P40, 0x3c01, "just above the tie: up (through f32 the 2^-40 is lost and it ties down)"),
        (1.0 + 1.5 * u - P40, 0x3c01, "just below the tie 0x3c01/0x3c02: down (through f32 it becomes the tie, then even 0x3c02)"),
        (1.0 + 1.5 * u, 0x3c02, "tie between 0x3c01 and 0x3c02: to the even code"),
        (1.0 + u / 2.0 + 1.0 / (1u64 << 30) as f64, 0x3c01, "above the tie by 2^-30 (below f32's ulp 2^-23 at 1)"),
        (2f64.powi(-25), 0x0000, "half the smallest subnormal: a tie, to zero (even)"),
        (2f64.powi(-25) + 2f64.powi(-60), 0x0001, "just above it: the smallest subnormal (through f32: zero)"),
        (3.0 * 2f64.powi(-25), 0x0002, "1.5 subnormal ulps: a tie, to the even code 2"),
        (2f64.powi(-14) - 2f64.powi(-25), 0x0400, "half an ulp below the smallest normal: a tie to the even code, the normal 0x0400"),
        (65504.0, 0x7bff, "the largest finite f16"),
        (65520.0 - 2f64.powi(-30), 0x7bff, "just below the overflow tie: the largest finite"),
        (65520.0, 0x7c00, "the overflow tie: to the even side, infinity"),
        (-(1.0 + u / 2.0 + P40), 0xbc01, "negative values round by magnitude"),
        (-0.0, 0x8000, "negative zero keeps its sign"),
        (1e-30, 0x0000, "far below the subnormals: zero"),
        (1e10, 0x7c00, "far above the range: infinity"),
    ]
}

/// (value, expected bf16 bits, why), each worked out by hand.
fn bf16_cases() -> Vec<(f64, u16, &'static str)> {
    let u = 1.0 / 128.0; // the bf16 ulp at 1
    vec![
        (1.0 + u / 2.0, 0x3f80, "tie between 1 and 1+2^-7: to the even code"),
        (1.0 + u / 2.0 + P40, 0x3f81, "just above the tie: up (2^-40 lies in the 32 low mantissa bits half drops)"),
        (1.0 + 1.5 * u - P40, 0x3f81, "just below the tie 0x3f81/0x3f82: down (through f32 it becomes the tie, then even)"),
        (1.0 + 1.5 * u, 0x3f82, "tie between 0x3f81 and 0x3f82: to the even code"),
        (2f64.powi(-134), 0x0000, "half the smallest subnormal 2^-133: a tie, to zero"),
        (2f64.powi(-134) + 2f64.powi(-170), 0x0001, "just above it: the smallest subnormal"),
        (-(1.0 + u / 2.0 + P40), 0xbf81, "negative values round by magnitude"),
    ]
}

#[test]
fn hand_computed_points_round_once() {
    for (v, want, why) in f16_cases() {
        let got = f16_from_f64(v).to_bits();
        assert_eq!(got, want, "f16 of {v:e}: got {got:#06x}, want {want:#06x}: {why}");
    }
    for (v, want, why) in bf16_cases() {
        let got = bf16_from_f64(v).to_bits();
        assert_eq!(got, want, "bf16 of {v:e}: got {got:#06x}, want {want:#06x}: {why}");
    }
}

/// Every code up to `last` (the largest finite): the code itself, the
/// half-way point to the next code (the even one wins; past the largest
/// finite the next "code" is infinity), and one f64 ulp either side of it.
fn check_every_midpoint(name: &str, last: u16, value: &dyn Fn(u16) -> f64, convert: &dyn Fn(f64) -> u16) {
    for c in 0..=last {
        let a = value(c);
        // The next code's value; past the largest finite, the value the next
        // binade's first code would have (the overflow threshold's double).
        let b = if c == last { a + (a - value(c - 1)) } else { value(c + 1) };
        let mid = (a + b) / 2.0; // exact: a and b have few significant bits
        let even = if c % 2 == 0 { c } else { c + 1 };
        for (v, want, what) in [(a, c, "the code"), (mid, even, "the tie"), (mid.next_down(), c, "below the tie"), (mid.next_up(), c + 1, "above the tie")] {
            for (sv, sw) in [(v, want), (-v, want | 0x8000)] {
                let got = convert(sv);
                assert_eq!(got, sw, "{name} of {sv:e} ({what} after code {c:#06x}): got {got:#06x}, want {sw:#06x}");
            }
        }
    }
}

#[test]
fn every_half_way_point_rounds_to_even_and_its_neighbours_to_the_nearer() {
    check_every_midpoint("f16", 0x7bff, &|c| f16::from_bits(c).to_f64(), &|v| f16_from_f64(v).to_bits());
    check_every_midpoint("bf16", 0x7f7f, &|c| bf16::from_bits(c).to_f64(), &|v| bf16_from_f64(v).to_bits());
}

#[test]
fn the_cpu_casts_use_the_single_rounding() {
    let v: Vec<f64> = [f16_cases(), bf16_cases()].concat().into_iter().map(|c| c.0).collect();
    let s = CpuStorage::F64(v.clone());
    let CpuStorage::F16(h) = s.to_dtype(DType::F16) else { panic!("to_dtype(F16) must give f16") };
    let CpuStorage::BF16(b) = s.to_dtype(DType::BF16) else { panic!("to_dtype(BF16) must give bf16") };
    for (i, &x) in v.iter().enumerate() {
        assert_eq!(h[i].to_bits(), f16_from_f64(x).to_bits(), "f16 cast of {x:e}");
        assert_eq!(b[i].to_bits(), bf16_from_f64(x).to_bits(), "bf16 cast of {x:e}");
        let CpuStorage::F16(full) = CpuStorage::full(DType::F16, 1, x) else { panic!("full(F16)") };
        assert_eq!(full[0].to_bits(), f16_from_f64(x).to_bits(), "f16 fill of {x:e}");
    }
}

#[test]
fn nan_and_infinity_stay_what_they_are() {
    assert!(f16_from_f64(f64::NAN).is_nan() && bf16_from_f64(f64::NAN).is_nan());
    assert_eq!(f16_from_f64(f64::INFINITY).to_bits(), 0x7c00);
    assert_eq!(f16_from_f64(f64::NEG_INFINITY).to_bits(), 0xfc00);
    assert_eq!(bf16_from_f64(f64::INFINITY).to_bits(), 0x7f80);
    assert_eq!(bf16_from_f64(f64::NEG_INFINITY).to_bits(), 0xff80);
}
