// Emulated cuda_bf16.h: __nv_bfloat16 is 16-bit bfloat16 storage with CUDA's
// conversions (round to nearest even, one rounding from double, NaN -> 0x7FFF).
#pragma once
#include "cuda_fp16.h"

namespace asrforge_emu {
inline float b2f(unsigned short x) { return bf16_to_f32(x); }
}  // namespace asrforge_emu
ASRFORGE_EMU_SMALL(__nv_bfloat16, __nv_bfloat16_raw, __nv_bfloat162, ::asrforge_emu::b2f, ::asrforge_emu::f32_to_bf16,
                   ::asrforge_emu::f64_to_bf16)
typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __double2bfloat16(double d) { return __nv_bfloat16(d); }
inline float __bfloat162float(__nv_bfloat16 h) { return (float)h; }
inline __nv_bfloat16 __int2bfloat16_rn(int v) { return __nv_bfloat16(v); }
inline int __bfloat162int_rz(__nv_bfloat16 h) { return (int)(float)h; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline short __bfloat16_as_short(__nv_bfloat16 h) { return (short)h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short x) { return __nv_bfloat16(__nv_bfloat16_raw{x}); }
inline __nv_bfloat16 __short_as_bfloat16(short x) { return __nv_bfloat16(__nv_bfloat16_raw{(unsigned short)x}); }
inline __nv_bfloat162 __float2bfloat162_rn(float f) { return __nv_bfloat162(__nv_bfloat16(f), __nv_bfloat16(f)); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return __nv_bfloat162(__nv_bfloat16(a), __nv_bfloat16(b)); }
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162(a, b); }
inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 a) { return __nv_bfloat162(a, a); }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return float2{(float)h.x, (float)h.y}; }
inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return __nv_bfloat162(__nv_bfloat16(f.x), __nv_bfloat16(f.y)); }
inline float __low2float(__nv_bfloat162 h) { return (float)h.x; }
inline float __high2float(__nv_bfloat162 h) { return (float)h.y; }
inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 h) { return h.x; }
inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 h) { return h.y; }
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* a, __nv_bfloat16 v) {
    unsigned short* p = reinterpret_cast<unsigned short*>(a);
    unsigned short old = __atomic_load_n(p, __ATOMIC_RELAXED);
    for (;;) {
        const unsigned short nu = (__ushort_as_bfloat16(old) + v).__x;
        if (__atomic_compare_exchange_n(p, &old, nu, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return __ushort_as_bfloat16(old);
    }
}
inline __nv_bfloat162 make_bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162(a, b); }
