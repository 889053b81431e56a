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

// The positional encoding fused with the dropout after it (fusion family
// `posenc`: WeNet's PositionalEncoding, dropout(x·√d + pe[offset + t]), the
// sum cast to the autocast half type where the input is f32), with T the
// input's (and table's) type, O the output's and m the mask above:
//   forward   a = x·s rounded to T          (affine)
//             a = a + pe[row] rounded to T  (add; only with a table)
//             c = a rounded to O            (cast; only where O is not T)
//             y = c·m rounded to O          (dropout_apply; only with drop)
//   backward  h = g·m rounded to O          (dropout_apply; only with drop)
//             gx = h·s rounded to T         (the cast's backward is exact, the add's passes g)
// the composition's operations in its order, so the same bits, in one
// launch each way instead of up to five (narrow, affine, add, cast,
// dropout) and three. Element e of x (B, T, D) reads pe[pe_off + e % td]:
// td = T·D, pe_off = offset·D into the (max_len, D) table, no narrowed copy.
// Calls f(i, kept) for every element i < n, kept its draw (always true
// without `drop`); one thread per Philox block of four elements.
template <typename F>
__device__ __forceinline__ void pos_enc_each(uint64_t n, uint32_t drop, uint64_t seed, uint64_t offset, double keep, F f) {
    NN_GRID_STRIDE(q, (n + 3) / 4) {
        uint4 w = make_uint4(0, 0, 0, 0);
        if (drop) w = philox_block(seed, offset + q);
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const size_t i = q * 4 + l;
            if (i < n) f(i, !drop || philox_keeps(words[l], keep));
        }
    }
}

template <typename T, typename O>
__device__ void pos_enc_dropout_fwd(const T* __restrict__ x, const T* __restrict__ pe, O* __restrict__ y, uint64_t n, uint64_t td,
                                    uint64_t pe_off, uint32_t has_pe, double s, uint32_t drop, uint64_t seed, uint64_t offset,
                                    double keep, double scale) {
    typedef typename Num<T>::acc A;
    typedef typename Num<O>::acc B;
    const A sc = (A)s;
    const B on = Num<O>::to(Num<O>::from_f64(scale)), off = B(0);
    pos_enc_each(n, drop, seed, offset, keep, [&](size_t i, bool kept) {
        A a = Num<T>::to(Num<T>::from(Num<T>::to(x[i]) * sc + A(0)));
        if (has_pe) a = Num<T>::to(Num<T>::from(a + Num<T>::to(pe[pe_off + i % td])));
        const O c = Num<O>::from_f64((double)a);
        y[i] = drop ? Num<O>::from(Num<O>::to(c) * (kept ? on : off)) : c;
    });
}

template <typename T, typename O>
__device__ void pos_enc_dropout_bwd(const O* __restrict__ g, T* __restrict__ gx, uint64_t n, double s, uint32_t drop, uint64_t seed,
                                    uint64_t offset, double keep, double scale) {
    typedef typename Num<T>::acc A;
    typedef typename Num<O>::acc B;
    const A sc = (A)s;
    const B on = Num<O>::to(Num<O>::from_f64(scale)), off = B(0);
    pos_enc_each(n, drop, seed, offset, keep, [&](size_t i, bool kept) {
        const O h = drop ? Num<O>::from(Num<O>::to(g[i]) * (kept ? on : off)) : g[i];
        const T ht = Num<T>::from_f64((double)Num<O>::to(h));
        gx[i] = Num<T>::from(Num<T>::to(ht) * sc + A(0));
    });
}

// The relative positional encoding's rows (fusion family `posenc`):
// y[i] = dropout(pe[pe_off + i]) in T, then rounded to O (the autocast half
// type, where the first attention layer's projection would cast the rows),
// for i < n = T·D: the narrow, dropout and cast of the composition in one
// launch, the same bits. The table is a constant: no backward.
template <typename T, typename O>
__device__ void pos_rows_dropout(const T* __restrict__ pe, O* __restrict__ y, uint64_t n, uint64_t pe_off, uint32_t drop, uint64_t seed,
                                 uint64_t offset, double keep, double scale) {
    typedef typename Num<T>::acc A;
    const A on = Num<T>::to(Num<T>::from_f64(scale)), off = A(0);
    pos_enc_each(n, drop, seed, offset, keep, [&](size_t i, bool kept) {
        const T r = pe[pe_off + i];
        const T d = drop ? Num<T>::from(Num<T>::to(r) * (kept ? on : off)) : r;
        y[i] = Num<O>::from_f64((double)Num<T>::to(d));
    });
}

#define POS_ENC_DROPOUT(TS, T, OS, O)                                                                                   \
    extern "C" __global__ void pos_enc_dropout_fwd_##TS##_##OS(const T* x, const T* pe, O* y, uint64_t n, uint64_t td, \
                                                               uint64_t pe_off, uint32_t has_pe, double s,           \
                                                               uint32_t drop, uint64_t seed, uint64_t offset,        \
                                                               double keep, double scale) {                          \
        pos_enc_dropout_fwd<T, O>(x, pe, y, n, td, pe_off, has_pe, s, drop, seed, offset, keep, scale);              \
    }                                                                                                                 \
    extern "C" __global__ void pos_enc_dropout_bwd_##TS##_##OS(const O* g, T* gx, uint64_t n, double s, uint32_t drop, \
                                                               uint64_t seed, uint64_t offset, double keep,          \
                                                               double scale) {                                       \
        pos_enc_dropout_bwd<T, O>(g, gx, n, s, drop, seed, offset, keep, scale);                                     \
    }                                                                                                                 \
    extern "C" __global__ void pos_rows_dropout_##TS##_##OS(const T* pe, O* y, uint64_t n, uint64_t pe_off,             \
                                                            uint32_t drop, uint64_t seed, uint64_t offset, double keep, \
                                                            double scale) {                                           \
        pos_rows_dropout<T, O>(pe, y, n, pe_off, drop, seed, offset, keep, scale);                                    \
    }
// Each type to itself, and f32 to the two half types (autocast).
POS_ENC_DROPOUT(f32, float, f32, float)
POS_ENC_DROPOUT(f64, double, f64, double)
POS_ENC_DROPOUT(f16, __half, f16, __half)
POS_ENC_DROPOUT(bf16, __nv_bfloat16, bf16, __nv_bfloat16)
POS_ENC_DROPOUT(f32, float, f16, __half)
POS_ENC_DROPOUT(f32, float, bf16, __nv_bfloat16)
