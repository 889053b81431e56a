// Convolutions for the two shapes the models need.
//
// Depthwise conv1d (the Conformer convolution module), channels last:
// x (B, T, C), w (C, 1, K) read as (C, K), bias (C), y and gy (B, To, C),
// To = T + 2p - K + 1, zero padding p on both sides, stride 1:
//   y[b,t,c]   = bias[c] + sum_k w[c,k] * x[b,t+k-p,c]  (one thread per output element)
//   gx[b,i,c]  = sum_k w[c,k] * gy[b,i+p-k,c]           (one thread per input element)
//   gw[c,k]    = sum_{b,t} gy[b,t,c] * x[b,t+k-p,c]     (a block per (k, 32 channels) ...
//   gbias[c]   = sum_{b,t} gy[b,t,c]                    (... and per 32 c, same launch)
// Consecutive threads take consecutive channels, so every load of a warp is
// one contiguous run of a frame. Every output is written by exactly one
// thread or block summing in a fixed order: no atomics, reproducible bits.
//
// Conv2d (the subsampling front end) is im2col + GEMM: x (B, Ci, H, W),
// w (Co, Ci, kh, kw), stride s, zero padding p, (Ho, Wo) the output size.
// cols (B, Ci*kh*kw, Ho*Wo), row r = (ci*kh + i)*kw + j, column oy*Wo + ox:
//   cols[b, r, oy, ox] = x[b, ci, oy*s + i - p, ox*s + j - p]   (0 outside the image)
// col2im is its adjoint, one thread per input pixel gathering every column
// entry that reads it, in the order r = (ci, i, j) ascending (the CPU's order):
//   gx[b, ci, y, x] = sum_{i,j : (y+p-i) % s == 0, (x+p-j) % s == 0, in range} gcols[b, r, (y+p-i)/s, (x+p-j)/s]
// The GEMMs (y = w · cols, gw = gy · colsᵀ, gcols = wᵀ · gy) run in cuBLAS.
#include "nn_common.cuh"

template <typename T>
__device__ void conv1d_depthwise_fwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                                     T* __restrict__ y, uint32_t b, uint32_t c, uint32_t t, uint32_t k, uint32_t pad,
                                     uint32_t to, uint32_t has_bias) {
    typedef typename Num<T>::acc A;
    NN_GRID_STRIDE(e, (size_t)b * to * c) {
        const size_t ch = e % c;
        const size_t row = e / c;  // bi*To + ot
        const long long ot = (long long)(row % to);
        const T* xb = x + (row / to) * (size_t)t * c + ch;
        const T* wr = w + ch * k;
        A s = has_bias ? Num<T>::to(bias[ch]) : A(0);
        for (uint32_t kk = 0; kk < k; ++kk) {
            const long long i = ot + kk - (long long)pad;
            if (i >= 0 && i < (long long)t) s += Num<T>::to(wr[kk]) * Num<T>::to(xb[(size_t)i * c]);
        }
        y[e] = Num<T>::from(s);
    }
}

template <typename T>
__device__ void conv1d_depthwise_bwd_input(const T* __restrict__ w, const T* __restrict__ gy, T* __restrict__ gx, uint32_t b,
                                           uint32_t c, uint32_t t, uint32_t k, uint32_t pad, uint32_t to) {
    typedef typename Num<T>::acc A;
    NN_GRID_STRIDE(e, (size_t)b * t * c) {
        const size_t ch = e % c;
        const size_t row = e / c;  // bi*T + i
        const long long i = (long long)(row % t);
        const T* gb = gy + (row / t) * (size_t)to * c + ch;
        const T* wr = w + ch * k;
        A s = 0;
        for (uint32_t kk = 0; kk < k; ++kk) {
            const long long ot = i + (long long)pad - kk;
            if (ot >= 0 && ot < (long long)to) s += Num<T>::to(wr[kk]) * Num<T>::to(gb[(size_t)ot * c]);
        }
        gx[e] = Num<T>::from(s);
    }
}

// Weight and bias gradients in one launch: a block per (tap kk, group of 32
// channels) (kk = K: the bias), its NN_BLOCK threads as 32 channel lanes x
// DW_ROWS row lanes. Row lane ly sums the (b, t) terms j = ly, ly + DW_ROWS,
// ... in order (each warp reads 32 consecutive channels of one frame), then
// lane 0 adds the DW_ROWS partial sums in order: a fixed order, reproducible
// bits, no atomics.
#define DW_ROWS (NN_BLOCK / 32)
template <typename T>
__device__ void conv1d_depthwise_bwd_weight(const T* __restrict__ x, const T* __restrict__ gy, T* __restrict__ gw,
                                            T* __restrict__ gbias, uint32_t b, uint32_t c, uint32_t t, uint32_t k, uint32_t pad,
                                            uint32_t to) {
    typedef typename Num<T>::acc A;
    __shared__ A sh[DW_ROWS][32];
    const uint32_t groups = (c + 31) / 32;
    const uint32_t lx = threadIdx.x % 32, ly = threadIdx.x / 32;
    NN_BLOCK_ROWS(blk, (size_t)(k + 1) * groups) {
        const uint32_t kk = (uint32_t)(blk / groups);
        const size_t ch = (blk % groups) * 32 + lx;
        A s = 0;
        if (ch < c) {
            if (kk == k) {
                for (size_t r = ly; r < (size_t)b * to; r += DW_ROWS) s += Num<T>::to(gy[r * c + ch]);
            } else {
                // Output frames ot whose input frame ot + kk - pad is inside x.
                const long long lo0 = (long long)pad - kk, hi0 = (long long)t + pad - kk;
                const size_t lo = lo0 > 0 ? (size_t)lo0 : 0;
                const size_t hi = hi0 < (long long)to ? (hi0 > 0 ? (size_t)hi0 : 0) : to;
                const size_t span = hi > lo ? hi - lo : 0;
                for (size_t j = ly; j < (size_t)b * span; j += DW_ROWS) {
                    const size_t bi = j / span, ot = lo + j % span;
                    s += Num<T>::to(gy[(bi * to + ot) * c + ch]) * Num<T>::to(x[(bi * t + ot + kk - pad) * c + ch]);
                }
            }
        }
        sh[ly][lx] = s;
        __syncthreads();
        if (ly == 0 && ch < c) {
            A tot = 0;
            for (uint32_t r = 0; r < DW_ROWS; ++r) tot += sh[r][lx];
            if (kk == k)
                gbias[ch] = Num<T>::from(tot);
            else
                gw[ch * k + kk] = Num<T>::from(tot);
        }
        __syncthreads();
    }
}

// Geometry of a conv2d, passed by value.
struct Conv2dGeom {
    uint32_t b, ci, h, w, kh, kw, stride, pad, ho, wo;
};

template <typename T>
__device__ void im2col(const T* __restrict__ x, T* __restrict__ cols, Conv2dGeom g) {
    const size_t hw = (size_t)g.ho * g.wo, ckk = (size_t)g.ci * g.kh * g.kw;
    NN_GRID_STRIDE(e, (size_t)g.b * ckk * hw) {
        const size_t p = e % hw;
        const size_t r = (e / hw) % ckk;
        const size_t bi = e / (hw * ckk);
        const size_t oy = p / g.wo, ox = p % g.wo;
        const size_t ch = r / (g.kh * g.kw), i = (r / g.kw) % g.kh, j = r % g.kw;
        const long long y = (long long)(oy * g.stride + i) - g.pad;
        const long long xx = (long long)(ox * g.stride + j) - g.pad;
        T v = Num<T>::from(0.0f);
        if (y >= 0 && xx >= 0 && y < (long long)g.h && xx < (long long)g.w)
            v = x[((bi * g.ci + ch) * g.h + (size_t)y) * g.w + (size_t)xx];
        cols[e] = v;
    }
}

template <typename T>
__device__ void col2im(const T* __restrict__ cols, T* __restrict__ gx, Conv2dGeom g) {
    typedef typename Num<T>::acc A;
    const size_t hw = (size_t)g.ho * g.wo, ckk = (size_t)g.ci * g.kh * g.kw;
    NN_GRID_STRIDE(e, (size_t)g.b * g.ci * g.h * g.w) {
        const long long xx = (long long)(e % g.w);
        const long long y = (long long)((e / g.w) % g.h);
        const size_t ch = (e / ((size_t)g.w * g.h)) % g.ci;
        const size_t bi = e / ((size_t)g.w * g.h * g.ci);
        const T* cb = cols + bi * ckk * hw;
        A s = 0;
        for (uint32_t i = 0; i < g.kh; ++i) {
            const long long ny = y + g.pad - i;
            if (ny < 0 || ny % g.stride != 0) continue;
            const long long oy = ny / g.stride;
            if (oy >= (long long)g.ho) continue;
            for (uint32_t j = 0; j < g.kw; ++j) {
                const long long nx = xx + g.pad - j;
                if (nx < 0 || nx % g.stride != 0) continue;
                const long long ox = nx / g.stride;
                if (ox >= (long long)g.wo) continue;
                const size_t r = (ch * g.kh + i) * g.kw + j;
                s += Num<T>::to(cb[r * hw + (size_t)oy * g.wo + (size_t)ox]);
            }
        }
        gx[e] = Num<T>::from(s);
    }
}

#define CONV_KERNELS(SUF, T)                                                                                                \
    extern "C" __global__ void conv1d_depthwise_fwd_##SUF(const T* x, const T* w, const T* bias, T* y, uint32_t b,          \
                                                          uint32_t c, uint32_t t, uint32_t k, uint32_t pad, uint32_t to,    \
                                                          uint32_t has_bias) {                                              \
        conv1d_depthwise_fwd<T>(x, w, bias, y, b, c, t, k, pad, to, has_bias);                                              \
    }                                                                                                                       \
    extern "C" __global__ void conv1d_depthwise_bwd_input_##SUF(const T* w, const T* gy, T* gx, uint32_t b, uint32_t c,     \
                                                                uint32_t t, uint32_t k, uint32_t pad, uint32_t to) {        \
        conv1d_depthwise_bwd_input<T>(w, gy, gx, b, c, t, k, pad, to);                                                      \
    }                                                                                                                       \
    extern "C" __global__ void conv1d_depthwise_bwd_weight_##SUF(const T* x, const T* gy, T* gw, T* gbias, uint32_t b,      \
                                                                 uint32_t c, uint32_t t, uint32_t k, uint32_t pad,          \
                                                                 uint32_t to) {                                             \
        conv1d_depthwise_bwd_weight<T>(x, gy, gw, gbias, b, c, t, k, pad, to);                                              \
    }                                                                                                                       \
    extern "C" __global__ void im2col_##SUF(const T* x, T* cols, uint32_t b, uint32_t ci, uint32_t h, uint32_t w,           \
                                            uint32_t kh, uint32_t kw, uint32_t stride, uint32_t pad, uint32_t ho,           \
                                            uint32_t wo) {                                                                  \
        im2col<T>(x, cols, Conv2dGeom{b, ci, h, w, kh, kw, stride, pad, ho, wo});                                           \
    }                                                                                                                       \
    extern "C" __global__ void col2im_##SUF(const T* cols, T* gx, uint32_t b, uint32_t ci, uint32_t h, uint32_t w,          \
                                            uint32_t kh, uint32_t kw, uint32_t stride, uint32_t pad, uint32_t ho,           \
                                            uint32_t wo) {                                                                  \
        col2im<T>(cols, gx, Conv2dGeom{b, ci, h, w, kh, kw, stride, pad, ho, wo});                                          \
    }
// Convolutions run in half precision under mixed precision, so f16/bf16 too.
NN_FLOAT_DTYPES(CONV_KERNELS)
