// Normalisation kernels, forward and backward: the math, the layouts and
// the device templates are in norm.cuh; this file instantiates them.
#include "norm.cuh"

// Layer norm's kernels for input type T and parameter type W: the half
// types read and write x, y, g and gx in half and keep the weight, bias,
// their gradients and the per-row mean and rstd in f32 (W = float),
// accumulating in f32; f32 and f64 use one type for all. `_warp` kernels
// give a warp to each row (rows of n <= NN_WARP_ROW_MAX), the others a
// block. add_layer_norm's kernels (the residual add fused into the norm)
// are the same templates with the sum's operands (norm.cuh).
#define LN_SHAPE(SUF, T, W, S, G)                                                                                          \
    extern "C" __global__ void layer_norm_fwd##S##SUF(const T* x, const W* w, const W* b, T* y, W* mean, W* rstd,          \
                                                      uint64_t rows, uint32_t n, double eps, uint32_t has_w,               \
                                                      uint32_t has_b) {                                                    \
        layer_norm_fwd<T, W, G>(x, w, b, y, mean, rstd, rows, n, eps, has_w, has_b);                                       \
    }                                                                                                                      \
    extern "C" __global__ void layer_norm_bwd##S##SUF(const T* x, const W* w, const W* mean, const W* rstd, const T* g,    \
                                                      T* gx, W* pw, W* pb, W* gw, W* gb, unsigned long long* arrivals,     \
                                                      uint64_t rows, uint32_t n, uint32_t has_w, uint32_t chunk) {         \
        layer_norm_bwd<T, W, G>(x, w, mean, rstd, g, gx, pw, pb, gw, gb, arrivals, rows, n, has_w, chunk);                 \
    }                                                                                                                      \
    extern "C" __global__ void add_layer_norm_fwd##S##SUF(                                                                 \
        const T* x, const T* res, double alpha, const W* w, const W* b, T* s, T* y, W* mean, W* rstd, uint64_t rows,       \
        uint32_t n, double eps, uint32_t has_w, uint32_t has_b, uint64_t seed, uint64_t offset, double keep, double scale, \
        uint32_t has_drop, const uint8_t* rmask, uint32_t has_rmask) {                                                     \
        layer_norm_fwd<T, W, G>(x, w, b, y, mean, rstd, rows, n, eps, has_w, has_b, res, s, alpha,                         \
                                NnDrop{seed, offset, keep, scale, has_drop}, has_rmask ? rmask : nullptr);                 \
    }                                                                                                                      \
    extern "C" __global__ void add_layer_norm_bwd##S##SUF(                                                                 \
        const T* s, const W* w, const W* mean, const W* rstd, const T* g, const T* gs, uint32_t has_gs, double alpha,      \
        T* gx, T* gy, uint32_t has_gy, W* pw, W* pb, W* gw, W* gb, unsigned long long* arrivals, uint64_t rows,           \
        uint32_t n, uint32_t has_w, uint32_t chunk, uint64_t seed, uint64_t offset, double keep, double scale,             \
        uint32_t has_drop, const uint8_t* rmask, uint32_t has_rmask) {                                                     \
        layer_norm_bwd<T, W, G>(s, w, mean, rstd, g, gx, pw, pb, gw, gb, arrivals, rows, n, has_w, chunk, nullptr,        \
                                has_gs ? gs : nullptr, has_gy ? gy : nullptr, alpha,                                       \
                                NnDrop{seed, offset, keep, scale, has_drop}, has_rmask ? rmask : nullptr);                 \
    }
#define LN_KERNELS(SUF, T, W)                                                                                              \
    LN_SHAPE(SUF, T, W, _, BlockRows)                                                                                      \
    LN_SHAPE(SUF, T, W, _warp_, WarpRows)
LN_KERNELS(f32, float, float)
LN_KERNELS(f64, double, double)
LN_KERNELS(f16, __half, float)
LN_KERNELS(bf16, __nv_bfloat16, float)

// Batch norm's kernels for input type T and parameter type W, as layer
// norm's: half inputs keep the weight, bias, statistics and the weight and
// bias gradients in f32.
#define BN_KERNELS(SUF, T, W)                                                                                            \
    extern "C" __global__ void batch_norm_stats_##SUF(const T* x, W* run_mean, W* run_var, W* mean, W* rstd, uint64_t b,   \
                                                      uint32_t c, uint64_t t, double eps, double momentum,                 \
                                                      uint32_t train) {                                                    \
        batch_norm_stats<T, W>(x, run_mean, run_var, mean, rstd, b, c, t, eps, momentum, train);                           \
    }                                                                                                                      \
    extern "C" __global__ void batch_norm_apply_##SUF(const T* x, const W* mean, const W* rstd, const W* w, const W* bias, \
                                                      T* y, uint64_t total, uint32_t c, uint64_t t) {                      \
        batch_norm_apply<T, W>(x, mean, rstd, w, bias, y, total, c, t);                                                    \
    }                                                                                                                      \
    extern "C" __global__ void batch_norm_bwd_sums_##SUF(const T* x, const W* mean, const W* rstd, const T* g, W* sg,      \
                                                         W* sgx, uint64_t b, uint32_t c, uint64_t t) {                     \
        batch_norm_bwd_sums<T, W>(x, mean, rstd, g, sg, sgx, b, c, t);                                                     \
    }                                                                                                                      \
    extern "C" __global__ void batch_norm_bwd_dx_##SUF(const T* x, const W* w, const W* mean, const W* rstd, const T* g,   \
                                                       const W* sg, const W* sgx, T* gx, uint64_t total, uint32_t c,       \
                                                       uint64_t t, uint32_t train) {                                       \
        batch_norm_bwd_dx<T, W>(x, w, mean, rstd, g, sg, sgx, gx, total, c, t, train);                                     \
    }                                                                                                                    \
    extern "C" __global__ void batch_norm_stats_cl_##SUF(const T* x, W* run_mean, W* run_var, W* mean, W* rstd, W* part,   \
                                                         unsigned long long* counters, uint32_t n, uint32_t c,             \
                                                         uint32_t tile_rows, double eps, double momentum) {                \
        batch_norm_stats_cl<T, W>(x, run_mean, run_var, mean, rstd, part, counters, n, c, tile_rows, eps, momentum);       \
    }                                                                                                                    \
    extern "C" __global__ void batch_norm_bwd_sums_cl_##SUF(const T* x, const W* mean, const W* rstd, const T* g, W* sg,   \
                                                            W* sgx, W* part, unsigned long long* counters, uint32_t n,     \
                                                            uint32_t c, uint32_t tile_rows) {                              \
        batch_norm_bwd_sums_cl<T, W>(x, mean, rstd, g, sg, sgx, part, counters, n, c, tile_rows);                          \
    }                                                                                                                    \
    extern "C" __global__ void batch_norm_apply_u32_##SUF(const T* x, const W* mean, const W* rstd, const W* w,            \
                                                          const W* bias, T* y, uint32_t total, FastDiv ft, FastDiv fc) {   \
        batch_norm_apply_u32<T, W>(x, mean, rstd, w, bias, y, total, ft, fc);                                              \
    }                                                                                                                    \
    extern "C" __global__ void batch_norm_bwd_dx_u32_##SUF(const T* x, const W* w, const W* mean, const W* rstd,           \
                                                           const T* g, const W* sg, const W* sgx, T* gx, uint32_t total,   \
                                                           FastDiv ft, FastDiv fc, uint32_t train) {                       \
        batch_norm_bwd_dx_u32<T, W>(x, w, mean, rstd, g, sg, sgx, gx, total, ft, fc, train);                               \
    }
BN_KERNELS(f32, float, float)
BN_KERNELS(f64, double, double)
BN_KERNELS(f16, __half, float)
BN_KERNELS(bf16, __nv_bfloat16, float)
