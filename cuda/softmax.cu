// Softmax, log-softmax and masked softmax over the last dim, forward and
// backward.
//
// Layout: x, y, g, gx are (rows, n) row-major. Each kernel comes in two
// shapes (nn_common.cuh): `_warp` kernels give a warp to each row (rows of
// n <= NN_WARP_ROW_MAX; attention's rows of a few hundred, d = 256),
// reducing in registers and by warp shuffles; the others give a block of
// NN_BLOCK threads to each row (the 4233-wide log-softmax of the output
// layer). The host picks.
//
//   softmax:      y = exp(x - m) / s,      m = max x,  s = sum exp(x - m)
//   log_softmax:  y = x - m - log s
//   masked softmax (attention): the same over the elements whose mask byte
//     is 0; an element whose mask byte is non-zero gives y = 0, and a row
//     with every element masked gives zeros (never NaN). The mask (u8) is
//     broadcast to the rows: row r's bytes start at the offset of r through
//     `mrow` (a Strided over the leading dims, 0 along broadcast dims) and
//     step by `mstep` (0 or 1) along the row.
//   softmax backward:     gx = y * (g - sum(g * y))   (masked softmax too:
//     its masked outputs are 0, so their gradient is 0)
//   log_softmax backward: gx = g - exp(y) * sum(g)
//
// The row max is subtracted first (numerically stable); sums accumulate in
// f32 (f64 for f64; f16 and bf16 are read and written in half) in a fixed
// order, the same for both shapes (nn_common.cuh), so results are
// reproducible and do not depend on the shape. A row of plain softmax that
// is all -inf gives NaN, as on the CPU.
#include "nn_common.cuh"

// Rows are read and written by chunks of N = 16 / sizeof(T) elements
// (nn_common.cuh's RowVec: 16-byte loads and stores where the row allows).
template <typename T, bool LOG, typename G>
__device__ void softmax_fwd(const T* __restrict__ x, T* __restrict__ y, uint64_t rows, uint32_t n) {
    typedef typename Num<T>::acc A;
    constexpr int N = RowN<T>::N;
    NN_GROUP_ROWS(G, r, rows) {
        const RowVec<const T, N> xr(x + r * n, n);
        const RowVec<T, N> yr(y + r * n, n);
        const A m = G::template row_reduce<N>(n, A(-INFINITY), NnMax(), [&](uint32_t c) {
            const Vals<T, N> xv = xr.load(c);
            Vals<A, N> o;
#pragma unroll
            for (int j = 0; j < N; ++j) o.v[j] = Num<T>::to(xv.v[j]);
            return o;
        });
        const A s = G::template row_reduce<N>(n, A(0), SumOp(), [&](uint32_t c) {
            const Vals<T, N> xv = xr.load(c);
            Vals<A, N> o;
#pragma unroll
            for (int j = 0; j < N; ++j) o.v[j] = nn_exp(Num<T>::to(xv.v[j]) - m);
            return o;
        });
        const A ls = LOG ? nn_log(s) : A(0);
        const A inv = A(1) / s;
        NN_GROUP_CHUNKS(G, N, c, n) {
            const Vals<T, N> xv = xr.load(c);
            Vals<T, N> o;
#pragma unroll
            for (int j = 0; j < N; ++j)
                o.v[j] = LOG ? Num<T>::from(Num<T>::to(xv.v[j]) - m - ls) : Num<T>::from(nn_exp(Num<T>::to(xv.v[j]) - m) * inv);
            yr.store(c, o);
        }
    }
}

template <typename T, typename G>
__device__ void masked_softmax_fwd(const T* __restrict__ x, const uint8_t* __restrict__ mask, const Strided& mrow, uint64_t mstep,
                                   T* __restrict__ y, uint64_t rows, uint32_t n) {
    typedef typename Num<T>::acc A;
    constexpr int N = RowN<T>::N;
    NN_GROUP_ROWS(G, r, rows) {
        const RowVec<const T, N> xr(x + r * n, n);
        const RowVec<T, N> yr(y + r * n, n);
        const uint8_t* mr = mask + strided_offset(mrow, r);
        // Mask byte of element c*N + j (clamped to the row like RowVec's loads).
        auto masked = [&](uint32_t c, int j) {
            const uint32_t i = c * N + j;
            return mr[(size_t)(i < n ? i : n - 1) * mstep] != 0;
        };
        // Masked elements count as -inf in the max and 0 in the sum.
        const A m = G::template row_reduce<N>(n, A(-INFINITY), NnMax(), [&](uint32_t c) {
            const Vals<T, N> xv = xr.load(c);
            Vals<A, N> o;
#pragma unroll
            for (int j = 0; j < N; ++j) o.v[j] = masked(c, j) ? A(-INFINITY) : Num<T>::to(xv.v[j]);
            return o;
        });
        // m = -inf: every element is masked (a NaN input makes m NaN, and
        // the row NaN, as on the CPU).
        const bool none = m == A(-INFINITY);
        const A s = G::template row_reduce<N>(n, A(0), SumOp(), [&](uint32_t c) {
            const Vals<T, N> xv = xr.load(c);
            Vals<A, N> o;
#pragma unroll
            for (int j = 0; j < N; ++j) o.v[j] = masked(c, j) ? A(0) : nn_exp(Num<T>::to(xv.v[j]) - m);
            return o;
        });
        const A inv = A(1) / s;
        NN_GROUP_CHUNKS(G, N, c, n) {
            const Vals<T, N> xv = xr.load(c);
            Vals<T, N> o;
#pragma unroll
            for (int j = 0; j < N; ++j) o.v[j] = Num<T>::from(none || masked(c, j) ? A(0) : nn_exp(Num<T>::to(xv.v[j]) - m) * inv);
            yr.store(c, o);
        }
    }
}

template <typename T, bool LOG, typename G>
__device__ void softmax_bwd(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ gx, uint64_t rows, uint32_t n) {
    typedef typename Num<T>::acc A;
    constexpr int N = RowN<T>::N;
    NN_GROUP_ROWS(G, r, rows) {
        const RowVec<const T, N> yr(y + r * n, n), gr(g + r * n, n);
        const RowVec<T, N> o(gx + r * n, n);
        const A s = G::template row_reduce<N>(n, A(0), SumOp(), [&](uint32_t c) {
            const Vals<T, N> gv = gr.load(c);
            Vals<A, N> out;
            if (LOG) {
#pragma unroll
                for (int j = 0; j < N; ++j) out.v[j] = Num<T>::to(gv.v[j]);
            } else {
                const Vals<T, N> yv = yr.load(c);
#pragma unroll
                for (int j = 0; j < N; ++j) out.v[j] = Num<T>::to(gv.v[j]) * Num<T>::to(yv.v[j]);
            }
            return out;
        });
        NN_GROUP_CHUNKS(G, N, c, n) {
            const Vals<T, N> yv = yr.load(c), gv = gr.load(c);
            Vals<T, N> out;
#pragma unroll
            for (int j = 0; j < N; ++j) {
                const A a = Num<T>::to(yv.v[j]), b = Num<T>::to(gv.v[j]);
                out.v[j] = Num<T>::from(LOG ? b - nn_exp(a) * s : a * (b - s));
            }
            o.store(c, out);
        }
    }
}

#define SOFTMAX_SHAPE(SUF, T, W, G)                                                                                        \
    extern "C" __global__ void softmax_fwd##W##SUF(const T* x, T* y, uint64_t rows, uint32_t n) {                           \
        softmax_fwd<T, false, G>(x, y, rows, n);                                                                           \
    }                                                                                                                      \
    extern "C" __global__ void log_softmax_fwd##W##SUF(const T* x, T* y, uint64_t rows, uint32_t n) {                       \
        softmax_fwd<T, true, G>(x, y, rows, n);                                                                            \
    }                                                                                                                      \
    extern "C" __global__ void softmax_bwd##W##SUF(const T* y, const T* g, T* gx, uint64_t rows, uint32_t n) {              \
        softmax_bwd<T, false, G>(y, g, gx, rows, n);                                                                       \
    }                                                                                                                      \
    extern "C" __global__ void log_softmax_bwd##W##SUF(const T* y, const T* g, T* gx, uint64_t rows, uint32_t n) {          \
        softmax_bwd<T, true, G>(y, g, gx, rows, n);                                                                        \
    }                                                                                                                      \
    extern "C" __global__ void masked_softmax_fwd##W##SUF(const T* x, const uint8_t* mask, Strided mrow, uint64_t mstep, \
                                                          T* y, uint64_t rows, uint32_t n) {                               \
        masked_softmax_fwd<T, G>(x, mask, mrow, mstep, y, rows, n);                                                        \
    }
// softmax_fwd_f32 (a block per row) and softmax_fwd_warp_f32 (a warp per row), ...
#define SOFTMAX_KERNELS(SUF, T) SOFTMAX_SHAPE(SUF, T, _, BlockRows) SOFTMAX_SHAPE(SUF, T, _warp_, WarpRows)
NN_FLOAT_DTYPES(SOFTMAX_KERNELS)
