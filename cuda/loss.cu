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
// The fused label-smoothing loss (the `loss` family of the fusion switch,
// src/ops/fusion.rs): the same loss in one read of the logits forward and one
// read plus one write backward; the gradient (the probabilities) is never
// stored between them, only the row's log-sum-exp.
//
//   fused_fwd: per row, in one pass over V, the online max and sum of
//              exponentials (m, s), Σ_k x_k and x_y; lse = m + log s and
//                row_kl = C − ε'·(Σ_k x_k − V·lse) − (c − ε')·(x_y − lse)
//              with ε' = ε/(V−1), c = 1 − ε, C = (V−1)·ε' log ε' + c log c:
//              the KL of the composition with the sums regrouped (f64).
//   fused_bwd: dx_k = (exp(x_k − lse) − q_k) · g · inv_denom (0 for an ignored
//              row), g the loss's incoming gradient (a device scalar).
//
// One block per row (grid-stride over rows), threads strided over V.

namespace {

template <typename T, typename A>
__device__ void label_smoothing_fused_fwd_impl(const T* x, const int64_t* target, double* row_kl, double* lse_out,
                                               int64_t rows, int64_t v, double smoothing, int64_t ignore) {
    __shared__ A sh[LS_THREADS];
    const A off = A(smoothing / ((double)v - 1.0));
    const A on = A(1.0 - smoothing);
    const A c = A(v - 1) * qlogq<A>(off) + qlogq<A>(on);
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + (size_t)r * (size_t)v;
        const int64_t y = target[r];
        if (y == ignore) {
            if (threadIdx.x == 0) {
                row_kl[r] = 0.0;
                lse_out[r] = 0.0;
            }
            continue;
        }
        A m = -INFINITY, s = 0, sx = 0;
        for (int64_t k = threadIdx.x; k < v; k += blockDim.x) {
            const A xv = A(to_acc(xr[k]));
            sx += xv;
            if (xv > m) {
                s = s * exp(m - xv) + A(1);
                m = xv;
            } else {
                s += exp(xv - m);
            }
        }
        const A mb = block_max<A>(m, sh);
        s = block_sum<A>(m == -INFINITY ? A(0) : s * exp(m - mb), sh);
        sx = block_sum<A>(sx, sh);
        const A lse = mb + log(s);
        if (threadIdx.x == 0) {
            const A xy = A(to_acc(xr[y]));
            row_kl[r] = (double)(c - off * (sx - A(v) * lse) - (on - off) * (xy - lse));
            lse_out[r] = (double)lse;
        }
    }
}

template <typename T, typename A, typename G>
__device__ void label_smoothing_fused_bwd_impl(const T* x, const int64_t* target, const double* lse_in, const G* g,
                                               T* dx, int64_t rows, int64_t v, double smoothing, int64_t ignore,
                                               double inv_denom) {
    const A off = A(smoothing / ((double)v - 1.0));
    const A on = A(1.0 - smoothing);
    const A scale = A(g[0]) * A(inv_denom);
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + (size_t)r * (size_t)v;
        T* dr = dx + (size_t)r * (size_t)v;
        const int64_t y = target[r];
        if (y == ignore) {
            for (int64_t k = threadIdx.x; k < v; k += blockDim.x) dr[k] = from_acc<T>(acc_t<T>(0));
            continue;
        }
        const A lse = A(lse_in[r]);
        for (int64_t k = threadIdx.x; k < v; k += blockDim.x) {
            const A q = (k == y) ? on : off;
            dr[k] = from_acc<T>(acc_t<T>((exp(A(to_acc(xr[k])) - lse) - q) * scale));
        }
    }
}

}  // namespace

#define LABEL_SMOOTHING_FUSED(SUFFIX, T, A, G)                                                                      \
    extern "C" __global__ void label_smoothing_fused_fwd_##SUFFIX(const T* x, const int64_t* target,              \
                                                                  double* row_kl, double* lse, int64_t rows,     \
                                                                  int64_t v, double smoothing, int64_t ignore) { \
        label_smoothing_fused_fwd_impl<T, A>(x, target, row_kl, lse, rows, v, smoothing, ignore);               \
    }                                                                                                            \
    extern "C" __global__ void label_smoothing_fused_bwd_##SUFFIX(                                               \
        const T* x, const int64_t* target, const double* lse, const G* g, T* dx, int64_t rows, int64_t v,         \
        double smoothing, int64_t ignore, double inv_denom) {                                                    \
        label_smoothing_fused_bwd_impl<T, A, G>(x, target, lse, g, dx, rows, v, smoothing, ignore, inv_denom);  \
    }

// Half logits (autocast's decoder output) are read as they are, the sums in
// f64 as for f32; the loss, and so its incoming gradient g, is f32, and dx
// is rounded to the half type once from the f64 value through f32, as the
// f32 kernel's result would be by the cast back (the same bits).
LABEL_SMOOTHING_FUSED(f32, float, double, float)
LABEL_SMOOTHING_FUSED(f64, double, double, double)
LABEL_SMOOTHING_FUSED(f16, f16, double, float)
LABEL_SMOOTHING_FUSED(bf16, bf16, double, float)

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
            const double xv = (double)to_acc(xr[k]);
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
TOKEN_HITS(f16, f16)
TOKEN_HITS(bf16, bf16)
