// CTC loss (Graves et al., ICML 2006) forward and backward in log space,
// the GPU twin of src/backend/cpu/ctc.rs.
//
// Layouts (row-major, contiguous):
//   log_probs  (B, T, V)   T = f32 or f64
//   targets    (B, S)      i64, the first target_lengths[b] used
//   in_len, tgt_len (B)    i64
//   alpha, beta (B, T, L') f64 workspace, L' = 2·Smax+1 states per sequence
//   nll        (B)         f64 per-sequence −log p(l | x)
//   grad       (B, T, V)   T, ∂nll_b/∂log_probs[b] (zero past in_len[b])
//
// Extended label l' = (blank, l1, blank, l2, …, blank), L' = 2L+1. α and β
// both include the emission at t, so with y_t(k) = log_probs[t, k]
//   α_0(0) = y_0(blank), α_0(1) = y_0(l1)
//   α_t(s) = logΣ(α_{t−1}(s), α_{t−1}(s−1), α_{t−1}(s−2) if l'_s ≠ blank, l'_s ≠ l'_{s−2}) + y_t(l'_s)
//   nll    = −logΣ(α_{T−1}(L'−1), α_{T−1}(L'−2))
//   β mirrors α from the end, and the true derivative w.r.t. the
//   log-probabilities themselves (no log_softmax assumed behind them) is
//   ∂nll/∂y_t(k) = −exp(logΣ_{s: l'_s = k}(α_t(s) + β_t(s)) − y_t(k) + nll).
//
// Shape of the kernel: one block per sequence (grid-stride over B), threads
// over the L' states, one __syncthreads() per time step (α_t needs all of
// α_{t−1}). α and β are kept in f64 for both input types: the CPU reference
// computes in f64 and a log-space sum over hundreds of frames loses digits
// in f32. The gradient pass assigns each thread one (t, distinct symbol)
// pair, so every output element has exactly one writer and no atomics are
// needed; a symbol repeated in the label sums all its states.

// The fused variant (the fusion switch's `loss` family) takes the logits x
// instead of log-probabilities: y_t(k) = x_t(k) − lse_t with lse_t the row's
// log-sum-exp (ctc_lse_rows, f64), so the log-softmax output is never
// written, and its gradient is with respect to the logits:
//   ∂nll/∂x_t(k) = p_t(k) − exp(logΣ_{s: l'_s = k}(α_t(s) + β_t(s)) − y_t(k) + nll)
// (p = softmax(x_t); the occupation probabilities of a frame sum to 1), for
// t < in_len, 0 beyond and for an infeasible sequence.
//
// The dense parts of the gradient never go through the one-block-per-
// sequence kernel (on an H200 its B blocks writing B·T·V elements made the
// fused CTC 2.9x slower than the composition): the unfused gradient is
// zeroed by a memset before the kernel, and the fused one's p_t(k) (0 past
// in_len) is written by ctc_lse_rows, a block per row, in the same pass
// that finds the row's lse. ctc_loss_fused then overwrites the occupied
// (t, k) and, for an infeasible sequence, zeroes its rows again.

#include <math.h>
#include <stdint.h>
#include "common.cuh"

namespace {

__device__ __forceinline__ double log_add(double a, double b) {
    if (a == -INFINITY) return b;
    if (b == -INFINITY) return a;
    double m = fmax(a, b);
    return m + log(exp(a - m) + exp(b - m));
}

// The symbol of extended state s of a label `lab`.
__device__ __forceinline__ int64_t ext(const int64_t* lab, int64_t s, int64_t blank) {
    return (s % 2 == 0) ? blank : lab[s / 2];
}

// y_t(k): the log-probability, from the log-probabilities themselves or
// from the logits and their row's log-sum-exp (lse != nullptr: fused).
template <typename T>
__device__ __forceinline__ double ctc_y(const T* lp, const double* lse, int64_t v, int64_t t, int64_t k) {
    return lse ? (double)lp[t * v + k] - lse[t] : (double)lp[t * v + k];
}

template <typename T>
__device__ void ctc_one(const T* lp, const double* lse, const int64_t* lab, int64_t tlen, int64_t l, int64_t v, int64_t blank,
                        int64_t states_max, double* alpha, double* beta, double* nll_out, T* grad, int64_t t_max,
                        int want_grad) {
    const int64_t sl = 2 * l + 1;
    const double ninf = -INFINITY;
    __shared__ double nll_sh;
    // The gradient block arrives filled: zeros (memset), or p_t(k) and zeros
    // past in_len when fused (ctc_lse_rows); only the occupied (t, k) are
    // written here.
    if (tlen == 0) {
        if (threadIdx.x == 0) *nll_out = (l == 0) ? 0.0 : INFINITY;
        __syncthreads();
        return;
    }
    for (int64_t s = threadIdx.x; s < sl; s += blockDim.x) {
        double a = ninf;
        if (s == 0) a = ctc_y(lp, lse, v, 0, blank);
        else if (s == 1) a = ctc_y(lp, lse, v, 0, ext(lab, 1, blank));
        alpha[s] = a;
    }
    __syncthreads();
    for (int64_t t = 1; t < tlen; ++t) {
        const double* prev = alpha + (t - 1) * states_max;
        double* cur = alpha + t * states_max;
        for (int64_t s = threadIdx.x; s < sl; s += blockDim.x) {
            int64_t k = ext(lab, s, blank);
            double a = prev[s];
            if (s >= 1) a = log_add(a, prev[s - 1]);
            if (s >= 2 && k != blank && k != ext(lab, s - 2, blank)) a = log_add(a, prev[s - 2]);
            cur[s] = (a == ninf) ? ninf : a + ctc_y(lp, lse, v, t, k);
        }
        __syncthreads();
    }
    const double* last_a = alpha + (tlen - 1) * states_max;
    if (threadIdx.x == 0) {
        double logp = (sl > 1) ? log_add(last_a[sl - 1], last_a[sl - 2]) : last_a[0];
        nll_sh = -logp;
        *nll_out = -logp;
    }
    __syncthreads();
    const double nll = nll_sh;
    if (!want_grad) return;
    if (!isfinite(nll)) {
        // Infeasible: a zero gradient (ctc_lse_rows wrote p_t(k) on the fused path).
        if (lse)
            for (int64_t i = threadIdx.x; i < tlen * v; i += blockDim.x) grad[i] = T(0);
        return;
    }
    double* last_b = beta + (tlen - 1) * states_max;
    for (int64_t s = threadIdx.x; s < sl; s += blockDim.x) {
        last_b[s] = (s >= sl - 2) ? ctc_y(lp, lse, v, tlen - 1, ext(lab, s, blank)) : ninf;
    }
    __syncthreads();
    for (int64_t t = tlen - 2; t >= 0; --t) {
        const double* next = beta + (t + 1) * states_max;
        double* cur = beta + t * states_max;
        for (int64_t s = threadIdx.x; s < sl; s += blockDim.x) {
            int64_t k = ext(lab, s, blank);
            double b = next[s];
            if (s + 1 < sl) b = log_add(b, next[s + 1]);
            // α's skip into s + 2, mirrored (tested on the state skipped into).
            const int64_t k2 = (s + 2 < sl) ? ext(lab, s + 2, blank) : blank;
            if (s + 2 < sl && k2 != blank && k != k2) b = log_add(b, next[s + 2]);
            cur[s] = (b == ninf) ? ninf : b + ctc_y(lp, lse, v, t, k);
        }
        __syncthreads();
    }
    // Pairs (t, j): j < l is label position j (skipped unless it is the
    // first occurrence of its symbol), j == l is the blank.
    const int64_t pairs = tlen * (l + 1);
    for (int64_t i = threadIdx.x; i < pairs; i += blockDim.x) {
        const int64_t t = i / (l + 1);
        const int64_t j = i % (l + 1);
        const double* a = alpha + t * states_max;
        const double* b = beta + t * states_max;
        int64_t k;
        double acc = ninf;
        if (j == l) {
            k = blank;
            for (int64_t s = 0; s < sl; s += 2) acc = log_add(acc, a[s] + b[s]);
            // A label equal to the blank id adds its states to the blank's.
            for (int64_t jj = 0; jj < l; ++jj)
                if (lab[jj] == blank) acc = log_add(acc, a[2 * jj + 1] + b[2 * jj + 1]);
        } else {
            k = lab[j];
            bool first = true;
            for (int64_t jj = 0; jj < j; ++jj) first = first && (lab[jj] != k);
            // The blank's pair (j == l) writes a label equal to the blank id.
            if (!first || k == blank) continue;
            for (int64_t jj = j; jj < l; ++jj)
                if (lab[jj] == k) acc = log_add(acc, a[2 * jj + 1] + b[2 * jj + 1]);
        }
        if (acc != ninf) {
            const double y = ctc_y(lp, lse, v, t, k);
            grad[t * v + k] = T((lse ? exp(y) : 0.0) - exp(acc - y + nll));
        }
    }
}

template <typename T>
__device__ void ctc_loss_impl(const T* log_probs, const double* lse, const int64_t* targets, const int64_t* in_len, const int64_t* tgt_len,
                              double* alpha, double* beta, double* nll, T* grad, int64_t nb, int64_t t_max,
                              int64_t v, int64_t s_max, int64_t blank, int want_grad) {
    const int64_t states_max = 2 * s_max + 1;
    for (int64_t b = blockIdx.x; b < nb; b += gridDim.x) {
        const size_t per = (size_t)t_max * (size_t)v;
        const size_t ws = (size_t)t_max * (size_t)states_max;
        ctc_one<T>(log_probs + b * per, lse ? lse + b * t_max : nullptr, targets + b * s_max, in_len[b], tgt_len[b], v, blank, states_max,
                   alpha + b * ws, beta + b * ws, nll + b, want_grad ? grad + b * per : nullptr, t_max, want_grad);
        // The next sequence of this block reuses nothing, but the shared nll
        // slot must not be overwritten before every thread has read it.
        __syncthreads();
    }
}

// lse[r] = log Σ_k exp(x[r, k]) in f64: one block per row (grid-stride),
// the online max and sum in one read of the row, then the threads' pairs
// folded by a block max and a rescaled block sum. With want_grad, a second
// read of the row writes the fused gradient's dense part: p = exp(x − lse)
// for the frames t < in_len[b] of row r = b·t_max + t, 0 past them.
struct CtcMax {
    __device__ __forceinline__ double operator()(double a, double b) const { return fmax(a, b); }
};

template <typename T>
__device__ void ctc_lse_rows_impl(const T* x, double* lse, T* grad, const int64_t* in_len, int64_t t_max, int64_t rows, int64_t v,
                                  int want_grad) {
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + (size_t)r * (size_t)v;
        double m = -INFINITY, s = 0;
        for (int64_t k = threadIdx.x; k < v; k += blockDim.x) {
            const double xv = (double)xr[k];
            if (xv > m) {
                s = s * exp(m - xv) + 1.0;
                m = xv;
            } else {
                s += exp(xv - m);
            }
        }
        const double mb = block_reduce(m, sh, CtcMax());
        s = block_sum(m == -INFINITY ? 0.0 : s * exp(m - mb), sh);
        const double l = mb + log(s);
        if (threadIdx.x == 0) lse[r] = l;
        if (want_grad) {
            T* gr = grad + (size_t)r * (size_t)v;
            if (r % t_max < in_len[r / t_max])
                for (int64_t k = threadIdx.x; k < v; k += blockDim.x) gr[k] = T(exp((double)xr[k] - l));
            else
                for (int64_t k = threadIdx.x; k < v; k += blockDim.x) gr[k] = T(0);
        }
    }
}

}  // namespace

#define CTC_LOSS(SUFFIX, T)                                                                                     \
    extern "C" __global__ void ctc_loss_##SUFFIX(const T* log_probs, const int64_t* targets,                    \
                                                 const int64_t* in_len, const int64_t* tgt_len, double* alpha,   \
                                                 double* beta, double* nll, T* grad, int64_t nb, int64_t t_max,  \
                                                 int64_t v, int64_t s_max, int64_t blank, int want_grad) {       \
        ctc_loss_impl<T>(log_probs, nullptr, targets, in_len, tgt_len, alpha, beta, nll, grad, nb, t_max, v,    \
                         s_max, blank, want_grad);                                                              \
    }                                                                                                           \
    extern "C" __global__ void ctc_loss_fused_##SUFFIX(                                                        \
        const T* logits, const double* lse, const int64_t* targets, const int64_t* in_len,                     \
        const int64_t* tgt_len, double* alpha, double* beta, double* nll, T* grad, int64_t nb, int64_t t_max,   \
        int64_t v, int64_t s_max, int64_t blank, int want_grad) {                                              \
        ctc_loss_impl<T>(logits, lse, targets, in_len, tgt_len, alpha, beta, nll, grad, nb, t_max, v, s_max,    \
                         blank, want_grad);                                                                     \
    }                                                                                                           \
    extern "C" __global__ void ctc_lse_rows_##SUFFIX(const T* x, double* lse, T* grad, const int64_t* in_len,  \
                                                     int64_t t_max, int64_t rows, int64_t v, int want_grad) {   \
        ctc_lse_rows_impl<T>(x, lse, grad, in_len, t_max, rows, v, want_grad);                                  \
    }

CTC_LOSS(f32, float)
CTC_LOSS(f64, double)
