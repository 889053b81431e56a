// Convolutions for the two shapes the models need.
//
// Depthwise conv1d (the Conformer convolution module): x (B, C, T),
// w (C, 1, K) read as (C, K), bias (C), y and gy (B, C, To),
// To = T + 2p - K + 1, zero padding p on both sides, stride 1:
//   y[b,c,t]   = bias[c] + sum_k w[c,k] * x[b,c,t+k-p]
//   gx[b,c,i]  = sum_k w[c,k] * gy[b,c,i+p-k]           (one thread per input element)
//   gw[c,k]    = sum_{b,t} gy[b,c,t] * x[b,c,t+k-p]     (one block per (c, k))
//   gbias[c]   = sum_{b,t} gy[b,c,t]                    (one block per c)
// Every output element is written by exactly one thread or block, and the
// weight and bias sums go through a fixed shared-memory tree: no atomics,
// reproducible bits.
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
__device__ void depthwise_conv1d_fwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                                     T* __restrict__ y, uint64_t rows, uint32_t c, uint32_t t, uint32_t k, uint32_t pad,
                                     uint32_t to, uint32_t has_bias) {
    typedef typename Num<T>::acc A;
    NN_GRID_STRIDE(e, rows * to) {
        const size_t row = e / to;  // b*C + c
        const long long ot = (long long)(e % to);
        const size_t ch = row % c;
        const T* xr = x + row * t;
        const T* wr = w + ch * k;
        A s = has_bias ? Num<T>::to(bias[ch]) : A(0);
        for (uint32_t kk = 0; kk < k; ++kk) {
            const long long i = ot + kk - (long long)pad;
            if (i >= 0 && i < (long long)t) s += Num<T>::to(wr[kk]) * Num<T>::to(xr[i]);
        }
        y[e] = Num<T>::from(s);
    }
}

template <typename T>
__device__ void depthwise_conv1d_bwd_input(const T* __restrict__ w, const T* __restrict__ gy, T* __restrict__ gx, uint64_t rows,
                                           uint32_t c, uint32_t t, uint32_t k, uint32_t pad, uint32_t to) {
    typedef typename Num<T>::acc A;
    NN_GRID_STRIDE(e, rows * t) {
        const size_t row = e / t;
        const long long i = (long long)(e % t);
        const size_t ch = row % c;
        const T* gr = gy + row * to;
        const T* wr = w + ch * k;
        A s = 0;
        for (uint32_t kk = 0; kk < k; ++kk) {
            const long long ot = i + (long long)pad - kk;
            if (ot >= 0 && ot < (long long)to) s += Num<T>::to(wr[kk]) * Num<T>::to(gr[ot]);
        }
        gx[e] = Num<T>::from(s);
    }
}

// One block per (channel, tap): the B*To products of that tap, tree-summed.
template <typename T>
__device__ void depthwise_conv1d_bwd_weight(const T* __restrict__ x, const T* __restrict__ gy, T* __restrict__ gw, uint64_t b,
                                            uint32_t c, uint32_t t, uint32_t k, uint32_t pad, uint32_t to) {
    typedef typename Num<T>::acc A;
    __shared__ A sh[NN_BLOCK];
    const size_t cnt = b * to;
    NN_BLOCK_ROWS(ck, (uint64_t)c * k) {
        const size_t ch = ck / k;
        const long long kk = (long long)(ck % k);
        A s = 0;
        for (size_t j = threadIdx.x; j < cnt; j += blockDim.x) {
            const size_t row = (j / to) * c + ch;
            const long long ot = (long long)(j % to);
            const long long i = ot + kk - (long long)pad;
            if (i >= 0 && i < (long long)t) s += Num<T>::to(gy[row * to + ot]) * Num<T>::to(x[row * t + i]);
        }
        s = block_reduce(s, sh, SumOp());
        if (threadIdx.x == 0) gw[ck] = Num<T>::from(s);
    }
}

template <typename T>
__device__ void depthwise_conv1d_bwd_bias(const T* __restrict__ gy, T* __restrict__ gb, uint64_t b, uint32_t c, uint32_t to) {
    typedef typename Num<T>::acc A;
    __shared__ A sh[NN_BLOCK];
    const size_t cnt = b * to;
    NN_BLOCK_ROWS(ch, c) {
        A s = 0;
        for (size_t j = threadIdx.x; j < cnt; j += blockDim.x) s += Num<T>::to(gy[((j / to) * c + ch) * to + j % to]);
        s = block_reduce(s, sh, SumOp());
        if (threadIdx.x == 0) gb[ch] = Num<T>::from(s);
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
    extern "C" __global__ void depthwise_conv1d_fwd_##SUF(const T* x, const T* w, const T* bias, T* y, uint64_t rows,       \
                                                          uint32_t c, uint32_t t, uint32_t k, uint32_t pad, uint32_t to,    \
                                                          uint32_t has_bias) {                                              \
        depthwise_conv1d_fwd<T>(x, w, bias, y, rows, c, t, k, pad, to, has_bias);                                           \
    }                                                                                                                       \
    extern "C" __global__ void depthwise_conv1d_bwd_input_##SUF(const T* w, const T* gy, T* gx, uint64_t rows, uint32_t c,  \
                                                                uint32_t t, uint32_t k, uint32_t pad, uint32_t to) {        \
        depthwise_conv1d_bwd_input<T>(w, gy, gx, rows, c, t, k, pad, to);                                                   \
    }                                                                                                                       \
    extern "C" __global__ void depthwise_conv1d_bwd_weight_##SUF(const T* x, const T* gy, T* gw, uint64_t b, uint32_t c,    \
                                                                 uint32_t t, uint32_t k, uint32_t pad, uint32_t to) {       \
        depthwise_conv1d_bwd_weight<T>(x, gy, gw, b, c, t, k, pad, to);                                                     \
    }                                                                                                                       \
    extern "C" __global__ void depthwise_conv1d_bwd_bias_##SUF(const T* gy, T* gb, uint64_t b, uint32_t c, uint32_t to) {   \
        depthwise_conv1d_bwd_bias<T>(gy, gb, b, c, to);                                                                     \
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
