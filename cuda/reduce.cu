// Reductions over one dim, the twin of src/backend/cpu/reduce.rs.
// Layout (outer, n, inner) around the reduced dim; output (outer, inner).
//
//   sum_rows_{dt}(x, y, rows, n)          inner == 1: one block per row, each
//       thread sums a strided slice in acc_t with 16-byte loads, then
//       common.cuh's block_sum (warp shuffles and one shared exchange; fixed
//       order, so the result is deterministic run to run).
//   sum_cols_{dt}(x, y, outer, n, inner)  inner > 1: one thread per output,
//       summing its column in index order (deterministic, coalesced reads).
//   sum_rows_{f16,bf16}_to_f32, sum_cols_{f16,bf16}_to_f32: the same sums
//       of half inputs stored in f32, unrounded: a reduction over several
//       dims keeps its partial sums in f32 and rounds to half once, at the
//       end (4x300x129 halves summed dim by dim in f16 overflow to inf).
//   max_dim_{dt}(x, val, arg, outer, n, inner): value and first arg-max;
//       NaN propagates (the first NaN wins), as on the CPU.
//   max_bwd_{dt}(g, arg, out, outer, n, inner): out (zeroed by the host)
//       gets g at the arg-max positions.
//   expand_dim_{dt}(x, y, outer, n, inner): y[o,k,j] = x[o,j].
#include "common.cuh"

template <typename T, typename O = T>
__device__ void sum_rows(const T* x, O* y, i64 rows, i64 n) {
    typedef acc_t<T> A;
    const int W = 16 / sizeof(T);
    extern __shared__ __align__(8) unsigned char smem_raw[];
    A* smem = reinterpret_cast<A*>(smem_raw);
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* row = x + r * n;
        // Scalar head up to the first 16-byte boundary (a row of a buffer
        // whose row bytes are not a multiple of 16 starts anywhere), then
        // 16-byte vectors, then the scalar tail. Each thread adds its
        // elements in index order: a fixed order for a fixed shape.
        const i64 head = elems_to_align16(row, n);
        const i64 nv = (n - head) / W;
        const Pack16<T>* vec = reinterpret_cast<const Pack16<T>*>(row + head);
        A s = A(0);
        for (i64 k = threadIdx.x; k < head; k += blockDim.x) s += to_acc(row[k]);
        for (i64 k = threadIdx.x; k < nv; k += blockDim.x) {
            const Pack16<T> p = vec[k];
#pragma unroll
            for (int j = 0; j < W; ++j) s += to_acc(p.v[j]);
        }
        for (i64 k = head + nv * W + threadIdx.x; k < n; k += blockDim.x) s += to_acc(row[k]);
        s = block_sum<A>(s, smem);
        if (threadIdx.x == 0) y[r] = from_acc<O>(s);
    }
}

template <typename T, typename O = T>
__device__ void sum_cols(const T* x, O* y, i64 outer, i64 n, i64 inner) {
    typedef acc_t<T> A;
    GRID_LOOP(i, outer * inner) {
        i64 o = i / inner, j = i % inner;
        const T* p = x + o * n * inner + j;
        A s = A(0);
        for (i64 k = 0; k < n; ++k) s += to_acc(p[k * inner]);
        y[i] = from_acc<O>(s);
    }
}

template <typename T>
__device__ void max_dim(const T* x, T* val, i64* arg, i64 outer, i64 n, i64 inner) {
    typedef acc_t<T> A;
    GRID_LOOP(i, outer * inner) {
        i64 o = i / inner, j = i % inner;
        const T* p = x + o * n * inner + j;
        A best = to_acc(p[0]);
        i64 bi = 0;
        for (i64 k = 1; k < n; ++k) {
            A c = to_acc(p[k * inner]);
            if (c > best || (c != c && best == best)) {
                best = c;
                bi = k;
            }
        }
        val[i] = p[bi * inner];
        arg[i] = bi;
    }
}

template <typename T>
__device__ void max_bwd(const T* g, const i64* arg, T* out, i64 outer, i64 n, i64 inner) {
    GRID_LOOP(i, outer * inner) {
        i64 o = i / inner, j = i % inner;
        out[o * n * inner + arg[i] * inner + j] = g[i];
    }
}

template <typename T>
__device__ void expand_dim(const T* x, T* y, i64 outer, i64 n, i64 inner) {
    GRID_LOOP(i, outer * n * inner) {
        i64 j = i % inner, o = i / (n * inner);
        y[i] = x[o * inner + j];
    }
}

#define REDUCE(dt, T)                                                                                           \
    extern "C" __global__ void sum_rows_##dt(const T* x, T* y, i64 rows, i64 n) { sum_rows<T>(x, y, rows, n); } \
    extern "C" __global__ void sum_cols_##dt(const T* x, T* y, i64 outer, i64 n, i64 inner) {                 \
        sum_cols<T>(x, y, outer, n, inner);                                                                     \
    }                                                                                                           \
    extern "C" __global__ void max_dim_##dt(const T* x, T* val, i64* arg, i64 outer, i64 n, i64 inner) {      \
        max_dim<T>(x, val, arg, outer, n, inner);                                                               \
    }                                                                                                           \
    extern "C" __global__ void max_bwd_##dt(const T* g, const i64* arg, T* out, i64 outer, i64 n, i64 inner) { \
        max_bwd<T>(g, arg, out, outer, n, inner);                                                               \
    }                                                                                                           \
    extern "C" __global__ void expand_dim_##dt(const T* x, T* y, i64 outer, i64 n, i64 inner) {               \
        expand_dim<T>(x, y, outer, n, inner);                                                                   \
    }

REDUCE(f32, float)
REDUCE(f64, double)
REDUCE(f16, f16)
REDUCE(bf16, bf16)

// Half inputs summed into f32 partials (see the header).
#define REDUCE_TO_F32(dt, T)                                                                                   \
    extern "C" __global__ void sum_rows_##dt##_to_f32(const T* x, float* y, i64 rows, i64 n) {               \
        sum_rows<T, float>(x, y, rows, n);                                                                     \
    }                                                                                                          \
    extern "C" __global__ void sum_cols_##dt##_to_f32(const T* x, float* y, i64 outer, i64 n, i64 inner) {   \
        sum_cols<T, float>(x, y, outer, n, inner);                                                             \
    }

REDUCE_TO_F32(f16, f16)
REDUCE_TO_F32(bf16, bf16)
