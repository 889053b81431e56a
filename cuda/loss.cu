// WeNet's label-smoothing loss forward and backward, the GPU twin of
// src/backend/cpu/loss.rs.
//
// Layouts: x (N, V) logits, T = f32 or f64; target (N) i64 with `ignore`
// for padding; row_kl (N) f64; grad (N, V) T.
//   q_k = ε/(V−1) for k ≠ y, q_y = 1 − ε
//   row_kl = Σ_k q_k (log q_k − log p_k),  p = softmax(x),  0 for an ignored row
//   grad   = p − q                          (0 for an ignored row)
// Terms with q_k = 0 contribute 0 (xlogy), so ε = 0 is cross-entropy. The
// op divides by its denominator (tokens or batch) and sums the rows on the
// host in row order, so the total never depends on the launch shape.
//
// Shape of the kernel: one block per row (grid-stride over rows), threads
// strided over V, shared-memory tree reductions for the max, the sum of
// exponentials and the row's KL. The block size must be a power of two no
// larger than LS_THREADS. Both input types accumulate in f64, as the CPU
// reference does: p − q cancels near the target (p_y ≈ 1 − ε), where an f32
// log-sum-exp would leave errors of 1e-7 absolute in the gradient; the cost
// is nothing beside the logits' read.

#include <math.h>
#include "common.cuh"
#include <stdint.h>

#define LS_THREADS 256

namespace {

struct FmaxOp {
    template <typename A> __device__ __forceinline__ A operator()(A a, A b) const { return fmax(a, b); }
};

// Block-wide max (fmax: a NaN loses to a number; block_reduce from common.cuh).
template <typename A>
__device__ A block_max(A v, A* sh) {
    return block_reduce(v, sh, FmaxOp());
}

template <typename A>
__device__ __forceinline__ A qlogq(A q) {
    return q > A(0) ? q * log(q) : A(0);
}

template <typename T, typename A>
__device__ void label_smoothing_impl(const T* x, const int64_t* target, double* row_kl, T* grad, int64_t rows,
                                     int64_t v, double smoothing, int64_t ignore, int want_grad) {
    __shared__ A sh[LS_THREADS];
    const A off = A(smoothing / ((double)v - 1.0));
    const A on = A(1.0 - smoothing);
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + (size_t)r * (size_t)v;
        T* gr = want_grad ? grad + (size_t)r * (size_t)v : nullptr;
        const int64_t y = target[r];
        if (y == ignore) {
            if (want_grad)
                for (int64_t k = threadIdx.x; k < v; k += blockDim.x) gr[k] = T(0);
            if (threadIdx.x == 0) row_kl[r] = 0.0;
            continue;
        }
        A m = -INFINITY;
        for (int64_t k = threadIdx.x; k < v; k += blockDim.x) m = fmax(m, A(xr[k]));
        m = block_max<A>(m, sh);
        A s = 0;
        for (int64_t k = threadIdx.x; k < v; k += blockDim.x) s += exp(A(xr[k]) - m);
        s = block_sum<A>(s, sh);
        const A lse = m + log(s);
        A kl = 0;
        for (int64_t k = threadIdx.x; k < v; k += blockDim.x) {
            const A q = (k == y) ? on : off;
            const A xv = A(xr[k]);
            kl += qlogq<A>(q) - q * (xv - lse);
            if (want_grad) gr[k] = T(exp(xv - lse) - q);
        }
        kl = block_sum<A>(kl, sh);
        if (threadIdx.x == 0) row_kl[r] = (double)kl;
    }
}

}  // namespace

#define LABEL_SMOOTHING(SUFFIX, T, A)                                                                          \
    extern "C" __global__ void label_smoothing_##SUFFIX(const T* x, const int64_t* target, double* row_kl,     \
                                                        T* grad, int64_t rows, int64_t v, double smoothing,     \
                                                        int64_t ignore, int want_grad) {                        \
        label_smoothing_impl<T, A>(x, target, row_kl, grad, rows, v, smoothing, ignore, want_grad);            \
    }

LABEL_SMOOTHING(f32, float, double)
LABEL_SMOOTHING(f64, double, double)
