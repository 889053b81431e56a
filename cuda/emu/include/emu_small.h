// The body shared by the emulated __half and __nv_bfloat16: 16-bit storage,
// conversions from every arithmetic type with one rounding, an implicit
// conversion to float, and CUDA's operators (computed in float and rounded
// once: float holds every sum, difference, product and quotient of two 16-bit
// values to better than half an ulp of the 16-bit result, so these are
// correctly rounded, as the hardware's are).
#pragma once
#include "emu_fp.h"

#define ASRFORGE_EMU_SMALL(T, RAW, T2, TOF, FROMF, FROMD)                                                          \
    struct RAW {                                                                                                   \
        unsigned short x;                                                                                          \
    };                                                                                                             \
    struct __attribute__((aligned(2))) T {                                                                         \
        unsigned short __x;                                                                                        \
        T() = default;                                                                                             \
        constexpr T(const RAW& r) : __x(r.x) {}                                                                    \
        T(float f) : __x(FROMF(f)) {}                                                                              \
        T(double d) : __x(FROMD(d)) {}                                                                             \
        T(int v) : __x(FROMD((double)v)) {}                                                                        \
        T(unsigned v) : __x(FROMD((double)v)) {}                                                                   \
        T(short v) : __x(FROMD((double)v)) {}                                                                      \
        T(unsigned short v) : __x(FROMD((double)v)) {}                                                             \
        T(long v) : __x(FROMD((double)v)) {}                                                                       \
        T(unsigned long v) : __x(FROMD((double)v)) {}                                                              \
        T(long long v) : __x(FROMD((double)v)) {}                                                                  \
        T(unsigned long long v) : __x(FROMD((double)v)) {}                                                         \
        T& operator=(const RAW& r) {                                                                               \
            __x = r.x;                                                                                             \
            return *this;                                                                                          \
        }                                                                                                          \
        operator RAW() const { return RAW{__x}; }                                                                  \
        operator float() const { return TOF(__x); }                                                                \
        explicit operator bool() const { return (__x & 0x7FFF) != 0; }                                             \
    };                                                                                                             \
    struct __attribute__((aligned(4))) T2 {                                                                        \
        T x, y;                                                                                                    \
        T2() = default;                                                                                            \
        constexpr T2(T a, T b) : x(a), y(b) {}                                                                     \
    };                                                                                                             \
    inline T operator+(const T& a, const T& b) { return T((float)a + (float)b); }                                  \
    inline T operator-(const T& a, const T& b) { return T((float)a - (float)b); }                                  \
    inline T operator*(const T& a, const T& b) { return T((float)a * (float)b); }                                  \
    inline T operator/(const T& a, const T& b) { return T((float)a / (float)b); }                                  \
    inline T& operator+=(T& a, const T& b) { return a = a + b; }                                                   \
    inline T& operator-=(T& a, const T& b) { return a = a - b; }                                                   \
    inline T& operator*=(T& a, const T& b) { return a = a * b; }                                                   \
    inline T& operator/=(T& a, const T& b) { return a = a / b; }                                                   \
    inline T operator+(const T& a) { return a; }                                                                   \
    inline T operator-(const T& a) {                                                                               \
        T r;                                                                                                       \
        r.__x = (unsigned short)(a.__x ^ 0x8000);                                                                  \
        return r;                                                                                                  \
    }                                                                                                              \
    inline T& operator++(T& a) { return a = a + T(1.0f); }                                                         \
    inline T& operator--(T& a) { return a = a - T(1.0f); }                                                         \
    inline T operator++(T& a, int) {                                                                               \
        T o = a;                                                                                                   \
        ++a;                                                                                                       \
        return o;                                                                                                  \
    }                                                                                                              \
    inline T operator--(T& a, int) {                                                                               \
        T o = a;                                                                                                   \
        --a;                                                                                                       \
        return o;                                                                                                  \
    }                                                                                                              \
    inline bool operator==(const T& a, const T& b) { return (float)a == (float)b; }                                \
    inline bool operator!=(const T& a, const T& b) { return (float)a != (float)b; }                                \
    inline bool operator<(const T& a, const T& b) { return (float)a < (float)b; }                                  \
    inline bool operator>(const T& a, const T& b) { return (float)a > (float)b; }                                  \
    inline bool operator<=(const T& a, const T& b) { return (float)a <= (float)b; }                                \
    inline bool operator>=(const T& a, const T& b) { return (float)a >= (float)b; }                                \
    inline T2 operator+(const T2& a, const T2& b) { return T2(a.x + b.x, a.y + b.y); }                             \
    inline T2 operator-(const T2& a, const T2& b) { return T2(a.x - b.x, a.y - b.y); }                             \
    inline T2 operator*(const T2& a, const T2& b) { return T2(a.x * b.x, a.y * b.y); }                             \
    inline T2 operator/(const T2& a, const T2& b) { return T2(a.x / b.x, a.y / b.y); }                             \
    inline T2& operator+=(T2& a, const T2& b) { return a = a + b; }                                                \
    inline T2& operator*=(T2& a, const T2& b) { return a = a * b; }                                                \
    inline T2 operator-(const T2& a) { return T2(-a.x, -a.y); }                                                    \
    inline T __hadd(T a, T b) { return a + b; }                                                                    \
    inline T __hsub(T a, T b) { return a - b; }                                                                    \
    inline T __hmul(T a, T b) { return a * b; }                                                                    \
    inline T __hdiv(T a, T b) { return a / b; }                                                                    \
    inline T __hadd_rn(T a, T b) { return a + b; }                                                                 \
    inline T __hsub_rn(T a, T b) { return a - b; }                                                                 \
    inline T __hmul_rn(T a, T b) { return a * b; }                                                                 \
    inline T __hneg(T a) { return -a; }                                                                            \
    inline T __habs(T a) {                                                                                         \
        T r;                                                                                                       \
        r.__x = (unsigned short)(a.__x & 0x7FFF);                                                                  \
        return r;                                                                                                  \
    }                                                                                                              \
    /* fused: the exact product plus c, rounded to double, then once to 16 bits */                                \
    inline T __hfma(T a, T b, T c) { return T((double)(float)a * (double)(float)b + (double)(float)c); }           \
    inline bool __hisnan(T a) { return (float)a != (float)a; }                                                   \
    inline int __hisinf(T a) { return isinf((float)a) ? ((float)a > 0 ? 1 : -1) : 0; }                             \
    inline T __hmax(T a, T b) { return T(fmaxf((float)a, (float)b)); }                                             \
    inline T __hmin(T a, T b) { return T(fminf((float)a, (float)b)); }                                             \
    inline T __hmax_nan(T a, T b) { return __hisnan(a) ? a : __hisnan(b) ? b : __hmax(a, b); }                      \
    inline T __hmin_nan(T a, T b) { return __hisnan(a) ? a : __hisnan(b) ? b : __hmin(a, b); }                      \
    inline bool __heq(T a, T b) { return a == b; }                                                                 \
    inline bool __hne(T a, T b) { return !__hisnan(a) && !__hisnan(b) && a != b; }                                 \
    inline bool __hlt(T a, T b) { return a < b; }                                                                  \
    inline bool __hle(T a, T b) { return a <= b; }                                                                 \
    inline bool __hgt(T a, T b) { return a > b; }                                                                  \
    inline bool __hge(T a, T b) { return a >= b; }                                                                 \
    inline bool __hequ(T a, T b) { return !(a < b) && !(a > b); }                                                  \
    inline bool __hneu(T a, T b) { return a != b; }                                                                \
    inline T2 __hadd2(T2 a, T2 b) { return a + b; }                                                                \
    inline T2 __hsub2(T2 a, T2 b) { return a - b; }                                                                \
    inline T2 __hmul2(T2 a, T2 b) { return a * b; }                                                                \
    inline T2 __h2div(T2 a, T2 b) { return a / b; }                                                                \
    inline T2 __hfma2(T2 a, T2 b, T2 c) { return T2(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)); }              \
    inline T2 __hneg2(T2 a) { return -a; }                                                                         \
    inline T2 __habs2(T2 a) { return T2(__habs(a.x), __habs(a.y)); }                                               \
    inline T2 __hmax2(T2 a, T2 b) { return T2(__hmax(a.x, b.x), __hmax(a.y, b.y)); }                               \
    inline T2 __hmin2(T2 a, T2 b) { return T2(__hmin(a.x, b.x), __hmin(a.y, b.y)); }                               \
    inline T hexp(T a) { return T(expf((float)a)); }                                                               \
    inline T hlog(T a) { return T(logf((float)a)); }                                                               \
    inline T hsqrt(T a) { return T(sqrtf((float)a)); }                                                             \
    inline T hrsqrt(T a) { return T(1.0f / sqrtf((float)a)); }                                                     \
    inline T hrcp(T a) { return T(1.0f / (float)a); }                                                              \
    inline T htanh(T a) { return T(tanhf((float)a)); }                                                             \
    inline T hfloor(T a) { return T(floorf((float)a)); }                                                           \
    inline T hceil(T a) { return T(ceilf((float)a)); }                                                             \
    inline T htrunc(T a) { return T(truncf((float)a)); }                                                           \
    inline T hrint(T a) { return T(nearbyintf((float)a)); }
