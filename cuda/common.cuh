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

// 32-bit index math (host: src/backend/cuda/fastdiv.rs). When every index
// of a launch is below 2^31, the host picks the `_u32` kernels: indices are
// u32 and each division by a dim is a multiply-high, an add and a shift
// with a multiplier and shift computed once on the host (Granlund and
// Montgomery, "Division by invariant integers using multiplication"):
//   q = (umulhi(n, m) + n) >> s, exact for n < 2^31 and 1 <= d <= 2^31.
// The structs are made of u32 fields and travel by value as 64-bit words.
struct FastDiv {
    uint32_t d, m, s, pad_;
};
__device__ __forceinline__ uint32_t fast_div(const FastDiv& f, uint32_t n) { return (__umulhi(n, f.m) + n) >> f.s; }

// A strided walk of one operand (permute) or two (broadcast) in u32: `rank`
// dims (size-1 dims dropped and mergeable dims merged by the host), their
// divisors, and each operand's element strides (0 along a broadcast dim).
struct Strided32 {
    uint32_t rank, pad_;
    FastDiv dims[MAX_DIMS];
    uint32_t strides[MAX_DIMS];
};
struct Bcast32 {
    uint32_t rank, pad_;
    FastDiv out[MAX_DIMS];
    uint32_t sa[MAX_DIMS];
    uint32_t sb[MAX_DIMS];
};

__device__ __forceinline__ uint32_t strided32_offset(const Strided32& s, uint32_t e) {
    uint32_t off = 0;
    for (int d = (int)s.rank - 1; d >= 0; --d) {
        const uint32_t q = fast_div(s.dims[d], e);
        off += (e - q * s.dims[d].d) * s.strides[d];
        e = q;
    }
    return off;
}

__device__ __forceinline__ void bcast32_offsets(const Bcast32& bc, uint32_t i, uint32_t* oa, uint32_t* ob) {
    uint32_t a = 0, b = 0;
    for (int d = (int)bc.rank - 1; d >= 0; --d) {
        const uint32_t q = fast_div(bc.out[d], i);
        const uint32_t k = i - q * bc.out[d].d;
        a += k * bc.sa[d];
        b += k * bc.sb[d];
        i = q;
    }
    *oa = a;
    *ob = b;
}

// A 1-D grid-stride loop in u32 (n < 2^31, so i + stride cannot wrap).
#define GRID_LOOP_U32(i, n) \
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < (uint32_t)(n); i += gridDim.x * blockDim.x)

// Warp and block reductions (llm.c's and CUB's shape): each warp reduces
// its lanes with register shuffles, lane 0 of every warp puts the warp's
// partial in shared memory, one barrier, and every warp then reduces the
// partials again with shuffles, so the result needs no second exchange.
// Two barriers per call whatever the block size (a shared-memory tree has
// one per level: nine for 256 threads).
//
// Order: fixed by the block size. Within a warp, lane i combines lane
// i + off for off = 16, 8, 4, 2, 1 (only where i + off < the count of
// values), always as
// op(lower lane, higher lane); the warps' partials go through the same tree
// in warp order. So every run, and every thread schedule, gives the same
// bits, and every warp computes the same final value from the same partials.

// The lanes of this thread's warp that exist (blockDim.x need not be a
// multiple of 32: the last warp may be partial), and their shuffle mask.
__device__ __forceinline__ unsigned warp_width() {
    const unsigned first = threadIdx.x & ~31u;
    const unsigned left = blockDim.x - first;
    return left < 32u ? left : 32u;
}
__device__ __forceinline__ unsigned width_mask(unsigned width) { return width >= 32u ? 0xffffffffu : (1u << width) - 1u; }

// Reduction of the values of lanes [0, count) of this warp (count <= the
// warp's width; every lane of the warp must call it, lanes past `count`
// pass a value that is ignored); the result is in lane 0.
template <typename A, typename Op>
__device__ __forceinline__ A warp_reduce_to_lane0(A v, Op op, unsigned count) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned mask = width_mask(warp_width());
#pragma unroll
    for (unsigned off = 16; off > 0; off >>= 1) {
        if (off < count) {  // uniform across the warp
            const A other = __shfl_down_sync(mask, v, off);
            if (lane + off < count) v = op(v, other);
        }
    }
    return v;
}

// Launch tables in device memory (host: `launch::chunk_words` in
// src/backend/cuda/launch.rs): a kernel that walks many buffers in chunks
// of `chunk` elements reads word c of its table for chunk c, the chunk's
// entry slot (low 32 bits) and its index within that entry (high 32 bits),
// and the entry's length from `len`; the chunk covers [lo, hi).
struct TableChunk {
    uint32_t k;
    u64 lo, hi;
};

__device__ __forceinline__ TableChunk table_chunk(const u64* words, u64 c, const u64* len, u64 chunk) {
    const u64 w = words[c];
    const uint32_t k = (uint32_t)(w & 0xffffffffull);
    const u64 lo = (w >> 32) * chunk;
    return TableChunk{k, lo, lo + chunk < len[k] ? lo + chunk : len[k]};
}

// The arrival step of a tiled reduction whose last block folds the tiles
// (reduce.cu's sum_cols_tiled, norm.cu's channels-last batch norm): every
// block calls it once its tile's partials are written and fenced
// (__threadfence()); the counter of its strip counts arrivals, and the call
// returns true in every thread of the block that arrived last (which then
// fences and reads the other tiles' partials). `flag` is a __shared__ int of
// the caller, rewritten by each call. The last block sets the counter back
// to 0 (no other block of the launch touches it again), so the device's kept
// counters (src/backend/cuda/device.rs `arrivals`) are 0 for the next
// kernel on the stream without a memset.
__device__ __forceinline__ bool last_tile_arrived(unsigned long long* counter, unsigned long long tiles, int* flag) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const bool last = atomicAdd(counter, 1ull) == tiles - 1;
        if (last) atomicExch(counter, 0ull);
        *flag = last;
    }
    __syncthreads();
    return *flag != 0;
}

// Block-wide reduction of one value per thread with the binary functor
// `op`, through `smem` (at least 32 slots of A; callers sized for
// blockDim.x slots keep working). blockDim.x is at most 32 or a multiple
// of 32 (every power of two is; anything else traps). Deterministic (see
// above). Every thread of the block must call it; the result is valid in
// every thread, and it ends with a barrier so `smem` can be reused by the
// caller's next call.
template <typename A, typename Op>
__device__ __forceinline__ A block_reduce(A v, A* smem, Op op) {
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned warps = (blockDim.x + 31u) >> 5;
    v = warp_reduce_to_lane0(v, op, warp_width());
    if (warps > 1) {
        if (blockDim.x & 31u) __trap();
        if (lane == 0) smem[warp] = v;
        __syncthreads();
        // Every warp reduces the partials in the same order (lanes past
        // `warps` read slot 0 and are ignored).
        v = warp_reduce_to_lane0(smem[lane < warps ? lane : 0], op, warps);
    }
    v = __shfl_sync(width_mask(warp_width()), v, 0);
    __syncthreads();
    return v;
}

// 16 bytes of T (4 floats, 2 doubles, 8 halves) for vectorised loads and
// stores: one 128-bit memory instruction instead of several narrow ones.
template <typename T> struct alignas(16) Pack16 {
    T v[16 / sizeof(T)];
};

// The elements before `p`'s first 16-byte boundary (at most n): scalar
// loads cover them, 16-byte loads the rest.
template <typename T> __device__ __forceinline__ i64 elems_to_align16(const T* p, i64 n) {
    const unsigned long long mis = (unsigned long long)p & 15u;
    const i64 head = mis == 0 ? 0 : (i64)((16u - mis) / sizeof(T));
    return head < n ? head : n;
}

struct SumOp {
    template <typename A> __device__ __forceinline__ A operator()(A a, A b) const { return a + b; }
};

// Block-wide sum (see block_reduce).
template <typename A>
__device__ A block_sum(A v, A* smem) {
    return block_reduce(v, smem, SumOp());
}
