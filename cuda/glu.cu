// Gated linear unit over one dim of x, viewed as (outer, 2, h*inner) with
// hi = h*inner (the halves along the dim, each hi contiguous elements per
// outer index), y (outer, hi):
//   a = x[o, 0, r], b = x[o, 1, r], s = sigmoid(b)
//   y[o, r]      = a * s
//   gx[o, 0, r]  = g * s
//   gx[o, 1, r]  = (g * a) * (s * (1 - s))
// One thread per output element (it writes both input gradients), math in
// acc_t (f32 for f16/bf16): one launch forward, one backward, where the
// composition narrow, narrow, sigmoid, mul took four and six.
#include "nn_common.cuh"

template <typename T> __device__ __forceinline__ typename Num<T>::acc glu_sigmoid(typename Num<T>::acc b) {
    typedef typename Num<T>::acc A;
    return A(1) / (A(1) + exp(-b));
}

template <typename T>
__device__ void glu_fwd(const T* __restrict__ x, T* __restrict__ y, uint64_t n, uint64_t hi) {
    typedef typename Num<T>::acc A;
    NN_GRID_STRIDE(e, n) {
        const size_t ia = (e / hi) * 2 * hi + e % hi;
        const A a = Num<T>::to(x[ia]), s = glu_sigmoid<T>(Num<T>::to(x[ia + hi]));
        y[e] = Num<T>::from(a * s);
    }
}

template <typename T>
__device__ void glu_bwd(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ gx, uint64_t n, uint64_t hi) {
    typedef typename Num<T>::acc A;
    NN_GRID_STRIDE(e, n) {
        const size_t ia = (e / hi) * 2 * hi + e % hi;
        const A a = Num<T>::to(x[ia]), s = glu_sigmoid<T>(Num<T>::to(x[ia + hi])), gv = Num<T>::to(g[e]);
        gx[ia] = Num<T>::from(gv * s);
        gx[ia + hi] = Num<T>::from((gv * a) * (s * (A(1) - s)));
    }
}

#define GLU_KERNELS(SUF, T)                                                                                    \
    extern "C" __global__ void glu_fwd_##SUF(const T* x, T* y, uint64_t n, uint64_t hi) {                      \
        glu_fwd<T>(x, y, n, hi);                                                                               \
    }                                                                                                          \
    extern "C" __global__ void glu_bwd_##SUF(const T* x, const T* g, T* gx, uint64_t n, uint64_t hi) {         \
        glu_bwd<T>(x, g, gx, n, hi);                                                                           \
    }
NN_FLOAT_DTYPES(GLU_KERNELS)
