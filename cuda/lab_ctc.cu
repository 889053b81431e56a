// The kernel lab of the fused CTC (see cuda/README.md, "The kernel lab"):
// numbered variants of `ctc_loss_fused` (cuda/ctc.cu) with its contract: the
// logits (B, T, V) f32 and each row's log-sum-exp (ctc_lse_rows, f64), the
// gradient arriving filled with p_t(k) by ctc_lse_rows; α, β, the
// per-sequence nll (f64) and the occupied (t, k) of the gradient written.
// tests/kernel_lab.rs checks every variant bit for bit against production;
// benches/gpu_kernels.rs (kernel_lab group) times them. Until a GPU has
// measured a variant faster, production stays as it is.
//
//   v1: a warp per sequence instead of a block (blockDim / 32 sequences per
//       block, __syncwarp() instead of __syncthreads() per time step): with
//       L' = 2L + 1 ≈ 41 states for 20 labels, a 256-thread block leaves
//       most of its threads idle at every one of the 2T barriers; a warp
//       keeps one or two states per lane and its barrier costs almost
//       nothing. The same operations per state in the same order as
//       production (ctc_impl.cuh), so the same bits.

#include "ctc_impl.cuh"

extern "C" __global__ void lab_ctc_loss_fused_v1_f32(const float* logits, const double* lse, const int64_t* targets, const int64_t* in_len,
                                                     const int64_t* tgt_len, double* alpha, double* beta, double* nll, float* grad,
                                                     int64_t nb, int64_t t_max, int64_t v, int64_t s_max, int64_t blank, int want_grad) {
    ctc_loss_impl<float, float, CtcWarp>(logits, lse, targets, in_len, tgt_len, alpha, beta, nll, grad, nb, t_max, v, s_max, blank, want_grad);
}
