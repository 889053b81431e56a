// Conversions between IEEE double/float and the 16-bit formats (binary16 and
// bfloat16), shared by the emulated cuda_fp16.h and cuda_bf16.h: one rounding,
// to nearest even, straight from the source value; NaN becomes the canonical
// 0x7FFF, as CUDA's conversions return.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

namespace asrforge_emu {

// Rounds x once to a 16-bit format with `mant` fraction bits, exponent bias
// `bias` and smallest normal exponent emin = 1 - bias.
inline uint16_t to_small(double x, int mant, int bias) {
    const uint16_t sign = signbit(x) ? 0x8000 : 0;
    if (x != x) return 0x7FFF;
    const double a = fabs(x);
    const int emax = bias, emin = 1 - bias;
    // (2 - 2^-(mant+1)) * 2^emax: the midpoint between the largest finite value
    // (odd significand) and 2^(emax+1), which rounds to even: infinity.
    const double ovf = ldexp(2.0 - ldexp(1.0, -(mant + 1)), emax);
    const uint16_t inf = (uint16_t)(((1u << (15 - mant)) - 1) << mant);
    if (a >= ovf) return sign | inf;
    if (a == 0.0) return sign;
    int e;
    frexp(a, &e);
    int E = e - 1;  // a in [2^E, 2^(E+1))
    if (E < emin) E = emin;  // subnormal: the quantum stays 2^(emin - mant)
    const double q = ldexp(a, mant - E);  // exact scaling
    const uint32_t r = (uint32_t)nearbyint(q);  // the one rounding (default mode: to nearest even)
    // Normal: ((E + bias) << mant) + r - 2^mant; subnormal (E == emin, r < 2^mant): r.
    // Both are r + ((E + bias - 1) << mant), and a carry into the next binade is exact.
    return (uint16_t)(sign | (r + ((uint32_t)(E + bias - 1) << mant)));
}

inline uint16_t f64_to_f16(double x) { return to_small(x, 10, 15); }
inline uint16_t f64_to_bf16(double x) { return to_small(x, 7, 127); }
// float -> binary16: exact through double, then one rounding.
inline uint16_t f32_to_f16(float x) { return to_small((double)x, 10, 15); }
inline uint16_t f32_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;
    u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even on the low 16 bits
    return (uint16_t)(u >> 16);
}
inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
    uint32_t u;
    if (e == 0x1F) {
        u = sign | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0u);
    } else if (e == 0) {
        float f = (float)m * 5.9604644775390625e-8f;  // m * 2^-24, exact
        return sign ? -f : f;
    } else {
        u = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline float bf16_to_f32(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

}  // namespace asrforge_emu
