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
#include "conv.cuh"
#include "unary.cuh"

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

// Geometry of a conv2d, passed by value.
struct Conv2dGeom {
    uint32_t b, ci, h, w, kh, kw, stride, pad, ho, wo;
};

// The image copies index in I: uint32_t when every index of the launch is
// below 2^31 (the `_u32` kernels, the host checks; on an H200 the 64-bit
// divisions made col2im take 1.6 ms of a 33 ms step), else uint64_t.
// col2im visits only the taps whose offset is a multiple of the stride
// (i ≡ y + pad mod stride): no division or modulo per tap.
template <typename T, typename I>
__device__ void im2col(const T* __restrict__ x, T* __restrict__ cols, Conv2dGeom g) {
    const I hw = (I)g.ho * g.wo, kk = (I)g.kh * g.kw, ckk = (I)g.ci * kk;
    const I total = (I)g.b * ckk * hw;
    for (I e = (I)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (I)gridDim.x * blockDim.x) {
        const I p = e % hw, rb = e / hw;
        const I r = rb % ckk, bi = rb / ckk;
        const I oy = p / g.wo, ox = p - oy * g.wo;
        const I ch = r / kk, rij = r - ch * kk;
        const I i = rij / g.kw, j = rij - i * g.kw;
        // y, x of the tap, offset by pad so the test stays unsigned.
        const I yp = oy * g.stride + i, xp = ox * g.stride + j;
        T v = Num<T>::from(0.0f);
        if (yp >= g.pad && xp >= g.pad && yp - g.pad < g.h && xp - g.pad < g.w)
            v = x[((bi * g.ci + ch) * g.h + (yp - g.pad)) * g.w + (xp - g.pad)];
        cols[e] = v;
    }
}

template <typename T, typename I>
__device__ void col2im(const T* __restrict__ cols, T* __restrict__ gx, Conv2dGeom g) {
    typedef typename Num<T>::acc A;
    const I hw = (I)g.ho * g.wo, ckk = (I)g.ci * g.kh * g.kw;
    const I total = (I)g.b * g.ci * g.h * g.w;
    for (I e = (I)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (I)gridDim.x * blockDim.x) {
        const I row = e / g.w, xx = e - row * g.w;
        const I plane = row / g.h, y = row - plane * g.h;
        const I bi = plane / g.ci, ch = plane - bi * g.ci;
        const T* cb = cols + bi * ckk * hw;
        // Tap i reaches output row oy = (y + pad − i) / stride when that is
        // a whole number in [0, ho): i = (y + pad) mod stride, then every
        // stride-th, while i ≤ y + pad.
        const I yp = y + g.pad, xp = xx + g.pad;
        const I oy0 = yp / g.stride, ox0 = xp / g.stride;
        const I i0 = yp - oy0 * g.stride, j0 = xp - ox0 * g.stride;
        A s = 0;
        for (I i = i0, oy = oy0; i < g.kh && i <= yp; i += g.stride, --oy) {
            if (oy >= g.ho) continue;
            for (I j = j0, ox = ox0; j < g.kw && j <= xp; j += g.stride, --ox) {
                if (ox >= g.wo) continue;
                const I r = (ch * g.kh + i) * g.kw + j;
                s += Num<T>::to(cb[r * hw + oy * g.wo + ox]);
            }
        }
        gx[e] = Num<T>::from(s);
    }
}

// conv2d's image copies in index type I; PRE is empty for the 64-bit
// kernels (im2col_f32) and u32_ for the 32-bit ones (im2col_u32_f32).
#define IMAGE_COPIES(PRE, SUF, T, I)                                                                                    \
    extern "C" __global__ void im2col_##PRE##SUF(const T* x, T* cols, uint32_t b, uint32_t ci, uint32_t h, uint32_t w,  \
                                                 uint32_t kh, uint32_t kw, uint32_t stride, uint32_t pad, uint32_t ho,  \
                                                 uint32_t wo) {                                                         \
        im2col<T, I>(x, cols, Conv2dGeom{b, ci, h, w, kh, kw, stride, pad, ho, wo});                                    \
    }                                                                                                                   \
    extern "C" __global__ void col2im_##PRE##SUF(const T* cols, T* gx, uint32_t b, uint32_t ci, uint32_t h, uint32_t w, \
                                                 uint32_t kh, uint32_t kw, uint32_t stride, uint32_t pad, uint32_t ho,  \
                                                 uint32_t wo) {                                                         \
        col2im<T, I>(cols, gx, Conv2dGeom{b, ci, h, w, kh, kw, stride, pad, ho, wo});                                   \
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
    IMAGE_COPIES(, SUF, T, uint64_t)                                                                                  \
    IMAGE_COPIES(u32_, SUF, T, uint32_t)
// Convolutions run in half precision under mixed precision, so f16/bf16 too.
NN_FLOAT_DTYPES(CONV_KERNELS)

// The conv2d subsampling's per-channel bias and ReLU after its product
// (fusion family `subsampling`), z (B, C, L) = W·cols and bias (C):
//   forward   y = relu(z + bias[c])       the sum rounded to T first, as
//                                         the add stores it, then relu
//   backward  gz = g · relu'(y)           y > 0 exactly where the sum was
//             gbias[c] = sum_{b, l} gz[b, c, l]   in A, rounded to T
// The composition's add, relu, relu's backward and the bias's reduction
// (two sums and, for a half bias, a cast): two launches instead of six,
// and neither the sum nor gz's reduction read twice. Backward: one block
// per row (b, c) (grid-stride over rows) writes the row's gz and its sum
// (block_reduce, a fixed order) into part[row]; the last block to arrive
// (common.cuh last_tile_arrived on `arrivals`, 0 at the launch and 0 after
// it) adds part over b in order into gbias: the same bits every run.
template <typename T>
__device__ void bias_relu_fwd(const T* __restrict__ z, const T* __restrict__ bias, T* __restrict__ y, uint64_t n, uint32_t c,
                              uint64_t l) {
    NN_GRID_STRIDE(e, n) {
        const acc_t<T> s = to_acc(from_acc<T>(to_acc(z[e]) + to_acc(bias[(e / l) % c])));
        y[e] = from_acc<T>(Relu::f(s));
    }
}

template <typename T>
__device__ void bias_relu_bwd(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ gz, acc_t<T>* part,
                              T* __restrict__ gbias, unsigned long long* arrivals, uint64_t b, uint32_t c, uint64_t l) {
    typedef acc_t<T> A;
    __shared__ A red[32];
    for (uint64_t r = blockIdx.x; r < b * c; r += gridDim.x) {
        A s = 0;
        for (uint64_t i = threadIdx.x; i < l; i += blockDim.x) {
            const uint64_t e = r * l + i;
            const A yv = to_acc(y[e]);
            const T v = from_acc<T>(to_acc(g[e]) * Relu::d(yv, yv));
            gz[e] = v;
            s += to_acc(v);
        }
        s = block_sum(s, red);
        if (threadIdx.x == 0) part[r] = s;
    }
    __shared__ int is_last;
    __threadfence();
    if (last_tile_arrived(arrivals, gridDim.x, &is_last)) {
        __threadfence();
        const volatile A* q = part;
        for (uint32_t ch = threadIdx.x; ch < c; ch += blockDim.x) {
            A s = 0;
            for (uint64_t bi = 0; bi < b; ++bi) s += q[bi * c + ch];
            gbias[ch] = from_acc<T>(s);
        }
    }
}

#define BIAS_RELU_KERNELS(SUF, T)                                                                                        \
    extern "C" __global__ void bias_relu_fwd_##SUF(const T* z, const T* bias, T* y, uint64_t n, uint32_t c, uint64_t l) { \
        bias_relu_fwd<T>(z, bias, y, n, c, l);                                                                           \
    }                                                                                                                    \
    extern "C" __global__ void bias_relu_bwd_##SUF(const T* y, const T* g, T* gz, acc_t<T>* part, T* gbias,              \
                                                   unsigned long long* arrivals, uint64_t b, uint32_t c, uint64_t l) {   \
        bias_relu_bwd<T>(y, g, gz, part, gbias, arrivals, b, c, l);                                                      \
    }
NN_FLOAT_DTYPES(BIAS_RELU_KERNELS)
