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

// ---------------------------------------------------------------------------
// Per-row f64 results (the CTC's per-sequence loss, the label-smoothing KL
// of each row, the token hits) turned into the op's output on the device,
// so no loss is read back to the host inside a step.
//
//   rows_to:    out[i] = T(rows[i]), or 0 where zero_inf and rows[i] = ±inf
//   rows_total: out[0] = T((Σ_i rows[i]) / denom), summed by one thread in
//               row order, exactly as the CPU reference sums (the rows are a
//               few thousand at most: a few microseconds, and bitwise the
//               CPU's result).
//   token_hits: hits[r] = 1 where the row's argmax (the first index of its
//               largest value; a NaN never wins; index 0 when no value
//               exceeds −inf, as the CPU's fold) equals target[r], else 0;
//               0 for an ignored row. One block per row, (value, index)
//               pairs reduced in shared memory.

namespace {

template <typename T>
__device__ void rows_to_impl(const double* rows, T* out, int64_t n, int zero_inf) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)blockDim.x * gridDim.x) {
        const double r = rows[i];
        out[i] = (zero_inf && isinf(r)) ? T(0) : T(r);
    }
}

template <typename T>
__device__ void rows_total_impl(const double* rows, T* out, int64_t n, double denom) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i) total += rows[i];
    out[0] = T(total / denom);
}

template <typename T>
__device__ void token_hits_impl(const T* x, const int64_t* target, double* hits, int64_t rows, int64_t v,
                                int64_t ignore) {
    __shared__ double best_sh[LS_THREADS];
    __shared__ int64_t idx_sh[LS_THREADS];
    const int64_t none = INT64_MAX;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + (size_t)r * (size_t)v;
        double best = -INFINITY;
        int64_t bi = none;
        for (int64_t k = threadIdx.x; k < v; k += blockDim.x) {
            const double xv = (double)xr[k];
            if (xv > best) {
                best = xv;
                bi = k;
            }
        }
        best_sh[threadIdx.x] = best;
        idx_sh[threadIdx.x] = bi;
        __syncthreads();
        for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
            if (threadIdx.x < s) {
                const double ob = best_sh[threadIdx.x + s];
                const int64_t oi = idx_sh[threadIdx.x + s];
                if (ob > best_sh[threadIdx.x] || (ob == best_sh[threadIdx.x] && oi < idx_sh[threadIdx.x])) {
                    best_sh[threadIdx.x] = ob;
                    idx_sh[threadIdx.x] = oi;
                }
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            const int64_t arg = idx_sh[0] == none ? 0 : idx_sh[0];
            const int64_t y = target[r];
            hits[r] = (y != ignore && arg == y) ? 1.0 : 0.0;
        }
        __syncthreads();
    }
}

}  // namespace

#define ROWS_OUT(SUFFIX, T)                                                                                     \
    extern "C" __global__ void rows_to_##SUFFIX(const double* rows, T* out, int64_t n, int zero_inf) {          \
        rows_to_impl<T>(rows, out, n, zero_inf);                                                                 \
    }                                                                                                            \
    extern "C" __global__ void rows_total_##SUFFIX(const double* rows, T* out, int64_t n, double denom) {       \
        rows_total_impl<T>(rows, out, n, denom);                                                                 \
    }

ROWS_OUT(f32, float)
ROWS_OUT(f64, double)

#define TOKEN_HITS(SUFFIX, T)                                                                                    \
    extern "C" __global__ void token_hits_##SUFFIX(const T* x, const int64_t* target, double* hits, int64_t rows, \
                                                   int64_t v, int64_t ignore) {                                  \
        token_hits_impl<T>(x, target, hits, rows, v, ignore);                                                    \
    }

TOKEN_HITS(f32, float)
TOKEN_HITS(f64, double)
