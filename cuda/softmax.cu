// Softmax and log-softmax over the last dim, forward and backward.
//
// Layout: x, y, g, gx are (rows, n) row-major; one block per row
// (grid-stride over rows), NN_BLOCK threads striding over the row.
//
//   softmax:      y = exp(x - m) / s,      m = max x,  s = sum exp(x - m)
//   log_softmax:  y = x - m - log s
//   softmax backward:     gx = y * (g - sum(g * y))
//   log_softmax backward: gx = g - exp(y) * sum(g)
//
// The row max is subtracted first (numerically stable); sums accumulate in
// f32 (f64 for f64; f16 and bf16 are read and written in half) through a fixed shared-memory tree, so results are
// reproducible. A row that is all -inf gives NaN, as on the CPU.
#include "nn_common.cuh"

template <typename T, bool LOG>
__device__ void softmax_fwd(const T* __restrict__ x, T* __restrict__ y, uint64_t rows, uint32_t n) {
    typedef typename Num<T>::acc A;
    __shared__ A sh[NN_BLOCK];
    NN_BLOCK_ROWS(r, rows) {
        const T* xr = x + r * n;
        T* yr = y + r * n;
        A m = -INFINITY;
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) m = NnMax()(m, Num<T>::to(xr[i]));
        m = block_reduce(m, sh, NnMax());
        A s = 0;
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) s += nn_exp(Num<T>::to(xr[i]) - m);
        s = block_reduce(s, sh, SumOp());
        if (LOG) {
            const A ls = nn_log(s);
            for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = Num<T>::from(Num<T>::to(xr[i]) - m - ls);
        } else {
            const A inv = A(1) / s;
            for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = Num<T>::from(nn_exp(Num<T>::to(xr[i]) - m) * inv);
        }
    }
}

template <typename T, bool LOG>
__device__ void softmax_bwd(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ gx, uint64_t rows, uint32_t n) {
    typedef typename Num<T>::acc A;
    __shared__ A sh[NN_BLOCK];
    NN_BLOCK_ROWS(r, rows) {
        const T* yr = y + r * n;
        const T* gr = g + r * n;
        T* o = gx + r * n;
        A s = 0;
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
            s += LOG ? Num<T>::to(gr[i]) : Num<T>::to(gr[i]) * Num<T>::to(yr[i]);
        s = block_reduce(s, sh, SumOp());
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
            const A yv = Num<T>::to(yr[i]), gv = Num<T>::to(gr[i]);
            o[i] = Num<T>::from(LOG ? gv - nn_exp(yv) * s : yv * (gv - s));
        }
    }
}

#define SOFTMAX_KERNELS(SUF, T)                                                                                     \
    extern "C" __global__ void softmax_fwd_##SUF(const T* x, T* y, uint64_t rows, uint32_t n) {                     \
        softmax_fwd<T, false>(x, y, rows, n);                                                                       \
    }                                                                                                               \
    extern "C" __global__ void log_softmax_fwd_##SUF(const T* x, T* y, uint64_t rows, uint32_t n) {                 \
        softmax_fwd<T, true>(x, y, rows, n);                                                                        \
    }                                                                                                               \
    extern "C" __global__ void softmax_bwd_##SUF(const T* y, const T* g, T* gx, uint64_t rows, uint32_t n) {        \
        softmax_bwd<T, false>(y, g, gx, rows, n);                                                                   \
    }                                                                                                               \
    extern "C" __global__ void log_softmax_bwd_##SUF(const T* y, const T* g, T* gx, uint64_t rows, uint32_t n) {    \
        softmax_bwd<T, true>(y, g, gx, rows, n);                                                                    \
    }
NN_FLOAT_DTYPES(SOFTMAX_KERNELS)
