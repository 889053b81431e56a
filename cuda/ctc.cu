// CTC loss (Graves et al., ICML 2006) forward and backward in log space,
// the GPU twin of src/backend/cpu/ctc.rs.
//
// Layouts (row-major, contiguous):
//   log_probs  (B, T, V)   T = f32 or f64 (the fused CTC's logits also f16/bf16)
//   targets    (B, S)      i64, the first target_lengths[b] used
//   in_len, tgt_len (B)    i64
//   alpha, beta (B, T, L') f64 workspace, L' = 2·Smax+1 states per sequence
//   nll        (B)         f64 per-sequence −log p(l | x)
//   grad       (B, T, V)   T (f32 for half logits), ∂nll_b/∂log_probs[b] (zero past in_len[b])
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
// The recursion and the sparse gradient live in ctc_impl.cuh, templated on
// the group of threads that runs one sequence (shared with the kernel lab's
// warp-per-sequence variant, lab_ctc.cu).
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
//
// Half logits (autocast's CTC head) go into the fused CTC as they are: each
// element is widened as it is read, and the gradient is written in f32, the
// same bits as the f32 kernels give for their f32 copy, which is then never
// made. The unfused CTC takes f32/f64 log-probabilities only.

#include "ctc_impl.cuh"

namespace {

// lse[r] = log Σ_k exp(x[r, k]) in f64: one block per row (grid-stride),
// the online max and sum in one read of the row, then the threads' pairs
// folded by a block max and a rescaled block sum. With want_grad, a second
// read of the row writes the fused gradient's dense part: p = exp(x − lse)
// for the frames t < in_len[b] of row r = b·t_max + t, 0 past them.
struct CtcMax {
    __device__ __forceinline__ double operator()(double a, double b) const { return fmax(a, b); }
};

template <typename T, typename TG>
__device__ void ctc_lse_rows_impl(const T* x, double* lse, TG* grad, const int64_t* in_len, int64_t t_max, int64_t rows, int64_t v,
                                  int want_grad) {
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + (size_t)r * (size_t)v;
        double m = -INFINITY, s = 0;
        for (int64_t k = threadIdx.x; k < v; k += blockDim.x) {
            const double xv = (double)to_acc(xr[k]);
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
            TG* gr = grad + (size_t)r * (size_t)v;
            if (r % t_max < in_len[r / t_max])
                for (int64_t k = threadIdx.x; k < v; k += blockDim.x) gr[k] = TG(exp((double)to_acc(xr[k]) - l));
            else
                for (int64_t k = threadIdx.x; k < v; k += blockDim.x) gr[k] = TG(0);
        }
    }
}

}  // namespace

// The fused pair (ctc_lse_rows + ctc_loss_fused) of logits T with a gradient TG.
#define CTC_LOSS_FUSED(SUFFIX, T, TG)                                                                          \
    extern "C" __global__ void ctc_loss_fused_##SUFFIX(                                                        \
        const T* logits, const double* lse, const int64_t* targets, const int64_t* in_len,                     \
        const int64_t* tgt_len, double* alpha, double* beta, double* nll, TG* grad, int64_t nb, int64_t t_max,  \
        int64_t v, int64_t s_max, int64_t blank, int want_grad) {                                              \
        ctc_loss_impl<T, TG, CtcBlock>(logits, lse, targets, in_len, tgt_len, alpha, beta, nll, grad, nb, t_max, v, \
                                       s_max, blank, want_grad);                                               \
    }                                                                                                           \
    extern "C" __global__ void ctc_lse_rows_##SUFFIX(const T* x, double* lse, TG* grad, const int64_t* in_len, \
                                                     int64_t t_max, int64_t rows, int64_t v, int want_grad) {   \
        ctc_lse_rows_impl<T, TG>(x, lse, grad, in_len, t_max, rows, v, want_grad);                              \
    }

#define CTC_LOSS(SUFFIX, T)                                                                                     \
    extern "C" __global__ void ctc_loss_##SUFFIX(const T* log_probs, const int64_t* targets,                    \
                                                 const int64_t* in_len, const int64_t* tgt_len, double* alpha,   \
                                                 double* beta, double* nll, T* grad, int64_t nb, int64_t t_max,  \
                                                 int64_t v, int64_t s_max, int64_t blank, int want_grad) {       \
        ctc_loss_impl<T, T, CtcBlock>(log_probs, nullptr, targets, in_len, tgt_len, alpha, beta, nll, grad, nb, \
                                      t_max, v, s_max, blank, want_grad);                                       \
    }                                                                                                           \
    CTC_LOSS_FUSED(SUFFIX, T, T)

CTC_LOSS(f32, float)
CTC_LOSS(f64, double)
CTC_LOSS_FUSED(f16, f16, float)
CTC_LOSS_FUSED(bf16, bf16, float)
