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

// Row kernels come in two shapes, chosen on the host by the row length n:
// a warp per row (WarpRows) for n <= NN_WARP_ROW_MAX, NN_BLOCK / 32 rows per
// block, reduced by registers and warp shuffles alone (no shared memory, no
// barrier); and a block per row (BlockRows) for longer rows, reduced
// through shared memory. Both grid-stride over rows, so any grid covers
// every row.
//
// A row is cut into chunks of N = 16 / sizeof(T) consecutive elements (T the
// row's storage type: 4 f32, 2 f64, 8 f16/bf16); chunk c holds elements
// c*N ... c*N + N - 1 (the last one fewer when N does not divide n). RowVec
// loads a chunk with 16-byte loads when the row start is 16-byte aligned and
// N divides n, else element by element: the same elements either way, so
// the path never changes a result.
//
// Both shapes reduce a row in the same order, so they give the same bits:
// that of common.cuh's block_reduce over NN_BLOCK threads, thread t folding
// chunks t, t + NN_BLOCK, ... in turn, the elements of a chunk in index
// order. A warp keeps the NN_BLOCK / 32 partials of the threads t = lane +
// 32k in registers v[k], reduces each across the lanes as block_reduce's
// per-warp stage does (offsets 16 ... 1, by an xor butterfly, whose lanes
// l < s combine (v_l, v_{l+s}) as the shuffle-down tree does; the others
// hold the same bits, the operators being commutative), then folds the
// eight warp results as its second stage does (v[k] with v[k + 4], then
// + 2, then + 1). The elementwise passes give chunk c to thread c mod
// (group size), so they load and store whole chunks too.
#define NN_WARP_ROW_MAX 1024
#define NN_WARP 32

// N values of type T (a chunk, or its computed values).
template <typename T, int N> struct Vals {
    T v[N];
};

// A row of n elements of type T read or written by chunks of N (N * sizeof(T)
// a multiple of 16 for the 16-byte path; N = 16 / sizeof(T) of the row's own
// type, or the same N over a row of another type, such as layer norm's f32
// weight beside bf16 activations: two 16-byte loads per chunk).
template <typename T> struct NnUnconst {
    typedef T type;
};
template <typename T> struct NnUnconst<const T> {
    typedef T type;
};

template <typename T, int N> struct RowVec {
    typedef typename NnUnconst<T>::type U;
    T* p;
    uint32_t n;
    bool vec;
    __device__ __forceinline__ RowVec(T* p_, uint32_t n_)
        : p(p_), n(n_), vec((N * sizeof(T)) % 16 == 0 && n_ % N == 0 && ((unsigned long long)p_ & 15u) == 0) {}
    // Chunk c; the slots past n of a short last chunk repeat element n - 1
    // (loaded, never folded or stored).
    __device__ __forceinline__ Vals<U, N> load(uint32_t c) const {
        Vals<U, N> out;
        if (vec) {
            constexpr int P = (int)(N * sizeof(T) / 16), E = (int)(16 / sizeof(T));
            const Pack16<U>* q = reinterpret_cast<const Pack16<U>*>(p + (size_t)c * N);
#pragma unroll
            for (int k = 0; k < P; ++k) {
                const Pack16<U> pk = q[k];
#pragma unroll
                for (int j = 0; j < E; ++j) out.v[k * E + j] = pk.v[j];
            }
        } else {
#pragma unroll
            for (int j = 0; j < N; ++j) {
                const uint32_t i = c * N + j;
                out.v[j] = p[i < n ? i : n - 1];
            }
        }
        return out;
    }
    __device__ __forceinline__ void store(uint32_t c, const Vals<T, N>& a) const {
        if (vec) {
            constexpr int P = (int)(N * sizeof(T) / 16), E = (int)(16 / sizeof(T));
            Pack16<T>* q = reinterpret_cast<Pack16<T>*>(p + (size_t)c * N);
#pragma unroll
            for (int k = 0; k < P; ++k) {
                Pack16<T> pk;
#pragma unroll
                for (int j = 0; j < E; ++j) pk.v[j] = a.v[k * E + j];
                q[k] = pk;
            }
        } else {
#pragma unroll
            for (int j = 0; j < N; ++j)
                if (c * N + j < n) p[c * N + j] = a.v[j];
        }
    }
};

template <typename T> struct RowN {
    static constexpr int N = (int)(16 / sizeof(T));
};

// The number of chunks of N in a row of n, and the elements of chunk c.
template <int N> __device__ __forceinline__ uint32_t nn_chunks(uint32_t n) { return (n + N - 1) / N; }
template <int N> __device__ __forceinline__ int nn_chunk_len(uint32_t c, uint32_t n) {
    const uint32_t left = n - c * N;
    return left < (uint32_t)N ? (int)left : N;
}

// Folds the values of chunk c (f(c) gives N values) into v, in index order.
template <int N, typename A, typename Op, typename F>
__device__ __forceinline__ A nn_fold_chunk(A v, uint32_t c, uint32_t n, Op op, F& f) {
    const Vals<A, N> a = f(c);
    const int len = nn_chunk_len<N>(c, n);
    if (len == N) {
#pragma unroll
        for (int j = 0; j < N; ++j) v = op(v, a.v[j]);
    } else {
        for (int j = 0; j < len; ++j) v = op(v, a.v[j]);
    }
    return v;
}

struct WarpRows {
    // Rows (groups) per block, this thread's group in the block, its index
    // in the group and the group's size.
    __device__ __forceinline__ static uint32_t per_block() { return blockDim.x / NN_WARP; }
    __device__ __forceinline__ static uint32_t group() { return threadIdx.x / NN_WARP; }
    __device__ __forceinline__ static uint32_t t() { return threadIdx.x % NN_WARP; }
    __device__ __forceinline__ static uint32_t size() { return NN_WARP; }
    // op over the row's n values from init (see above), f(c) giving the N
    // values of chunk c; every lane of the warp calls it for the same row
    // and gets the result.
    template <int N, typename A, typename Op, typename F>
    __device__ __forceinline__ static A row_reduce(uint32_t n, A init, Op op, F f) {
        constexpr int K = NN_BLOCK / NN_WARP;
        const uint32_t nc = nn_chunks<N>(n);
        A v[K];
#pragma unroll
        for (int k = 0; k < K; ++k) {
            v[k] = init;
            for (uint32_t c = t() + NN_WARP * k; c < nc; c += NN_BLOCK) v[k] = nn_fold_chunk<N>(v[k], c, n, op, f);
        }
        // Each virtual warp k across the lanes first (block_reduce's first stage) ...
#pragma unroll
        for (int k = 0; k < K; ++k)
#pragma unroll
            for (int o = NN_WARP / 2; o > 0; o >>= 1) v[k] = op(v[k], __shfl_xor_sync(0xffffffffu, v[k], o));
        // ... then the warps' results as its second stage folds them (4, 2, 1).
#pragma unroll
        for (int s = K / 2; s > 0; s >>= 1)
#pragma unroll
            for (int k = 0; k < s; ++k) v[k] = op(v[k], v[k + s]);
        return v[0];
    }
};

struct BlockRows {
    __device__ __forceinline__ static uint32_t per_block() { return 1; }
    __device__ __forceinline__ static uint32_t group() { return 0; }
    __device__ __forceinline__ static uint32_t t() { return threadIdx.x; }
    __device__ __forceinline__ static uint32_t size() { return blockDim.x; }
    // op over the row's n values from init (f(c) giving chunk c's N values)
    // through common.cuh's block tree (blockDim.x == NN_BLOCK); it ends with
    // a barrier, so calls may follow each other. Every thread of the block
    // calls it.
    template <int N, typename A, typename Op, typename F>
    __device__ __forceinline__ static A row_reduce(uint32_t n, A init, Op op, F f) {
        __shared__ A sh[NN_BLOCK];
        const uint32_t nc = nn_chunks<N>(n);
        A v = init;
        for (uint32_t c = threadIdx.x; c < nc; c += blockDim.x) v = nn_fold_chunk<N>(v, c, n, op, f);
        return block_reduce(v, sh, op);
    }
};

// Chunks c of a row of n handled by this thread in an elementwise pass.
#define NN_GROUP_CHUNKS(G, N, c, n) for (uint32_t c = G::t(); c < nn_chunks<N>(n); c += G::size())

// Rows handled by this thread's group: group g of block b takes rows
// b*per_block + g, then strides by the grid's groups. Every thread of a
// group runs the same iterations (the group's reductions need them all).
#define NN_GROUP_ROWS(G, r, rows)                                                                   \
    for (size_t r = (size_t)blockIdx.x * G::per_block() + G::group(); r < (size_t)(rows); \
         r += (size_t)gridDim.x * G::per_block())

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
