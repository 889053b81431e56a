// Force-included (g++ -include cuda/emu/emu.h) before every cuda/*.cu in the
// emulated build: CUDA's spellings, built-ins, synchronisation, warp
// intrinsics, atomics, vector types and math intrinsics, mapped onto the
// runtime in runtime.cpp. See cuda/README.md, "The emulator".
#pragma once
#define ASRFORGE_EMU 1

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

// ---- spellings -------------------------------------------------------------
#ifndef ASRFORGE_EMU_SCAN
#define __global__
#endif
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// One block runs on one OS thread, so thread_local memory is exactly the
// block's shared memory (static __shared__ at block scope is implicitly
// static; `extern __shared__` names a namespace-scope array that the
// generated module table defines).
#ifndef ASRFORGE_EMU_SCAN
#define __shared__ thread_local
#endif
#define __CUDA_ARCH__ 800
#define __CUDACC__ 1

// ---- vector types ------------------------------------------------------------
#define ASRFORGE_EMU_VEC2(name, T, al) \
    struct __attribute__((aligned(al))) name { T x, y; };
#define ASRFORGE_EMU_VEC3(name, T) \
    struct name { T x, y, z; };
#define ASRFORGE_EMU_VEC4(name, T, al) \
    struct __attribute__((aligned(al))) name { T x, y, z, w; };
#define ASRFORGE_EMU_VECS(base, T, a2, a4)                                                                     \
    struct base##1 { T x; };                                                                                    \
    ASRFORGE_EMU_VEC2(base##2, T, a2) ASRFORGE_EMU_VEC3(base##3, T) ASRFORGE_EMU_VEC4(base##4, T, a4)           \
    inline base##1 make_##base##1(T x) { return base##1{x}; }                                                   \
    inline base##2 make_##base##2(T x, T y) { return base##2{x, y}; }                                           \
    inline base##3 make_##base##3(T x, T y, T z) { return base##3{x, y, z}; }                                   \
    inline base##4 make_##base##4(T x, T y, T z, T w) { return base##4{x, y, z, w}; }
ASRFORGE_EMU_VECS(char, signed char, 2, 4)
ASRFORGE_EMU_VECS(uchar, unsigned char, 2, 4)
ASRFORGE_EMU_VECS(short, short, 4, 8)
ASRFORGE_EMU_VECS(ushort, unsigned short, 4, 8)
ASRFORGE_EMU_VECS(int, int, 8, 16)
ASRFORGE_EMU_VECS(uint, unsigned int, 8, 16)
ASRFORGE_EMU_VECS(long, long, 16, 16)
ASRFORGE_EMU_VECS(ulong, unsigned long, 16, 16)
ASRFORGE_EMU_VECS(longlong, long long, 16, 16)
ASRFORGE_EMU_VECS(ulonglong, unsigned long long, 16, 16)
ASRFORGE_EMU_VECS(float, float, 8, 16)
ASRFORGE_EMU_VECS(double, double, 16, 16)

struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

// ---- the runtime's side (runtime.cpp) ----------------------------------------
namespace asrforge_emu {
// Fiber stacks are kStackSize bytes, aligned to their size; a header in the
// first page of a stack region points at the running thread's context, so the
// built-ins are found from the stack pointer without any thread-local variable.
constexpr uintptr_t kStackSize = uintptr_t(1) << 18;
// Every `extern __shared__` array has room for the largest dynamic shared
// memory a GPU of this project offers (227 KiB on sm_90) plus a guard zone.
constexpr size_t kDynSharedCap = 227 * 1024;
constexpr size_t kDynGuard = 1024;
struct ThreadCtx {
    uint3 tid;
    uint3 bid;
    dim3 bdim;
    dim3 gdim;
};
// The base of the running fiber's stack region.
inline uintptr_t stack_region() {
    uintptr_t sp;
#if defined(__x86_64__)
    __asm__("mov %%rsp, %0" : "=r"(sp));
#elif defined(__aarch64__)
    __asm__("mov %0, sp" : "=r"(sp));
#else
    char probe;
    sp = (uintptr_t)&probe;
#endif
    return sp & ~(kStackSize - 1);
}
// The header of a stack region sits in its first page, at an offset that
// differs between regions so that headers do not all share one cache set.
inline uintptr_t stack_header(uintptr_t region) { return region + (((region / kStackSize) & 63) << 6); }
inline ThreadCtx* ctx() { return *reinterpret_cast<ThreadCtx**>(stack_header(stack_region())); }
enum BarrierKind { kBarPlain = 0, kBarCount = 1, kBarAnd = 2, kBarOr = 3 };
enum WarpOp { kWarpSync = 0, kShflIdx, kShflUp, kShflDown, kShflXor, kBallot, kAny, kAll };
// __syncthreads and friends: waits for every thread of the block.
int barrier(int kind, int pred, const char* file, int line);
// One warp-level rendezvous: every lane of `mask` calls it with the same op.
uint64_t warp(int op, unsigned mask, uint64_t value, int arg, int width);
// Lanes of this thread's warp that exist (a partial last warp has fewer).
unsigned warp_lanes();
// Stops the block with an error naming the kernel.
[[noreturn]] void trap(const char* what, const char* file, int line);
}  // namespace asrforge_emu

#define threadIdx (::asrforge_emu::ctx()->tid)
#define blockIdx (::asrforge_emu::ctx()->bid)
#define blockDim (::asrforge_emu::ctx()->bdim)
#define gridDim (::asrforge_emu::ctx()->gdim)
#define warpSize 32

// Macros, so that an error names the barrier's file and line.
#define __syncthreads() ((void)::asrforge_emu::barrier(::asrforge_emu::kBarPlain, 0, __FILE__, __LINE__))
#define __syncthreads_count(p) ::asrforge_emu::barrier(::asrforge_emu::kBarCount, (p) != 0, __FILE__, __LINE__)
#define __syncthreads_and(p) ::asrforge_emu::barrier(::asrforge_emu::kBarAnd, (p) != 0, __FILE__, __LINE__)
#define __syncthreads_or(p) ::asrforge_emu::barrier(::asrforge_emu::kBarOr, (p) != 0, __FILE__, __LINE__)
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::asrforge_emu::warp(::asrforge_emu::kWarpSync, mask, 0, 0, 32); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
[[noreturn]] inline void __trap() { ::asrforge_emu::trap("__trap()", __FILE__, __LINE__); }
inline void __brkpt() { ::asrforge_emu::trap("__brkpt()", __FILE__, __LINE__); }
inline unsigned __activemask() { return ::asrforge_emu::warp_lanes(); }
inline void __nanosleep(unsigned) {}
inline long long clock64() { return (long long)__builtin_ia32_rdtsc(); }

// ---- warp intrinsics -----------------------------------------------------------
namespace asrforge_emu {
template <typename T> inline T shfl(int op, unsigned mask, T v, int arg, int width) {
    static_assert(sizeof(T) <= 8, "warp shuffles move at most 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    bits = warp(op, mask, bits, arg, width);
    T r;
    memcpy(&r, &bits, sizeof(T));
    return r;
}
}  // namespace asrforge_emu
template <typename T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return ::asrforge_emu::shfl(::asrforge_emu::kShflIdx, mask, v, src, width);
}
template <typename T> inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return ::asrforge_emu::shfl(::asrforge_emu::kShflUp, mask, v, (int)delta, width);
}
template <typename T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return ::asrforge_emu::shfl(::asrforge_emu::kShflDown, mask, v, (int)delta, width);
}
template <typename T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return ::asrforge_emu::shfl(::asrforge_emu::kShflXor, mask, v, lane_mask, width);
}
inline unsigned __ballot_sync(unsigned mask, int p) { return (unsigned)::asrforge_emu::warp(::asrforge_emu::kBallot, mask, p != 0, 0, 32); }
inline int __any_sync(unsigned mask, int p) { return (int)::asrforge_emu::warp(::asrforge_emu::kAny, mask, p != 0, 0, 32); }
inline int __all_sync(unsigned mask, int p) { return (int)::asrforge_emu::warp(::asrforge_emu::kAll, mask, p != 0, 0, 32); }

// ---- atomics (real atomics: blocks run on several OS threads) -------------------
#define ASRFORGE_EMU_ATOMIC_INT(T)                                                                                    \
    inline T atomicAdd(T* a, T v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }                              \
    inline T atomicSub(T* a, T v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); }                              \
    inline T atomicAnd(T* a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_RELAXED); }                              \
    inline T atomicOr(T* a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_RELAXED); }                                \
    inline T atomicXor(T* a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_RELAXED); }                              \
    inline T atomicExch(T* a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_RELAXED); }                            \
    inline T atomicCAS(T* a, T cmp, T v) {                                                                            \
        __atomic_compare_exchange_n(a, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);                           \
        return cmp;                                                                                                   \
    }                                                                                                                 \
    inline T atomicMax(T* a, T v) {                                                                                   \
        T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                                                 \
        while (old < v && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {      \
        }                                                                                                             \
        return old;                                                                                                   \
    }                                                                                                                 \
    inline T atomicMin(T* a, T v) {                                                                                   \
        T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                                                 \
        while (old > v && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {      \
        }                                                                                                             \
        return old;                                                                                                   \
    }
ASRFORGE_EMU_ATOMIC_INT(int)
ASRFORGE_EMU_ATOMIC_INT(unsigned int)
ASRFORGE_EMU_ATOMIC_INT(unsigned long long)
ASRFORGE_EMU_ATOMIC_INT(long long)
#undef ASRFORGE_EMU_ATOMIC_INT
inline unsigned short atomicCAS(unsigned short* a, unsigned short cmp, unsigned short v) {
    __atomic_compare_exchange_n(a, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return cmp;
}
inline unsigned atomicInc(unsigned* a, unsigned lim) {
    unsigned old = __atomic_load_n(a, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(a, &old, old >= lim ? 0u : old + 1, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
inline unsigned atomicDec(unsigned* a, unsigned lim) {
    unsigned old = __atomic_load_n(a, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(a, &old, (old == 0 || old > lim) ? lim : old - 1, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
    return old;
}
namespace asrforge_emu {
// A floating-point read-modify-write as a compare-and-swap loop on its bits.
template <typename F, typename U, typename Op> inline F atomic_float(F* a, F v, Op op) {
    U* p = reinterpret_cast<U*>(a);
    U old = __atomic_load_n(p, __ATOMIC_RELAXED);
    for (;;) {
        F of;
        memcpy(&of, &old, sizeof(F));
        F nf = op(of, v);
        U nu;
        memcpy(&nu, &nf, sizeof(F));
        if (__atomic_compare_exchange_n(p, &old, nu, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return of;
    }
}
}  // namespace asrforge_emu
inline float atomicAdd(float* a, float v) {
    return ::asrforge_emu::atomic_float<float, uint32_t>(a, v, [](float x, float y) { return x + y; });
}
inline double atomicAdd(double* a, double v) {
    return ::asrforge_emu::atomic_float<double, uint64_t>(a, v, [](double x, double y) { return x + y; });
}
inline float atomicExch(float* a, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    u = __atomic_exchange_n(reinterpret_cast<uint32_t*>(a), u, __ATOMIC_RELAXED);
    memcpy(&v, &u, 4);
    return v;
}
// CUDA 12.8+ float max/min (NaN handling as fmaxf/fminf).
inline float atomicMax(float* a, float v) {
    return ::asrforge_emu::atomic_float<float, uint32_t>(a, v, [](float x, float y) { return fmaxf(x, y); });
}
inline float atomicMin(float* a, float v) {
    return ::asrforge_emu::atomic_float<float, uint32_t>(a, v, [](float x, float y) { return fminf(x, y); });
}

// ---- bits, reinterpretation, integer intrinsics -------------------------------------
inline int __float_as_int(float x) { int r; memcpy(&r, &x, 4); return r; }
inline unsigned __float_as_uint(float x) { unsigned r; memcpy(&r, &x, 4); return r; }
inline float __int_as_float(int x) { float r; memcpy(&r, &x, 4); return r; }
inline float __uint_as_float(unsigned x) { float r; memcpy(&r, &x, 4); return r; }
inline long long __double_as_longlong(double x) { long long r; memcpy(&r, &x, 8); return r; }
inline double __longlong_as_double(long long x) { double r; memcpy(&r, &x, 8); return r; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0F0F0F0Fu) | ((x & 0x0F0F0F0Fu) << 4);
    return __builtin_bswap32(x);
}
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline int __mul24(int a, int b) { return (int)((long long)(a << 8 >> 8) * (b << 8 >> 8)); }
inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xFFFFFFu) * (b & 0xFFFFFFu); }
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned s) {
    unsigned long long v = ((unsigned long long)hi << 32) | lo;
    return (unsigned)((v << (s & 31)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
    unsigned long long v = ((unsigned long long)hi << 32) | lo;
    return (unsigned)(v >> (s & 31));
}
template <typename T> inline T __ldg(const T* p) { return *p; }
template <typename T> inline T __ldcg(const T* p) { return *p; }
template <typename T> inline T __ldcs(const T* p) { return *p; }
template <typename T> inline void __stcg(T* p, T v) { *p = v; }
template <typename T> inline void __stcs(T* p, T v) { *p = v; }

// ---- math --------------------------------------------------------------------------
// g++ computes with the host's libm (correctly rounded or within an ulp or two of
// CUDA's functions) and never contracts a*b+c into an FMA (-ffp-contract=off):
// the _rn intrinsics are plain IEEE operations.
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
inline double rcbrt(double x) { return 1.0 / cbrt(x); }
inline float exp10f(float x) { return powf(10.0f, x); }
inline float normcdff(float x) { return 0.5f * erfcf(-x * 0.70710678118654752f); }
inline double normcdf(double x) { return 0.5 * erfc(-x * 0.70710678118654752440); }
inline void sincosf(float x, float* s, float* c) { *s = sinf(x); *c = cosf(x); }
inline float sinpif(float x) { return sinf(x * 3.14159265358979323846f); }
inline float cospif(float x) { return cosf(x * 3.14159265358979323846f); }
inline float __saturatef(float x) { return x != x ? 0.0f : x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return powf(10.0f, x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float* s, float* c) { *s = sinf(x); *c = cosf(x); }
inline float __tanhf(float x) { return tanhf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline double __drcp_rn(double x) { return 1.0 / x; }
inline float __frsqrt_rn(float x) { return (float)(1.0 / sqrt((double)x)); }
#define ASRFORGE_EMU_RN(F, T, sfx)                                                      \
    inline T __##F##add_##sfx(T a, T b) { return a + b; }                               \
    inline T __##F##sub_##sfx(T a, T b) { return a - b; }                               \
    inline T __##F##mul_##sfx(T a, T b) { return a * b; }                               \
    inline T __##F##div_##sfx(T a, T b) { return a / b; }
ASRFORGE_EMU_RN(f, float, rn)
ASRFORGE_EMU_RN(d, double, rn)
#undef ASRFORGE_EMU_RN
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline double __dsqrt_rn(double x) { return sqrt(x); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline int __float2int_rd(float x) { return (int)floorf(x); }
inline int __float2int_ru(float x) { return (int)ceilf(x); }
inline unsigned __float2uint_rn(float x) { return (unsigned)nearbyintf(x); }
inline long long __float2ll_rn(float x) { return (long long)nearbyintf(x); }
inline float __int2float_rn(int x) { return (float)x; }
inline float __uint2float_rn(unsigned x) { return (float)x; }
inline float __ll2float_rn(long long x) { return (float)x; }
inline float __double2float_rn(double x) { return (float)x; }
inline int __double2int_rn(double x) { return (int)nearbyint(x); }
inline double __int2double_rn(int x) { return (double)x; }
inline long long __double2ll_rn(double x) { return (long long)nearbyint(x); }
inline double __ll2double_rn(long long x) { return (double)x; }
