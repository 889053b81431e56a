// Emulated mma.h: nvcuda::wmma for any M x N x K tile (m16n16k16, m32n8k16,
// m8n32k16), half and bf16 inputs, float (or half) accumulators. A fragment
// holds its whole tile, row-major, in every lane (num_elements is the tile's
// size, not CUDA's per-lane share); element-wise loops over x[] still work,
// as every lane applies them to the same tile. The *_sync operations are
// warp rendezvous (__syncwarp): reached by part of a warp, they fail.
// mma_sync accumulates in f32, k ascending, each product exact in f32 (as
// tensor cores multiply 16-bit inputs exactly); the rounding of the sums
// differs from the hardware's in the last bits.
#pragma once
#include "cuda_bf16.h"
#include "cuda_fp16.h"

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K> struct tile_shape;
template <int M, int N, int K> struct tile_shape<matrix_a, M, N, K> { enum { rows = M, cols = K }; };
template <int M, int N, int K> struct tile_shape<matrix_b, M, N, K> { enum { rows = K, cols = N }; };
template <int M, int N, int K> struct tile_shape<accumulator, M, N, K> { enum { rows = M, cols = N }; };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    enum { rows = tile_shape<Use, M, N, K>::rows, cols = tile_shape<Use, M, N, K>::cols, num_elements = rows * cols };
    typedef T element_type;
    T x[num_elements];
};

template <typename Use, int M, int N, int K, typename T, typename L, typename V>
inline void fill_fragment(fragment<Use, M, N, K, T, L>& f, const V& v) {
    const T t = T(v);
    for (int i = 0; i < f.num_elements; ++i) f.x[i] = t;
}

namespace detail {
template <typename F, typename T> inline void load(F& f, const T* p, unsigned ldm, bool row) {
    __syncwarp();
    for (int r = 0; r < F::rows; ++r)
        for (int c = 0; c < F::cols; ++c) f.x[r * F::cols + c] = row ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
}
}  // namespace detail

template <typename Use, int M, int N, int K, typename T>
inline void load_matrix_sync(fragment<Use, M, N, K, T, row_major>& f, const T* p, unsigned ldm) {
    detail::load(f, p, ldm, true);
}
template <typename Use, int M, int N, int K, typename T>
inline void load_matrix_sync(fragment<Use, M, N, K, T, col_major>& f, const T* p, unsigned ldm) {
    detail::load(f, p, ldm, false);
}
template <int M, int N, int K, typename T>
inline void load_matrix_sync(fragment<accumulator, M, N, K, T, void>& f, const T* p, unsigned ldm, layout_t l) {
    detail::load(f, p, ldm, l == mem_row_major);
}
template <int M, int N, int K, typename T>
inline void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T, void>& f, unsigned ldm, layout_t l) {
    __syncwarp();
    typedef fragment<accumulator, M, N, K, T, void> F;
    for (int r = 0; r < F::rows; ++r)
        for (int c = 0; c < F::cols; ++c) {
            if (l == mem_row_major) p[(size_t)r * ldm + c] = f.x[r * F::cols + c];
            else p[(size_t)c * ldm + r] = f.x[r * F::cols + c];
        }
}
template <int M, int N, int K, typename TA, typename LA, typename TB, typename LB, typename TC, typename TD>
inline void mma_sync(fragment<accumulator, M, N, K, TD, void>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
                     const fragment<matrix_b, M, N, K, TB, LB>& b, const fragment<accumulator, M, N, K, TC, void>& c) {
    __syncwarp();
    float out[M * N];
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
            float s = (float)c.x[i * N + j];
            for (int k = 0; k < K; ++k) s += (float)a.x[i * K + k] * (float)b.x[k * N + j];
            out[i * N + j] = s;
        }
    for (int i = 0; i < M * N; ++i) d.x[i] = TD(out[i]);
}
}  // namespace wmma
}  // namespace nvcuda
