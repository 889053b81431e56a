// The Conformer convolution module fused between its two pointwise GEMMs
// (src/ops/conv_module.rs `conv_module_core`; the composition it replaces is
// glu -> masked_fill -> conv1d_depthwise -> batch or layer norm -> silu).
//
// Layouts, channels last throughout: a (B, T, 2C) = pointwise_conv1's output
// (T = T' of the module: frames plus the causal left context), its halves
// a[.., :C] and a[.., C:]; mask (B, T) u8, 1 = a padded frame whose GLU
// output is zeroed; w (C, 1, K) read as (C, K), bias (C); z, y, gy (B, To, C),
// To = T + 2p - K + 1; norm weight, bias and statistics (C) and z in W (f32
// for half inputs: z is kept unrounded, since the norm amplifies z's
// rounding error by |z| / std(z); the composition rounds z to half).
//
//   h[b,i,c]  = mask[b,i] ? 0 : a[b,i,c] * s(a[b,i,C+c]),  s = sigmoid
//   z[b,t,c]  = bias[c] + sum_k w[c,k] * h[b,t+k-p,c]        (K1, saved)
//   u         = norm(z) * nw + nb;  y = swish(u) = u * s(u)   (K2)
// BatchNorm: statistics over all B*To rows (norm.cuh batch_norm_stats_cl via
// the norm module's launch, as the composition; the running statistics move
// there), then K2 elementwise. LayerNorm: K2 is norm.cuh's layer_norm_fwd
// with SWISH (a warp or a block per frame), saving each frame's mean, rstd.
//
// Backward, from gy: gu = gy * swish'(u), u recomputed from z and the
// statistics;
//   BatchNorm: sg = sum gu, sgx = sum gu * zh per channel (norm.cuh's tiled
//     batch_norm_bwd_sums_cl with SWISH); dz = nw r (gu - sg/N - zh sgx/N)
//     (training) or nw r gu (eval) elementwise; gnw = sgx, gnb = sg.
//   LayerNorm: norm.cuh's layer_norm_bwd with SWISH (dz, and gnw, gnb
//     folded from the partial rows by the last block).
//   K1': one thread per input element (b, i, c): gh = sum_k w[c,k] *
//     dz[b,i+p-k,c] (conv.cu's input gradient), zeroed on a masked frame,
//     then GLU's backward into both halves of da (recomputing s from a),
//     and h written for the weight gradient;
//   gw, gbias: conv.cuh's conv1d_depthwise_bwd_weight on (h, dz) (deterministic).
// dz and h are kept in W too (f32 for half activations): the input
// gradient sums K products w dz that cancel, which would amplify a half
// rounding of dz; only da, gw and gbias are rounded to T, once.
// Math in Num<T>::acc (f32 for f16/bf16); every output written by one thread
// (no atomics beyond norm.cuh's tile election). Compared with the
// composition, h, z and u are never rounded to T (one rounding fewer each).
#include "conv.cuh"
#include "norm.cuh"


template <typename T, typename W>
__device__ void conv_module_glu_dw_fwd(const T* __restrict__ a, const uint8_t* __restrict__ mask, const T* __restrict__ w,
                                       const T* __restrict__ bias, W* __restrict__ z, uint32_t b, uint32_t c, uint32_t t,
                                       uint32_t k, uint32_t pad, uint32_t to, uint32_t has_bias, uint32_t has_mask) {
    typedef typename Num<T>::acc A;
    const size_t c2 = 2 * (size_t)c;
    NN_GRID_STRIDE(e, (size_t)b * to * c) {
        const size_t ch = e % c;
        const size_t row = e / c;  // bi*To + ot
        const size_t bi = row / to;
        const long long ot = (long long)(row % to);
        const T* ab = a + bi * (size_t)t * c2 + ch;
        const uint8_t* mb = mask + bi * (size_t)t;
        const T* wr = w + ch * k;
        A s = has_bias ? Num<T>::to(bias[ch]) : A(0);
        for (uint32_t kk = 0; kk < k; ++kk) {
            const long long i = ot + kk - (long long)pad;
            if (i < 0 || i >= (long long)t || (has_mask && mb[i])) continue;
            const T* ai = ab + (size_t)i * c2;
            const A h = Num<T>::to(ai[0]) * nn_sigmoid(Num<T>::to(ai[c]));
            s += Num<T>::to(wr[kk]) * h;
        }
        z[e] = Num<W>::from(s);
    }
}

// y = swish((z - mean) rstd nw + nb) over z (n, c) channels last.
template <typename T, typename W>
__device__ void conv_module_bn_swish_fwd(const W* __restrict__ z, const W* __restrict__ mean, const W* __restrict__ rstd,
                                         const W* __restrict__ w, const W* __restrict__ bias, T* __restrict__ y, uint64_t total,
                                         uint32_t c) {
    typedef typename Num<T>::acc A;
    NN_GRID_STRIDE(i, total) {
        const size_t ch = i % c;
        const A u = (A(Num<W>::to(z[i])) - A(Num<W>::to(mean[ch]))) * A(Num<W>::to(rstd[ch])) * A(Num<W>::to(w[ch])) +
                    A(Num<W>::to(bias[ch]));
        y[i] = Num<T>::from(nn_swish(u));
    }
}

// dz of the batch norm + swish from gy and the sums sg, sgx of gu.
template <typename T, typename W>
__device__ void conv_module_bn_swish_bwd_dz(const W* __restrict__ z, const W* __restrict__ w, const W* __restrict__ bias,
                                            const W* __restrict__ mean, const W* __restrict__ rstd, const T* __restrict__ g,
                                            const W* __restrict__ sg, const W* __restrict__ sgx, W* __restrict__ dz,
                                            uint64_t total, uint32_t c, uint32_t train) {
    typedef typename Num<T>::acc A;
    const A cnt = A(total / c);
    NN_GRID_STRIDE(i, total) {
        const size_t ch = i % c;
        const A inv = Num<W>::to(rstd[ch]), wc = Num<W>::to(w[ch]);
        const A zh = (A(Num<W>::to(z[i])) - A(Num<W>::to(mean[ch]))) * inv;
        const A gu = Num<T>::to(g[i]) * nn_swish_grad(zh * wc + A(Num<W>::to(bias[ch])));
        const A wr = wc * inv;
        const A v = train ? wr * (gu - A(Num<W>::to(sg[ch])) / cnt - zh * A(Num<W>::to(sgx[ch])) / cnt) : wr * gu;
        dz[i] = Num<W>::from(v);
    }
}

// K1': the depthwise conv's input gradient through the mask and the GLU:
// one thread per element (b, i, c) of h writes da[b,i,c], da[b,i,C+c] and
// h[b,i,c] (the weight gradient's input).
template <typename T, typename W>
__device__ void conv_module_dw_glu_bwd(const T* __restrict__ a, const uint8_t* __restrict__ mask, const T* __restrict__ w,
                                       const W* __restrict__ dz, T* __restrict__ da, W* __restrict__ h, uint32_t b, uint32_t c,
                                       uint32_t t, uint32_t k, uint32_t pad, uint32_t to, uint32_t has_mask) {
    typedef typename Num<T>::acc A;
    const size_t c2 = 2 * (size_t)c;
    NN_GRID_STRIDE(e, (size_t)b * t * c) {
        const size_t ch = e % c;
        const size_t row = e / c;  // bi*T + i
        const size_t bi = row / t;
        const long long i = (long long)(row % t);
        const bool masked = has_mask && mask[row];
        A gh = 0;
        if (!masked) {
            const W* gb = dz + bi * (size_t)to * c + ch;
            const T* wr = w + ch * k;
            for (uint32_t kk = 0; kk < k; ++kk) {
                const long long ot = i + (long long)pad - kk;
                if (ot >= 0 && ot < (long long)to) gh += Num<T>::to(wr[kk]) * A(Num<W>::to(gb[(size_t)ot * c]));
            }
        }
        const T* ar = a + row * c2;
        const A av = Num<T>::to(ar[ch]), s = nn_sigmoid(Num<T>::to(ar[c + ch]));
        h[e] = Num<W>::from(masked ? A(0) : av * s);
        da[row * c2 + ch] = Num<T>::from(gh * s);
        da[row * c2 + c + ch] = Num<T>::from((gh * av) * (s * (A(1) - s)));
    }
}


// The norm + swish kernels for input type T and parameter type W (half
// inputs keep the norm's parameters and statistics in f32, as norm.cu).
#define CM_LN_SHAPE(SUF, T, W, S, G)                                                                                      \
    extern "C" __global__ void conv_module_ln_swish_fwd##S##SUF(const W* z, const W* w, const W* b, T* y, W* mean,         \
                                                                W* rstd, uint64_t rows, uint32_t n, double eps) {          \
        layer_norm_fwd<T, W, G, true, W>(z, w, b, y, mean, rstd, rows, n, eps, 1, 1);                                         \
    }                                                                                                                     \
    extern "C" __global__ void conv_module_ln_swish_bwd##S##SUF(const W* z, const W* w, const W* b, const W* mean,         \
                                                                const W* rstd, const T* g, W* dz, W* pw, W* pb, W* gw,     \
                                                                W* gb, unsigned long long* arrivals, uint64_t rows,        \
                                                                uint32_t n, uint32_t chunk) {                              \
        layer_norm_bwd<T, W, G, true, W>(z, w, mean, rstd, g, dz, pw, pb, gw, gb, arrivals, rows, n, 1, chunk, b);            \
    }
#define CM_NORM_KERNELS(SUF, T, W)                                                                                        \
    extern "C" __global__ void conv_module_dw_glu_bwd_##SUF(const T* a, const uint8_t* mask, const T* w, const W* dz,       \
                                                            T* da, W* h, uint32_t b, uint32_t c, uint32_t t, uint32_t k,   \
                                                            uint32_t pad, uint32_t to, uint32_t has_mask) {                \
        conv_module_dw_glu_bwd<T, W>(a, mask, w, dz, da, h, b, c, t, k, pad, to, has_mask);                                \
    }                                                                                                                     \
    extern "C" __global__ void conv_module_dw_bwd_weight_##SUF(const W* h, const W* dz, T* gw, T* gbias, uint32_t b,        \
                                                               uint32_t c, uint32_t t, uint32_t k, uint32_t pad,           \
                                                               uint32_t to) {                                              \
        conv1d_depthwise_bwd_weight<T, W>(h, dz, gw, gbias, b, c, t, k, pad, to);                                          \
    }                                                                                                                     \
    extern "C" __global__ void conv_module_glu_dw_fwd_##SUF(const T* a, const uint8_t* mask, const T* w, const T* bias,     \
                                                            W* z, uint32_t b, uint32_t c, uint32_t t, uint32_t k,          \
                                                            uint32_t pad, uint32_t to, uint32_t has_bias,                  \
                                                            uint32_t has_mask) {                                           \
        conv_module_glu_dw_fwd<T, W>(a, mask, w, bias, z, b, c, t, k, pad, to, has_bias, has_mask);                        \
    }                                                                                                                     \
    CM_LN_SHAPE(SUF, T, W, _, BlockRows)                                                                                  \
    CM_LN_SHAPE(SUF, T, W, _warp_, WarpRows)                                                                              \
    extern "C" __global__ void conv_module_bn_swish_fwd_##SUF(const W* z, const W* mean, const W* rstd, const W* w,        \
                                                              const W* bias, T* y, uint64_t total, uint32_t c) {           \
        conv_module_bn_swish_fwd<T, W>(z, mean, rstd, w, bias, y, total, c);                                               \
    }                                                                                                                     \
    extern "C" __global__ void conv_module_bn_swish_bwd_sums_cl_##SUF(const W* z, const W* mean, const W* rstd,            \
                                                                      const W* w, const W* bias, const T* g, W* sg,        \
                                                                      W* sgx, W* part, unsigned long long* counters,       \
                                                                      uint32_t n, uint32_t c, uint32_t tile_rows) {        \
        batch_norm_bwd_sums_cl<T, W, true, W>(z, mean, rstd, g, sg, sgx, part, counters, n, c, tile_rows, w, bias);           \
    }                                                                                                                     \
    extern "C" __global__ void conv_module_bn_swish_bwd_dz_##SUF(const W* z, const W* w, const W* bias, const W* mean,     \
                                                                 const W* rstd, const T* g, const W* sg, const W* sgx,     \
                                                                 W* dz, uint64_t total, uint32_t c, uint32_t train) {      \
        conv_module_bn_swish_bwd_dz<T, W>(z, w, bias, mean, rstd, g, sg, sgx, dz, total, c, train);                        \
    }
CM_NORM_KERNELS(f32, float, float)
CM_NORM_KERNELS(f64, double, double)
CM_NORM_KERNELS(f16, __half, float)
CM_NORM_KERNELS(bf16, __nv_bfloat16, float)
