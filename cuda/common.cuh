// Shared helpers for every kernel family.
//
// Storage types and compute types: every float kernel is a template over
// the storage type T and computes in `acc_t<T>` (f32 for f32/f16/bf16, f64
// for f64), converting with `to_acc` on load and `from_acc` on store.
// Indices are 64-bit (`i64`) so tensors above 2^31 elements are addressed
// correctly; 1-D launches are grid-stride loops, so the grid never needs
// more than the 65535*16 blocks the host asks for.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

typedef long long i64;
typedef unsigned long long u64;
typedef __half f16;
typedef __nv_bfloat16 bf16;

template <typename T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };
template <typename T> using acc_t = typename Acc<T>::type;

__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
__device__ __forceinline__ float to_acc(f16 x) { return __half2float(x); }
__device__ __forceinline__ float to_acc(bf16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_acc(acc_t<T> x);
template <> __device__ __forceinline__ float from_acc<float>(float x) { return x; }
template <> __device__ __forceinline__ double from_acc<double>(double x) { return x; }
template <> __device__ __forceinline__ f16 from_acc<f16>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ bf16 from_acc<bf16>(float x) { return __float2bfloat16_rn(x); }

// The global index of this thread and the stride of a 1-D grid-stride loop.
__device__ __forceinline__ i64 grid_start() { return (i64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ i64 grid_stride() { return (i64)gridDim.x * blockDim.x; }

#define GRID_LOOP(i, n) for (i64 i = grid_start(); i < (i64)(n); i += grid_stride())

// Broadcast layouts of up to MAX_DIMS dims, passed by value as 64-bit words
// (host: `Arg::Words`). `rank` output dims `out[d]`; operand strides `sa[d]`,
// `sb[d]` are 0 along a broadcast dim.
#define MAX_DIMS 8
struct Bcast {
    i64 rank;
    i64 out[MAX_DIMS];
    i64 sa[MAX_DIMS];
    i64 sb[MAX_DIMS];
};

// Offsets in a and b of output element `i` (row-major over `out`).
__device__ __forceinline__ void bcast_offsets(const Bcast& bc, i64 i, i64* oa, i64* ob) {
    i64 a = 0, b = 0;
    for (int d = (int)bc.rank - 1; d >= 0; --d) {
        i64 n = bc.out[d];
        i64 k = i % n;
        i /= n;
        a += k * bc.sa[d];
        b += k * bc.sb[d];
    }
    *oa = a;
    *ob = b;
}

// A strided view of up to MAX_DIMS dims, passed by value as 64-bit words
// (host: `nn_common::strided_words`), so a launch uploads no shape buffer and
// never waits for a copy: `rank` dims `dims[d]`, element strides `strides[d]`
// (0 along a broadcast dim).
struct Strided {
    i64 rank;
    i64 dims[MAX_DIMS];
    i64 strides[MAX_DIMS];
};

// Offset through `s` of element `e` of the row-major order over `s.dims`.
__device__ __forceinline__ size_t strided_offset(const Strided& s, size_t e) {
    size_t off = 0;
    for (int d = (int)s.rank - 1; d >= 0; --d) {
        const size_t dim = (size_t)s.dims[d];
        off += (e % dim) * (size_t)s.strides[d];
        e /= dim;
    }
    return off;
}

// Block-wide reduction of one value per thread through `smem` (blockDim.x
// slots of A, blockDim.x a power of two) with the binary functor `op`.
// Fixed tree order: deterministic. Every thread of the block must call it;
// the result is valid in every thread, and it ends with a barrier so `smem`
// can be reused by the caller's next call.
template <typename A, typename Op>
__device__ __forceinline__ A block_reduce(A v, A* smem, Op op) {
    smem[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) smem[threadIdx.x] = op(smem[threadIdx.x], smem[threadIdx.x + s]);
        __syncthreads();
    }
    A r = smem[0];
    __syncthreads();
    return r;
}

struct SumOp {
    template <typename A> __device__ __forceinline__ A operator()(A a, A b) const { return a + b; }
};

// Block-wide sum (see block_reduce).
template <typename A>
__device__ A block_sum(A v, A* smem) {
    return block_reduce(v, smem, SumOp());
}
