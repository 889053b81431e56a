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
//
// Each has a `_u32` twin (permute_u32_{dt}, narrow_u32_{dt}, ...) that the
// host launches when every index is below 2^31: u32 indices, and the
// divisions by dims done with host-computed multipliers (common.cuh's
// FastDiv, Strided32); permute's dims are merged where contiguous first.
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

// The same copies with u32 indices (every index below 2^31; the host picks
// them) and each division by a dim done with host-computed divisors
// (common.cuh's FastDiv): no 64-bit division per element.
template <typename T>
__device__ void permute_u32(const T* __restrict__ x, const Strided32& s, T* __restrict__ y, uint32_t total) {
    GRID_LOOP_U32(e, total) y[e] = x[strided32_offset(s, e)];
}

template <typename T>
__device__ void narrow_u32(const T* __restrict__ x, T* __restrict__ y, FastDiv inner, FastDiv len, uint32_t n, uint32_t start,
                           uint32_t total) {
    GRID_LOOP_U32(e, total) {
        const uint32_t q = fast_div(inner, e), i = e - q * inner.d;
        const uint32_t o = fast_div(len, q), j = q - o * len.d;
        y[e] = x[(o * n + start + j) * inner.d + i];
    }
}

template <typename T>
__device__ void pad_u32(const T* __restrict__ x, T* __restrict__ y, FastDiv inner, FastDiv m, uint32_t n, uint32_t left,
                        uint64_t value_bits, uint32_t total) {
    const T v = nn_from_bits<T>(value_bits);
    GRID_LOOP_U32(e, total) {
        const uint32_t q = fast_div(inner, e), i = e - q * inner.d;
        const uint32_t o = fast_div(m, q), j = q - o * m.d;
        y[e] = (j >= left && j < left + n) ? x[(o * n + (j - left)) * inner.d + i] : v;
    }
}

template <typename T>
__device__ void cat_part_u32(const T* __restrict__ x, T* __restrict__ y, FastDiv inner, FastDiv n, uint32_t total, uint32_t start,
                             uint32_t count) {
    GRID_LOOP_U32(e, count) {
        const uint32_t q = fast_div(inner, e), i = e - q * inner.d;
        const uint32_t o = fast_div(n, q), j = q - o * n.d;
        y[(o * total + start + j) * inner.d + i] = x[e];
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
    }                                                                                                                     \
    extern "C" __global__ void permute_u32_##SUF(const T* x, Strided32 s, T* y, uint32_t total) {                         \
        permute_u32<T>(x, s, y, total);                                                                                   \
    }                                                                                                                     \
    extern "C" __global__ void narrow_u32_##SUF(const T* x, T* y, FastDiv inner, FastDiv len, uint32_t n, uint32_t start,  \
                                                uint32_t total) {                                                         \
        narrow_u32<T>(x, y, inner, len, n, start, total);                                                                 \
    }                                                                                                                     \
    extern "C" __global__ void pad_u32_##SUF(const T* x, T* y, FastDiv inner, FastDiv m, uint32_t n, uint32_t left,        \
                                             uint64_t value_bits, uint32_t total) {                                       \
        pad_u32<T>(x, y, inner, m, n, left, value_bits, total);                                                           \
    }                                                                                                                     \
    extern "C" __global__ void cat_part_u32_##SUF(const T* x, T* y, FastDiv inner, FastDiv n, uint32_t total,             \
                                                  uint32_t start, uint32_t count) {                                       \
        cat_part_u32<T>(x, y, inner, n, total, start, count);                                                             \
    }
NN_ALL_DTYPES(LAYOUT_KERNELS)
