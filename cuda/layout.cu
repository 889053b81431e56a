// Copy kernels for the layouts the model needs: permute, narrow, pad, cat.
// They move raw elements, so one kernel per element size serves every dtype
// (f16 and bf16 share the 16-bit one under their own names).
//
// permute, x of rank R, y with dims odims (output dim d is input dim perm[d]):
//   y[e] = x[sum_d coord_d(e) * istride[perm[d]]]
// `s` (a Strided, by value) holds odims[R] and the permuted input strides[R];
// one thread per output element (grid-stride, 64-bit offsets).
//
// Around one dim, tensors are viewed as (outer, n, inner):
//   narrow: y (outer, len, inner)      = x[o, start + j, i]
//   pad:    y (outer, l + n + r, inner) = x[o, j - l, i] if l <= j < l + n, else value
//   cat:    one launch per input k writes its slab of y (outer, total, inner)
//           at rows [start_k, start_k + n_k): y[o, start_k + j, i] = x_k[o, j, i]
// The backwards are the same copies (narrow <-> pad, cat -> narrow).
#include "nn_common.cuh"

template <typename T>
__device__ void permute(const T* __restrict__ x, const Strided& s, T* __restrict__ y, uint64_t total) {
    NN_GRID_STRIDE(e, total) y[e] = x[strided_offset(s, e)];
}

template <typename T>
__device__ void narrow(const T* __restrict__ x, T* __restrict__ y, uint64_t outer, uint64_t n, uint64_t inner, uint64_t start,
                       uint64_t len) {
    NN_GRID_STRIDE(e, outer * len * inner) {
        const size_t i = e % inner;
        const size_t j = (e / inner) % len;
        const size_t o = e / (inner * len);
        y[e] = x[(o * n + start + j) * inner + i];
    }
}

template <typename T>
__device__ void pad(const T* __restrict__ x, T* __restrict__ y, uint64_t outer, uint64_t n, uint64_t inner, uint64_t left,
                    uint64_t right, uint64_t value_bits) {
    const T v = nn_from_bits<T>(value_bits);
    const size_t m = left + n + right;
    NN_GRID_STRIDE(e, outer * m * inner) {
        const size_t i = e % inner;
        const size_t j = (e / inner) % m;
        const size_t o = e / (inner * m);
        y[e] = (j >= left && j < left + n) ? x[(o * n + (j - left)) * inner + i] : v;
    }
}

template <typename T>
__device__ void cat_part(const T* __restrict__ x, T* __restrict__ y, uint64_t outer, uint64_t n, uint64_t inner, uint64_t total,
                         uint64_t start) {
    NN_GRID_STRIDE(e, outer * n * inner) {
        const size_t i = e % inner;
        const size_t j = (e / inner) % n;
        const size_t o = e / (inner * n);
        y[(o * total + start + j) * inner + i] = x[e];
    }
}

#define LAYOUT_KERNELS(SUF, T)                                                                                            \
    extern "C" __global__ void permute_##SUF(const T* x, Strided s, T* y, uint64_t total) {                               \
        permute<T>(x, s, y, total);                                                                                       \
    }                                                                                                                     \
    extern "C" __global__ void narrow_##SUF(const T* x, T* y, uint64_t outer, uint64_t n, uint64_t inner, uint64_t start, \
                                            uint64_t len) {                                                               \
        narrow<T>(x, y, outer, n, inner, start, len);                                                                     \
    }                                                                                                                     \
    extern "C" __global__ void pad_##SUF(const T* x, T* y, uint64_t outer, uint64_t n, uint64_t inner, uint64_t left,     \
                                         uint64_t right, uint64_t value_bits) {                                           \
        pad<T>(x, y, outer, n, inner, left, right, value_bits);                                                           \
    }                                                                                                                     \
    extern "C" __global__ void cat_part_##SUF(const T* x, T* y, uint64_t outer, uint64_t n, uint64_t inner,               \
                                              uint64_t total, uint64_t start) {                                           \
        cat_part<T>(x, y, outer, n, inner, total, start);                                                                 \
    }
NN_ALL_DTYPES(LAYOUT_KERNELS)
