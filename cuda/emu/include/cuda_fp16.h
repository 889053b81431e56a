// Emulated cuda_fp16.h: __half is 16-bit IEEE binary16 storage with CUDA's
// conversions (round to nearest even, one rounding from double, NaN -> 0x7FFF).
#pragma once
#include "emu_small.h"

namespace asrforge_emu {
inline float h2f(unsigned short x) { return f16_to_f32(x); }
}  // namespace asrforge_emu
ASRFORGE_EMU_SMALL(__half, __half_raw, __half2, ::asrforge_emu::h2f, ::asrforge_emu::f32_to_f16, ::asrforge_emu::f64_to_f16)
typedef __half half;
typedef __half2 half2;

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline __half __double2half(double d) { return __half(d); }
inline float __half2float(__half h) { return (float)h; }
inline __half __int2half_rn(int v) { return __half(v); }
inline __half __uint2half_rn(unsigned v) { return __half(v); }
inline __half __ll2half_rn(long long v) { return __half(v); }
inline __half __short2half_rn(short v) { return __half(v); }
inline int __half2int_rz(__half h) { return (int)(float)h; }
inline int __half2int_rn(__half h) { return (int)nearbyintf((float)h); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline short __half_as_short(__half h) { return (short)h.__x; }
inline __half __ushort_as_half(unsigned short x) { return __half(__half_raw{x}); }
inline __half __short_as_half(short x) { return __half(__half_raw{(unsigned short)x}); }
inline __half2 __float2half2_rn(float f) { return __half2(__half(f), __half(f)); }
inline __half2 __floats2half2_rn(float a, float b) { return __half2(__half(a), __half(b)); }
inline __half2 __halves2half2(__half a, __half b) { return __half2(a, b); }
inline __half2 __half2half2(__half a) { return __half2(a, a); }
inline float2 __half22float2(__half2 h) { return float2{(float)h.x, (float)h.y}; }
inline __half2 __float22half2_rn(float2 f) { return __half2(__half(f.x), __half(f.y)); }
inline float __low2float(__half2 h) { return (float)h.x; }
inline float __high2float(__half2 h) { return (float)h.y; }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline __half2 __lowhigh2highlow(__half2 h) { return __half2(h.y, h.x); }
inline __half atomicAdd(__half* a, __half v) {
    unsigned short* p = reinterpret_cast<unsigned short*>(a);
    unsigned short old = __atomic_load_n(p, __ATOMIC_RELAXED);
    for (;;) {
        const unsigned short nu = (__ushort_as_half(old) + v).__x;
        if (__atomic_compare_exchange_n(p, &old, nu, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return __ushort_as_half(old);
    }
}
inline __half2 make_half2(__half a, __half b) { return __half2(a, b); }
