// Helpers shared by the nn kernel families (softmax, norm, conv, index,
// layout, dropout), on top of common.cuh: the storage type -> compute type
// mapping as one trait, an unsigned grid-stride loop, a block reduction
// with any operator (sum and max) and fill values passed as raw bits.
//
// Compute types: f32, f16 and bf16 compute in f32; f64 computes in f64, so
// the f64 CPU gradient tests stay meaningful on the GPU.
//
// Block reductions (common.cuh's block_reduce: warp shuffles and one
// shared exchange) assume blockDim.x is a power of two no larger than
// NN_BLOCK (the Rust side launches NN_BLOCK threads). Their order is fixed
// for a fixed block size, so a reduction gives the same bits every run.
#pragma once

#include "common.cuh"

#define NN_BLOCK 256

// Storage type T, accumulation type Num<T>::acc (common.cuh's acc_t), and
// the conversions (to_acc / from_acc of common.cuh, plus one from f64 for
// values the host computed in f64, rounded once to the dtype as on the CPU).
template <typename T> struct Num {
    typedef acc_t<T> acc;
    __device__ __forceinline__ static acc to(T v) { return to_acc(v); }
    __device__ __forceinline__ static T from(acc v) { return from_acc<T>(v); }
    __device__ __forceinline__ static T from_f64(double v);
};
template <> __device__ __forceinline__ float Num<float>::from_f64(double v) { return (float)v; }
template <> __device__ __forceinline__ double Num<double>::from_f64(double v) { return v; }
template <> __device__ __forceinline__ __half Num<__half>::from_f64(double v) { return __double2half(v); }
template <> __device__ __forceinline__ __nv_bfloat16 Num<__nv_bfloat16>::from_f64(double v) { return __double2bfloat16(v); }

__device__ __forceinline__ float nn_exp(float v) { return expf(v); }
__device__ __forceinline__ double nn_exp(double v) { return exp(v); }
__device__ __forceinline__ float nn_log(float v) { return logf(v); }
__device__ __forceinline__ double nn_log(double v) { return log(v); }
__device__ __forceinline__ float nn_sqrt(float v) { return sqrtf(v); }
__device__ __forceinline__ double nn_sqrt(double v) { return sqrt(v); }

// for (size_t i = first; i < n; i += stride) over the whole 1-D grid, with
// 64-bit indices so tensors above 2^32 elements are covered.
#define NN_GRID_STRIDE(i, n)                                                           \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)(n); \
         i += (size_t)blockDim.x * gridDim.x)

// Rows handled by this block, one at a time (grid-stride over rows).
#define NN_BLOCK_ROWS(r, rows) for (size_t r = blockIdx.x; r < (size_t)(rows); r += gridDim.x)

struct NnMax {
    // A NaN input may or may not win here, but it makes its row NaN either
    // way (through exp(x - max)), as on the CPU.
    template <typename A> __device__ __forceinline__ A operator()(A a, A b) const { return a > b ? a : b; }
};

// Block reductions: block_reduce(v, sh, SumOp() / NnMax()) from common.cuh;
// `sh` holds NN_BLOCK values.

// Reinterprets the low sizeof(T) bytes of `bits` as a T (the host packs a
// fill value already converted to the tensor's dtype).
template <typename T> __device__ __forceinline__ T nn_from_bits(uint64_t bits) {
    T v;
    memcpy(&v, &bits, sizeof(T));
    return v;
}

// Instantiates a float kernel template for f32, f64, f16 and bf16 under the
// names NAME_f32 ... NAME_bf16.
#define NN_FLOAT_DTYPES(X) X(f32, float) X(f64, double) X(f16, __half) X(bf16, __nv_bfloat16)
#define NN_F32_F64(X) X(f32, float) X(f64, double)
// Every storage dtype as a raw element of its size (for pure copies).
#define NN_ALL_DTYPES(X) \
    X(f32, float) X(f64, double) X(f16, uint16_t) X(bf16, uint16_t) X(i64, long long) X(u8, uint8_t)
