// Dropout in one pass forward and one backward, its mask drawn on the fly
// from a counter-based generator (Philox4x32-10), the same function of
// (seed, offset, element) as the CPU's (src/tensor/rng.rs):
//   block b = offset + i/4, counter (lo32 b, hi32 b, 0, 0), key (lo32 seed, hi32 seed)
//   word  = philox4x32_10(counter, key)[i % 4]
//   u     = (word + 0.5) / 2^32   (in f64, exact)
//   mask[i] = u < keep ? scale : 0,  keep = 1 - p, scale = 1/(1 - p) (0 when p = 1)
// So a GPU mask equals the CPU's bit for bit, and a recompute from the same
// (seed, offset) (the backward, activation checkpointing) draws the same
// mask. One thread per Philox block writes its four elements; the scale is
// rounded from f64 to the dtype once, as the CPU's f64 mask is converted.
#include "nn_common.cuh"

#include "philox.cuh"
#include "unary.cuh"

// y = x * mask (the mask of the header, never stored): element i of x or
// of an output gradient g scaled by the dtype-rounded 1/(1-p) where its
// uniform draw is below keep, else multiplied by 0 (so a NaN stays NaN, as
// a product with a stored mask would). The same kernel is the forward
// (x -> y) and the backward (g -> gx), regenerating the mask from the
// (seed, offset) the forward reserved. Half types are read and written in
// half and multiplied in f32: the product of the value and the half mask,
// rounded once, as the former mask tensor times x gave.
template <typename T>
__device__ void dropout_apply(const T* __restrict__ x, T* __restrict__ y, uint64_t n, uint64_t seed, uint64_t offset, double keep,
                              double scale) {
    typedef typename Num<T>::acc A;
    const A on = Num<T>::to(Num<T>::from_f64(scale)), off = A(0);
    NN_GRID_STRIDE(q, (n + 3) / 4) {
        const uint4 w = philox_block(seed, offset + q);
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const size_t i = q * 4 + l;
            if (i < n) y[i] = Num<T>::from(Num<T>::to(x[i]) * (philox_keeps(words[l], keep) ? on : off));
        }
    }
}

#define DROPOUT_KERNELS(SUF, T)                                                                                         \
    extern "C" __global__ void dropout_apply_##SUF(const T* x, T* y, uint64_t n, uint64_t seed, uint64_t offset,         \
                                                   double keep, double scale) {                                         \
        dropout_apply<T>(x, y, n, seed, offset, keep, scale);                                                           \
    }
NN_FLOAT_DTYPES(DROPOUT_KERNELS)

// An activation f fused with the dropout after it (fusion family `ffn`: the
// feed-forward block's w_2(dropout(f(w_1 x)))), with h = f(x) rounded to T
// as the unfused activation stores it and m the mask above:
//   forward   y  = x -> h, then h * m rounded       (f's _fwd, dropout_apply)
//   backward  gx = (g * m rounded) * f'(x, h)        (dropout_apply, f's _bwd)
// the same operations in the same order as the two kernels each way, so the
// same bits, in one launch each way; h is recomputed in the backward
// instead of being stored, and neither h nor g * m is written.
template <typename Op, typename T>
__device__ void act_dropout(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ out, uint64_t n, uint64_t seed,
                            uint64_t offset, double keep, double scale, bool backward) {
    typedef typename Num<T>::acc A;
    const A on = Num<T>::to(Num<T>::from_f64(scale)), off = A(0);
    NN_GRID_STRIDE(q, (n + 3) / 4) {
        const uint4 w = philox_block(seed, offset + q);
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const size_t i = q * 4 + l;
            if (i >= n) continue;
            const A m = philox_keeps(words[l], keep) ? on : off;
            const A xv = Num<T>::to(x[i]);
            const T h = Num<T>::from(Op::f(xv));
            if (backward) {
                const T gm = Num<T>::from(Num<T>::to(g[i]) * m);
                out[i] = Num<T>::from(Num<T>::to(gm) * Op::d(xv, Num<T>::to(h)));
            } else {
                out[i] = Num<T>::from(Num<T>::to(h) * m);
            }
        }
    }
}

#define ACT_DROPOUT(NAME, OP, SUF, T)                                                                                  \
    extern "C" __global__ void NAME##_dropout_fwd_##SUF(const T* x, T* y, uint64_t n, uint64_t seed, uint64_t offset, \
                                                        double keep, double scale) {                                  \
        act_dropout<OP, T>(x, x, y, n, seed, offset, keep, scale, false);                                             \
    }                                                                                                                 \
    extern "C" __global__ void NAME##_dropout_bwd_##SUF(const T* x, const T* g, T* gx, uint64_t n, uint64_t seed,     \
                                                        uint64_t offset, double keep, double scale) {                 \
        act_dropout<OP, T>(x, g, gx, n, seed, offset, keep, scale, true);                                             \
    }
#define ACT_DROPOUT_KERNELS(SUF, T)          \
    ACT_DROPOUT(relu, Relu, SUF, T)          \
    ACT_DROPOUT(silu, Silu, SUF, T)          \
    ACT_DROPOUT(gelu, Gelu, SUF, T)          \
    ACT_DROPOUT(tanh, Tanh, SUF, T)
NN_FLOAT_DTYPES(ACT_DROPOUT_KERNELS)
