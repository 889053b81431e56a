// Indexing kernels: index_select (embedding lookups and gather use it) and
// its backward, masked_fill and where.
//
// index_select, x (outer, n, inner), idx (nidx) i64, y (outer, nidx, inner):
//   y[o, j, i] = x[o, idx[j], i]                      (one thread per output element)
// index_add (its backward), g (outer, nidx, inner), out (outer, n, inner):
//   out[o, t, i] = sum_{j : idx[j] == t} g[o, j, i]
// Sort-free and atomic-free: the host builds the inverse of idx in CSR form
// (for each target row t, the positions j with idx[j] == t in ascending
// order: pos[offs[t] .. offs[t+1]]), and one thread per output element sums
// its rows in that order. Every element is written once (zero when no index
// hits it), the order is the CPU's, the bits are reproducible.
// gather / scatter_add are the same two kernels on flat tensors: outer = 1,
// inner = 1, n = numel(x), and idx the per-element offsets the host computed.
// Indices are checked on the host before any launch.
//
// masked_fill, x and y of shape dims (rank dims), mask u8 broadcast to it:
//   y[e] = mask[moff(e)] != 0 ? value : x[e]
// where: y[e] = mask[moff(e)] != 0 ? a[e] : b[e]
// moff(e) = sum_d coord_d(e) * mstride_d; `s` (a Strided, by value) holds
// dims[rank] and mstride[rank] (0 on broadcast dims). The fill value arrives as the bits
// of the tensor's dtype, so one raw-element kernel serves every dtype.
#include "nn_common.cuh"

template <typename T>
__device__ void index_select(const T* __restrict__ x, const long long* __restrict__ idx, T* __restrict__ y, uint64_t outer,
                             uint64_t n, uint64_t inner, uint64_t nidx) {
    NN_GRID_STRIDE(e, outer * nidx * inner) {
        const size_t i = e % inner;
        const size_t j = (e / inner) % nidx;
        const size_t o = e / (inner * nidx);
        y[e] = x[(o * n + (size_t)idx[j]) * inner + i];
    }
}

template <typename T>
__device__ void index_add(const T* __restrict__ g, const long long* __restrict__ offs, const long long* __restrict__ pos,
                          T* __restrict__ out, uint64_t outer, uint64_t n, uint64_t inner, uint64_t nidx) {
    typedef typename Num<T>::acc A;
    NN_GRID_STRIDE(e, outer * n * inner) {
        const size_t i = e % inner;
        const size_t t = (e / inner) % n;
        const size_t o = e / (inner * n);
        A s = 0;
        for (long long k = offs[t]; k < offs[t + 1]; ++k) s += Num<T>::to(g[(o * nidx + (size_t)pos[k]) * inner + i]);
        out[e] = Num<T>::from(s);
    }
}

template <typename T>
__device__ void masked_fill(const T* __restrict__ x, const uint8_t* __restrict__ mask, const Strided& s, T* __restrict__ y,
                            uint64_t total, uint64_t value_bits) {
    const T v = nn_from_bits<T>(value_bits);
    NN_GRID_STRIDE(e, total) y[e] = mask[strided_offset(s, e)] != 0 ? v : x[e];
}

template <typename T>
__device__ void where_cond(const uint8_t* __restrict__ mask, const Strided& s, const T* __restrict__ a, const T* __restrict__ b,
                           T* __restrict__ y, uint64_t total) {
    NN_GRID_STRIDE(e, total) y[e] = mask[strided_offset(s, e)] != 0 ? a[e] : b[e];
}

#define INDEX_COPY_KERNELS(SUF, T)                                                                                        \
    extern "C" __global__ void index_select_##SUF(const T* x, const long long* idx, T* y, uint64_t outer, uint64_t n,     \
                                                  uint64_t inner, uint64_t nidx) {                                        \
        index_select<T>(x, idx, y, outer, n, inner, nidx);                                                                \
    }                                                                                                                     \
    extern "C" __global__ void masked_fill_##SUF(const T* x, const uint8_t* mask, Strided s, T* y, uint64_t total,        \
                                                 uint64_t value_bits) {                                                   \
        masked_fill<T>(x, mask, s, y, total, value_bits);                                                                 \
    }                                                                                                                     \
    extern "C" __global__ void where_cond_##SUF(const uint8_t* mask, Strided s, const T* a, const T* b, T* y,             \
                                                uint64_t total) {                                                         \
        where_cond<T>(mask, s, a, b, y, total);                                                                           \
    }
NN_ALL_DTYPES(INDEX_COPY_KERNELS)

#define INDEX_ADD_KERNELS(SUF, T)                                                                                         \
    extern "C" __global__ void index_add_##SUF(const T* g, const long long* offs, const long long* pos, T* out,           \
                                               uint64_t outer, uint64_t n, uint64_t inner, uint64_t nidx) {               \
        index_add<T>(g, offs, pos, out, outer, n, inner, nidx);                                                           \
    }
NN_FLOAT_DTYPES(INDEX_ADD_KERNELS)
