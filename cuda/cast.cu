// Casts between dtypes: y[i] = (To) x[i], elementwise over contiguous
// buffers of n elements. Floats convert through f32 (f64 through f64) with
// round-to-nearest-even into f16/bf16, as the CPU's `half` crate does;
// float -> i64/u8 truncates toward zero (PyTorch's `.to()`), with NaN -> 0
// and out-of-range values saturating (as the CPU's Rust `as` casts).
#include "common.cuh"

template <typename T> __device__ __forceinline__ double load_f64(T x) { return (double)to_acc(x); }
__device__ __forceinline__ double load_f64(i64 x) { return (double)x; }
__device__ __forceinline__ double load_f64(uint8_t x) { return (double)x; }

template <typename To> __device__ __forceinline__ To store_f64(double v);
template <> __device__ __forceinline__ float store_f64<float>(double v) { return (float)v; }
template <> __device__ __forceinline__ double store_f64<double>(double v) { return v; }
template <> __device__ __forceinline__ f16 store_f64<f16>(double v) { return __double2half(v); }
template <> __device__ __forceinline__ bf16 store_f64<bf16>(double v) { return __double2bfloat16(v); }
template <> __device__ __forceinline__ i64 store_f64<i64>(double v) { return (i64)v; }
template <> __device__ __forceinline__ uint8_t store_f64<uint8_t>(double v) {
    // Saturating, NaN -> 0, as Rust's `as u8` on the CPU.
    return v != v ? 0 : v <= 0.0 ? 0 : v >= 255.0 ? 255 : (uint8_t)v;
}

// Through f64 so f64 -> f16 rounds once (not twice via f32) and i64 stays exact
// up to 2^53.
template <typename From, typename To>
__device__ void cast(const From* x, To* y, i64 n) {
    GRID_LOOP(i, n) { y[i] = store_f64<To>(load_f64(x[i])); }
}

#define CAST(fname, From, tname, To) \
    extern "C" __global__ void cast_##fname##_##tname(const From* x, To* y, i64 n) { cast<From, To>(x, y, n); }

#define CAST_FROM(fname, From)        \
    CAST(fname, From, f32, float)     \
    CAST(fname, From, f64, double)    \
    CAST(fname, From, f16, f16)       \
    CAST(fname, From, bf16, bf16)     \
    CAST(fname, From, i64, i64)       \
    CAST(fname, From, u8, uint8_t)

CAST_FROM(f32, float)
CAST_FROM(f64, double)
CAST_FROM(f16, f16)
CAST_FROM(bf16, bf16)
CAST_FROM(i64, i64)
CAST_FROM(u8, uint8_t)
