// The CTC recursion shared by the production kernels (ctc.cu) and the
// kernel lab's variants (lab_ctc.cu): α, β, the nll and the sparse part of
// the gradient of one sequence, computed by a group of threads G that
// steps through time together. G is a block (CtcBlock, production: one
// block per sequence, __syncthreads() per time step) or a warp (CtcWarp,
// lab v1: blockDim / 32 sequences per block, __syncwarp() per step). Both
// do the same operations on each state in the same order, so they give the
// same bits. The formulas are in ctc.cu's header.
//
// T is the input's storage type, TG the gradient's: TG = T, except for the
// fused CTC of f16/bf16 logits, which reads them as they are and writes an
// f32 gradient (TG = float), as the composition over their f32 copy did.
#pragma once
#include <math.h>
#include <stdint.h>
#include "common.cuh"

// The most groups (warps) a block holds: one nll slot each.
#define CTC_MAX_GROUPS 32

namespace {

// One block per sequence.
struct CtcBlock {
    static __device__ __forceinline__ int64_t rank() { return threadIdx.x; }
    static __device__ __forceinline__ int64_t size() { return blockDim.x; }
    static __device__ __forceinline__ void sync() { __syncthreads(); }
    static __device__ __forceinline__ int64_t group() { return blockIdx.x; }
    static __device__ __forceinline__ int64_t groups() { return gridDim.x; }
    static __device__ __forceinline__ int slot() { return 0; }
};

// One warp per sequence, blockDim.x / 32 of them per block.
struct CtcWarp {
    static __device__ __forceinline__ int64_t rank() { return threadIdx.x % 32; }
    static __device__ __forceinline__ int64_t size() { return 32; }
    static __device__ __forceinline__ void sync() { __syncwarp(); }
    static __device__ __forceinline__ int64_t group() { return (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; }
    static __device__ __forceinline__ int64_t groups() { return (int64_t)gridDim.x * (blockDim.x / 32); }
    static __device__ __forceinline__ int slot() { return threadIdx.x / 32; }
};

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
    const double x = (double)to_acc(lp[t * v + k]);
    return lse ? x - lse[t] : x;
}

template <typename T, typename TG, typename G>
__device__ void ctc_one(const T* lp, const double* lse, const int64_t* lab, int64_t tlen, int64_t l, int64_t v, int64_t blank,
                        int64_t states_max, double* alpha, double* beta, double* nll_out, TG* grad, int64_t t_max,
                        int want_grad) {
    const int64_t sl = 2 * l + 1;
    const double ninf = -INFINITY;
    __shared__ double nll_sh_all[CTC_MAX_GROUPS];
    double& nll_sh = nll_sh_all[G::slot()];
    // The gradient block arrives filled: zeros (memset), or p_t(k) and zeros
    // past in_len when fused (ctc_lse_rows); only the occupied (t, k) are
    // written here.
    if (tlen == 0) {
        if (G::rank() == 0) *nll_out = (l == 0) ? 0.0 : INFINITY;
        G::sync();
        return;
    }
    for (int64_t s = G::rank(); s < sl; s += G::size()) {
        double a = ninf;
        if (s == 0) a = ctc_y(lp, lse, v, 0, blank);
        else if (s == 1) a = ctc_y(lp, lse, v, 0, ext(lab, 1, blank));
        alpha[s] = a;
    }
    G::sync();
    for (int64_t t = 1; t < tlen; ++t) {
        const double* prev = alpha + (t - 1) * states_max;
        double* cur = alpha + t * states_max;
        for (int64_t s = G::rank(); s < sl; s += G::size()) {
            int64_t k = ext(lab, s, blank);
            double a = prev[s];
            if (s >= 1) a = log_add(a, prev[s - 1]);
            if (s >= 2 && k != blank && k != ext(lab, s - 2, blank)) a = log_add(a, prev[s - 2]);
            cur[s] = (a == ninf) ? ninf : a + ctc_y(lp, lse, v, t, k);
        }
        G::sync();
    }
    const double* last_a = alpha + (tlen - 1) * states_max;
    if (G::rank() == 0) {
        double logp = (sl > 1) ? log_add(last_a[sl - 1], last_a[sl - 2]) : last_a[0];
        nll_sh = -logp;
        *nll_out = -logp;
    }
    G::sync();
    const double nll = nll_sh;
    if (!want_grad) return;
    if (!isfinite(nll)) {
        // Infeasible: a zero gradient (ctc_lse_rows wrote p_t(k) on the fused path).
        if (lse)
            for (int64_t i = G::rank(); i < tlen * v; i += G::size()) grad[i] = TG(0);
        return;
    }
    double* last_b = beta + (tlen - 1) * states_max;
    for (int64_t s = G::rank(); s < sl; s += G::size()) {
        last_b[s] = (s >= sl - 2) ? ctc_y(lp, lse, v, tlen - 1, ext(lab, s, blank)) : ninf;
    }
    G::sync();
    for (int64_t t = tlen - 2; t >= 0; --t) {
        const double* next = beta + (t + 1) * states_max;
        double* cur = beta + t * states_max;
        for (int64_t s = G::rank(); s < sl; s += G::size()) {
            int64_t k = ext(lab, s, blank);
            double b = next[s];
            if (s + 1 < sl) b = log_add(b, next[s + 1]);
            // α's skip into s + 2, mirrored (tested on the state skipped into).
            const int64_t k2 = (s + 2 < sl) ? ext(lab, s + 2, blank) : blank;
            if (s + 2 < sl && k2 != blank && k != k2) b = log_add(b, next[s + 2]);
            cur[s] = (b == ninf) ? ninf : b + ctc_y(lp, lse, v, t, k);
        }
        G::sync();
    }
    // Pairs (t, j): j < l is label position j (skipped unless it is the
    // first occurrence of its symbol), j == l is the blank.
    const int64_t pairs = tlen * (l + 1);
    for (int64_t i = G::rank(); i < pairs; i += G::size()) {
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
            grad[t * v + k] = TG((lse ? exp(y) : 0.0) - exp(acc - y + nll));
        }
    }
}

template <typename T, typename TG, typename G>
__device__ void ctc_loss_impl(const T* log_probs, const double* lse, const int64_t* targets, const int64_t* in_len, const int64_t* tgt_len,
                              double* alpha, double* beta, double* nll, TG* grad, int64_t nb, int64_t t_max,
                              int64_t v, int64_t s_max, int64_t blank, int want_grad) {
    const int64_t states_max = 2 * s_max + 1;
    for (int64_t b = G::group(); b < nb; b += G::groups()) {
        const size_t per = (size_t)t_max * (size_t)v;
        const size_t ws = (size_t)t_max * (size_t)states_max;
        ctc_one<T, TG, G>(log_probs + b * per, lse ? lse + b * t_max : nullptr, targets + b * s_max, in_len[b], tgt_len[b], v, blank, states_max,
                   alpha + b * ws, beta + b * ws, nll + b, want_grad ? grad + b * per : nullptr, t_max, want_grad);
        // The next sequence of this block reuses nothing, but the shared nll
        // slot must not be overwritten before every thread has read it.
        G::sync();
    }
}


}  // namespace
