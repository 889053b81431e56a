// The kernel lab of the `loss` family (see cuda/README.md, "The kernel
// lab"): numbered variants of `label_smoothing_fused_fwd` (cuda/loss.cu)
// that live side by side with the production kernel. Each computes, per row
// of x (N, V) f32, the same row KL and log-sum-exp as the production kernel
// (f64 accumulation, 0 for an ignored row); tests/kernel_lab.rs checks every
// variant against the CPU reference and benches/kernel_lab.rs times each
// against the production kernel. The fastest measured on a GPU is promoted
// into loss.cu; until a GPU has measured them, production stays as it is.
//
//   v1: two passes over the row (max; then Σ exp(x − max) and Σ x), the
//       textbook order: reads the row twice.
//   v2: the production kernel's single online pass, reading the row as
//       Pack16<float> (16-byte loads) where the row start is 16-byte aligned and
//       scalars for the head and tail: the same reads in a quarter of the
//       load instructions.
//
// One block per row (grid-stride over rows), LAB_THREADS threads.

#include <math.h>
#include <stdint.h>
#include "common.cuh"

#define LAB_THREADS 256

namespace {

struct LabMax {
    __device__ __forceinline__ double operator()(double a, double b) const { return fmax(a, b); }
};

__device__ __forceinline__ double lab_qlogq(double q) { return q > 0.0 ? q * log(q) : 0.0; }

// The row's KL from its log-sum-exp, Σ x and x_y (the production formula).
__device__ __forceinline__ double lab_row_kl(double lse, double sx, double xy, int64_t v, double smoothing) {
    const double off = smoothing / ((double)v - 1.0), on = 1.0 - smoothing;
    const double c = (double)(v - 1) * lab_qlogq(off) + lab_qlogq(on);
    return c - off * (sx - (double)v * lse) - (on - off) * (xy - lse);
}

// Folds one value into an online (max, sum of exp(x − max)) pair.
__device__ __forceinline__ void lab_online(double xv, double& m, double& s) {
    if (xv > m) {
        s = s * exp(m - xv) + 1.0;
        m = xv;
    } else {
        s += exp(xv - m);
    }
}

__device__ void lab_ls_fwd_v1(const float* x, const int64_t* target, double* row_kl, double* lse_out, int64_t rows,
                              int64_t v, double smoothing, int64_t ignore) {
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + (size_t)r * (size_t)v;
        const int64_t y = target[r];
        if (y == ignore) {
            if (threadIdx.x == 0) row_kl[r] = lse_out[r] = 0.0;
            continue;
        }
        double m = -INFINITY;
        for (int64_t k = threadIdx.x; k < v; k += blockDim.x) m = fmax(m, (double)xr[k]);
        m = block_reduce(m, sh, LabMax());
        double s = 0, sx = 0;
        for (int64_t k = threadIdx.x; k < v; k += blockDim.x) {
            const double xv = (double)xr[k];
            s += exp(xv - m);
            sx += xv;
        }
        s = block_sum(s, sh);
        sx = block_sum(sx, sh);
        const double lse = m + log(s);
        if (threadIdx.x == 0) {
            row_kl[r] = lab_row_kl(lse, sx, (double)xr[y], v, smoothing);
            lse_out[r] = lse;
        }
    }
}

__device__ void lab_ls_fwd_v2(const float* x, const int64_t* target, double* row_kl, double* lse_out, int64_t rows,
                              int64_t v, double smoothing, int64_t ignore) {
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + (size_t)r * (size_t)v;
        const int64_t y = target[r];
        if (y == ignore) {
            if (threadIdx.x == 0) row_kl[r] = lse_out[r] = 0.0;
            continue;
        }
        double m = -INFINITY, s = 0, sx = 0;
        const int64_t head = elems_to_align16(xr, v);
        const int64_t packs = (v - head) / 4;
        for (int64_t k = threadIdx.x; k < head; k += blockDim.x) {
            const double xv = (double)xr[k];
            sx += xv;
            lab_online(xv, m, s);
        }
        const Pack16<float>* xp = reinterpret_cast<const Pack16<float>*>(xr + head);
        for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
            const Pack16<float> q = xp[p];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const double xv = (double)q.v[j];
                sx += xv;
                lab_online(xv, m, s);
            }
        }
        for (int64_t k = head + 4 * packs + threadIdx.x; k < v; k += blockDim.x) {
            const double xv = (double)xr[k];
            sx += xv;
            lab_online(xv, m, s);
        }
        const double mb = block_reduce(m, sh, LabMax());
        s = block_sum(m == -INFINITY ? 0.0 : s * exp(m - mb), sh);
        sx = block_sum(sx, sh);
        const double lse = mb + log(s);
        if (threadIdx.x == 0) {
            row_kl[r] = lab_row_kl(lse, sx, (double)xr[y], v, smoothing);
            lse_out[r] = lse;
        }
    }
}

}  // namespace

extern "C" __global__ void lab_label_smoothing_fused_fwd_v1_f32(const float* x, const int64_t* target, double* row_kl,
                                                                double* lse, int64_t rows, int64_t v, double smoothing,
                                                                int64_t ignore) {
    lab_ls_fwd_v1(x, target, row_kl, lse, rows, v, smoothing, ignore);
}

extern "C" __global__ void lab_label_smoothing_fused_fwd_v2_f32(const float* x, const int64_t* target, double* row_kl,
                                                                double* lse, int64_t rows, int64_t v, double smoothing,
                                                                int64_t ignore) {
    lab_ls_fwd_v2(x, target, row_kl, lse, rows, v, smoothing, ignore);
}
