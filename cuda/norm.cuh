// Normalisation kernels, forward and backward.
//
// layer_norm over the last dim, x (rows, n), w and b (n), mean and rstd (rows):
//   y = (x - mu) * r * w + b,  mu = mean x,  r = 1 / sqrt(var + eps) (biased var)
//   backward: xh = (x - mu) * r, gh = g * w,
//     gx = r * (gh - mean(gh) - xh * mean(gh * xh))
//     gw = sum_rows g * xh, gb = sum_rows g             (column sums)
// add_layer_norm (the residual add before a pre-norm, fusion family `norm`):
//   s = x + alpha * res (stored, rounded to T), y = layer_norm(s)
//   backward: gx = gs + (layer norm's gx of s),  gres = alpha * gx
// the same kernels with the sum formed on the fly and the two gradients
// written in the pass that writes gx (one launch saved each way, and the
// add of the two gradients of s and the scale of gres). With the residual
// dropout folded in (p > 0), res is first multiplied by dropout.cu's mask,
// drawn on the fly from the same (seed, offset, element) Philox words:
//   s = x + alpha * dropout(res),  gres = alpha * mask * gx
// so the dropout's two passes over the branch are gone too.
// A warp per row for rows of n <= NN_WARP_ROW_MAX, else a block per row
// (nn_common.cuh; both give the same bits). The backward is one launch,
// deterministic: each block writes gx and sums g*xh and g per column over
// chunks of consecutive rows, in row order, into partial rows (chunks, n);
// the last block to finish (an arrival counter, common.cuh
// last_tile_arrived: the atomic elects it and carries no value) sums the
// partial rows of each column in chunk order into gw and gb. The same
// inputs give the same bits every run, whatever the grid or the schedule. Layer
// norm also takes f16 and bf16 inputs (autocast's half activations): x, y
// and their gradients in half, the weight, bias, their gradients, mean and
// rstd in f32, every sum in f32.
//
// batch_norm over the channel dim of x (B, C, T) (T = 1 for (B, C) inputs),
// statistics per channel over the B*T values of that channel:
//   stats: mean and biased var, two passes (mean first, then sum (x - mean)^2)
//   apply: y = (x - mean[c]) * rstd[c] * w[c] + b[c]
//   backward sums per channel: sg = sum g, sgx = sum g * xh   (gb = sg, gw = sgx)
//   train: gx = w r (g - sg/N - xh sgx/N), N = B*T;  eval: gx = w r g
// One block per channel for the sums (a fixed tree), one thread per element
// for apply and gx. f32 accumulates in f32, f64 in f64.
// The device templates of norm.cu, shared with conv_module.cu (the fused
// conformer convolution module normalises with the same code paths).
#pragma once
#include "nn_common.cuh"
#include "philox.cuh"

// The residual dropout of add_layer_norm: element e of the branch keeps
// (times `scale`, rounded to the branch's type, as dropout.cu) where the
// uniform draw of Philox word e % 4 of counter block offset + e / 4 (key
// seed) is below `keep`, else is multiplied by 0. `on` 0: no dropout.
struct NnDrop {
    uint64_t seed = 0, offset = 0;
    double keep = 1.0, scale = 1.0;
    uint32_t on = 0;
};

// The scaled mask of elements e0 .. e0 + N - 1 in the acc type of X (a
// counter block drawn once for the elements that share it).
template <typename X, int N>
__device__ __forceinline__ Vals<typename Num<X>::acc, N> nn_drop_mask(const NnDrop& d, uint64_t e0) {
    typedef typename Num<X>::acc A;
    const A on = Num<X>::to(Num<X>::from_f64(d.scale));
    Vals<A, N> m;
    unsigned long long cur = ~0ull;
    uint4 w = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int j = 0; j < N; ++j) {
        const uint64_t e = e0 + j;
        const unsigned long long b = d.offset + e / 4;
        if (b != cur) {
            w = philox_block(d.seed, b);
            cur = b;
        }
        const uint32_t l = (uint32_t)(e & 3);
        const uint32_t q = l == 0 ? w.x : l == 1 ? w.y : l == 2 ? w.z : w.w;
        m.v[j] = philox_keeps(q, d.keep) ? on : A(0);
    }
    return m;
}

// swish(v) = v * sigmoid(v) and its derivative, for the norms that the
// fused conformer convolution module follows with swish (SWISH = true
// below; elementwise.cu's Silu computes the same formulas).
template <typename A> __device__ __forceinline__ A nn_sigmoid(A v) { return A(1) / (A(1) + exp(-v)); }
template <typename A> __device__ __forceinline__ A nn_swish(A v) { return v * nn_sigmoid(v); }
template <typename A> __device__ __forceinline__ A nn_swish_grad(A v) {
    const A s = nn_sigmoid(v);
    return s * (A(1) + v * (A(1) - s));
}

// Rows of x, y, g and gx, and the weight and bias, are read and written by
// chunks of N = 16 / sizeof(T) elements (nn_common.cuh's RowVec): a bf16 row
// chunk of 8 pairs with two 16-byte loads of the f32 weight.
// SWISH: y = swish(the affine result), computed before the one rounding.
// X: x's type when it is not T (the fused convolution module keeps its
// half activations' pre-norm values in f32).
// With `res` (add_layer_norm, the residual add fused into the norm): the
// row normalised is s = x + alpha * res, rounded to X once, as
// ops::add_scaled would store it; s is written too. With `drop.on`, res is
// dropout(res) rounded to X, as dropout.cu would store it. With `rmask`,
// res is 0 in every row r whose rmask[r] is nonzero (the branch's padded
// frames, as masked_fill would zero them before the dropout). Without
// `res`, `res`, `s`, `alpha`, `drop` and `rmask` are unused.
template <typename T, typename W, typename G, bool SWISH = false, typename X = T>
__device__ void layer_norm_fwd(const X* __restrict__ x, const W* __restrict__ w, const W* __restrict__ b, T* __restrict__ y,
                               W* __restrict__ mean, W* __restrict__ rstd, uint64_t rows, uint32_t n, double eps, uint32_t has_w,
                               uint32_t has_b, const X* __restrict__ res = nullptr, X* __restrict__ s = nullptr, double alpha = 0.0,
                               NnDrop drop = NnDrop(), const uint8_t* __restrict__ rmask = nullptr) {
    typedef typename Num<T>::acc A;
    constexpr int N = RowN<T>::N;
    const RowVec<const W, N> wv(w, n), bv(b, n);
    const A al = A(alpha);
    NN_GROUP_ROWS(G, r, rows) {
        const RowVec<const X, N> xr(x + r * n, n), rr(res ? res + r * n : x, n);
        const RowVec<T, N> yr(y + r * n, n);
        const bool zero_res = rmask && rmask[r];
        // Chunk c of the row normalised, as stored in X.
        auto row = [&](uint32_t c) {
            Vals<X, N> xv = xr.load(c);
            if (res) {
                Vals<X, N> rv = rr.load(c);
                if (zero_res) {
#pragma unroll
                    for (int j = 0; j < N; ++j) rv.v[j] = Num<X>::from(A(0));
                } else if (drop.on) {
                    const Vals<A, N> m = nn_drop_mask<X, N>(drop, (uint64_t)r * n + (uint64_t)c * N);
#pragma unroll
                    for (int j = 0; j < N; ++j) rv.v[j] = Num<X>::from(Num<X>::to(rv.v[j]) * m.v[j]);
                }
#pragma unroll
                for (int j = 0; j < N; ++j) xv.v[j] = Num<X>::from(Num<X>::to(xv.v[j]) + al * Num<X>::to(rv.v[j]));
            }
            return xv;
        };
        const A mu = G::template row_reduce<N>(n, A(0), SumOp(),
                                               [&](uint32_t c) {
                                                   const Vals<X, N> xv = row(c);
                                                   Vals<A, N> o;
#pragma unroll
                                                   for (int j = 0; j < N; ++j) o.v[j] = Num<X>::to(xv.v[j]);
                                                   return o;
                                               }) /
                     A(n);
        const A var = G::template row_reduce<N>(n, A(0), SumOp(),
                                                [&](uint32_t c) {
                                                    const Vals<X, N> xv = row(c);
                                                    Vals<A, N> o;
#pragma unroll
                                                    for (int j = 0; j < N; ++j) {
                                                        const A d = Num<X>::to(xv.v[j]) - mu;
                                                        o.v[j] = d * d;
                                                    }
                                                    return o;
                                                }) /
                      A(n);
        const A inv = A(1) / nn_sqrt(var + A(eps));
        NN_GROUP_CHUNKS(G, N, c, n) {
            const Vals<X, N> xv = row(c);
            if (res) RowVec<X, N>(s + r * n, n).store(c, xv);
            Vals<A, N> v;
#pragma unroll
            for (int j = 0; j < N; ++j) v.v[j] = (Num<X>::to(xv.v[j]) - mu) * inv;
            if (has_w) {
                const Vals<W, N> ww = wv.load(c);
#pragma unroll
                for (int j = 0; j < N; ++j) v.v[j] = v.v[j] * Num<W>::to(ww.v[j]);
            }
            if (has_b) {
                const Vals<W, N> bb = bv.load(c);
#pragma unroll
                for (int j = 0; j < N; ++j) v.v[j] = v.v[j] + Num<W>::to(bb.v[j]);
            }
            if (SWISH) {
#pragma unroll
                for (int j = 0; j < N; ++j) v.v[j] = nn_swish(v.v[j]);
            }
            Vals<T, N> o;
#pragma unroll
            for (int j = 0; j < N; ++j) o.v[j] = Num<T>::from(v.v[j]);
            yr.store(c, o);
        }
        if (G::t() == 0) {
            mean[r] = Num<W>::from(mu);
            rstd[r] = Num<W>::from(inv);
        }
    }
}

// Backward: gx of every row, then gw and gb. Rows are cut into chunks of
// `chunk` consecutive rows, one chunk per block (grid-stride over chunks).
// The block's groups (warps or the block) write gx of the chunk's rows;
// then thread `col` sums g*xh and g of column col over the chunk's rows, in
// row order, into partial row c of pw and pb (chunks, n) (it reads only the
// inputs, so it needs no barrier). The last block to finish its chunks
// then adds each column's partial rows in chunk order into gw and gb (what
// a second launch did before: the same order, the same bits). `arrivals`:
// a counter that is 0 at the launch, and 0 again after it.
// SWISH: the forward was swish(layer_norm(x) * w + b) (w and b present):
// g is the gradient of the swish output, and every use of g below is of
// g * swish'(xh * w + b), recomputed from x, the row's statistics, w and b.
// X: the type of x and gx when it is not T's (as layer_norm_fwd).
// With `gy` or `gs` (add_layer_norm's backward; x is then the saved sum s):
// gx gets the gradient that reached s directly added (`gs`, when there is
// one) and, with `gy`, gy = alpha * gx is written too, both from the
// unrounded sum (for alpha 1 the host passes no gy and hands out gx); with
// `drop.on`, gy = mask * (alpha * gx rounded to X), rounded again, as the
// composition's dropout backward of the add's gradient (the forward's mask
// drawn again; gy is then always written). With `rmask`, gy is 0 in every
// row r whose rmask[r] is nonzero (masked_fill's backward; gy written).
template <typename T, typename W, typename G, bool SWISH = false, typename X = T>
__device__ void layer_norm_bwd(const X* __restrict__ x, const W* __restrict__ w, const W* __restrict__ mean, const W* __restrict__ rstd,
                               const T* __restrict__ g, X* __restrict__ gx, W* __restrict__ pw, W* __restrict__ pb,
                               W* __restrict__ gw, W* __restrict__ gb, unsigned long long* arrivals, uint64_t rows,
                               uint32_t n, uint32_t has_w, uint32_t chunk, const W* __restrict__ bias = nullptr,
                               const X* __restrict__ gs = nullptr, X* __restrict__ gy = nullptr, double alpha = 0.0,
                               NnDrop drop = NnDrop(), const uint8_t* __restrict__ rmask = nullptr) {
    typedef typename Num<T>::acc A;
    constexpr int N = RowN<T>::N;
    const RowVec<const W, N> wv(w, n), bv(bias, n);
    const uint64_t chunks = (rows + chunk - 1) / chunk;
    for (uint64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
        const size_t r0 = c * chunk;
        const size_t r1 = r0 + chunk < rows ? r0 + chunk : rows;
        for (size_t r = r0 + G::group(); r < r1; r += G::per_block()) {
            const RowVec<const X, N> xr(x + r * n, n);
            const RowVec<const T, N> gr(g + r * n, n);
            const RowVec<X, N> o(gx + r * n, n);
            const A mu = Num<W>::to(mean[r]), inv = Num<W>::to(rstd[r]);
            // g * w of chunk k (g * swish'(xh * w + b) * w with SWISH).
            auto gh = [&](uint32_t k) {
                const Vals<T, N> gv = gr.load(k);
                Vals<A, N> out;
#pragma unroll
                for (int j = 0; j < N; ++j) out.v[j] = Num<T>::to(gv.v[j]);
                if (SWISH) {
                    const Vals<X, N> xv = xr.load(k);
                    const Vals<W, N> ww = wv.load(k), bb = bv.load(k);
#pragma unroll
                    for (int j = 0; j < N; ++j) {
                        const A xh = (Num<X>::to(xv.v[j]) - mu) * inv;
                        out.v[j] = out.v[j] * nn_swish_grad(xh * A(Num<W>::to(ww.v[j])) + A(Num<W>::to(bb.v[j])));
                    }
                }
                if (has_w) {
                    const Vals<W, N> ww = wv.load(k);
#pragma unroll
                    for (int j = 0; j < N; ++j) out.v[j] = out.v[j] * Num<W>::to(ww.v[j]);
                }
                return out;
            };
            const A m1 = G::template row_reduce<N>(n, A(0), SumOp(), gh) / A(n);
            const A m2 = G::template row_reduce<N>(n, A(0), SumOp(),
                                                   [&](uint32_t k) {
                                                       Vals<A, N> out = gh(k);
                                                       const Vals<X, N> xv = xr.load(k);
#pragma unroll
                                                       for (int j = 0; j < N; ++j) out.v[j] = out.v[j] * (Num<X>::to(xv.v[j]) - mu) * inv;
                                                       return out;
                                                   }) /
                         A(n);
            NN_GROUP_CHUNKS(G, N, k, n) {
                const Vals<A, N> h = gh(k);
                const Vals<X, N> xv = xr.load(k);
                Vals<A, N> d;
#pragma unroll
                for (int j = 0; j < N; ++j) {
                    const A xh = (Num<X>::to(xv.v[j]) - mu) * inv;
                    d.v[j] = inv * (h.v[j] - m1 - xh * m2);
                }
                if (gs) {
                    const Vals<X, N> sv = RowVec<const X, N>(gs + r * n, n).load(k);
#pragma unroll
                    for (int j = 0; j < N; ++j) d.v[j] += Num<X>::to(sv.v[j]);
                }
                Vals<X, N> out;
#pragma unroll
                for (int j = 0; j < N; ++j) out.v[j] = Num<X>::from(d.v[j]);
                o.store(k, out);
                if (gy) {
                    if (rmask && rmask[r]) {
#pragma unroll
                        for (int j = 0; j < N; ++j) out.v[j] = Num<X>::from(A(0));
                    } else if (drop.on) {
                        const Vals<A, N> m = nn_drop_mask<X, N>(drop, (uint64_t)r * n + (uint64_t)k * N);
#pragma unroll
                        for (int j = 0; j < N; ++j) out.v[j] = Num<X>::from(Num<X>::to(Num<X>::from(A(alpha) * d.v[j])) * m.v[j]);
                    } else {
#pragma unroll
                        for (int j = 0; j < N; ++j) out.v[j] = Num<X>::from(A(alpha) * d.v[j]);
                    }
                    RowVec<X, N>(gy + r * n, n).store(k, out);
                }
            }
        }
        for (uint32_t col = threadIdx.x; col < n; col += blockDim.x) {
            A sw = 0, sb = 0;
            for (size_t r = r0; r < r1; ++r) {
                const size_t k = r * n + col;
                A gv = Num<T>::to(g[k]);
                const A xh = (Num<X>::to(x[k]) - Num<W>::to(mean[r])) * Num<W>::to(rstd[r]);
                if (SWISH) gv = gv * nn_swish_grad(xh * A(Num<W>::to(w[col])) + A(Num<W>::to(bias[col])));
                sw += gv * xh;
                sb += gv;
            }
            pw[c * n + col] = Num<W>::from(sw);
            pb[c * n + col] = Num<W>::from(sb);
        }
    }
    // This block's partial rows are written; the last block to get here
    // reads everyone's (fenced on both sides) and adds them in order, all
    // in the parameters' type W.
    __shared__ int is_last;
    __threadfence();
    if (last_tile_arrived(arrivals, gridDim.x, &is_last)) {
        __threadfence();
        typedef typename Num<W>::acc AW;
        const volatile W* qw = pw;
        const volatile W* qb = pb;
        for (uint32_t col = threadIdx.x; col < n; col += blockDim.x) {
            AW sw = 0, sb = 0;
            for (uint64_t c = 0; c < chunks; ++c) {
                const W vw = qw[c * n + col], vb = qb[c * n + col];
                sw += Num<W>::to(vw);
                sb += Num<W>::to(vb);
            }
            gw[col] = Num<W>::from(sw);
            gb[col] = Num<W>::from(sb);
        }
    }
}

// Element i of channel ch (i in [0, B*T)) of x (B, C, T).
__device__ __forceinline__ size_t bn_at(size_t i, size_t ch, uint32_t c, uint64_t t) {
    return ((i / t) * c + ch) * t + i % t;
}

// Training: the batch's mean and rstd = 1/sqrt(biased var + eps), and the
// running statistics moved toward the batch's in place (PyTorch's update,
// the variance unbiased by N/(N-1)), all in one launch. Eval: the running
// mean and 1/sqrt(running var + eps). x in T, everything else in W.
template <typename T, typename W>
__device__ void batch_norm_stats(const T* __restrict__ x, W* __restrict__ run_mean, W* __restrict__ run_var,
                                 W* __restrict__ mean, W* __restrict__ rstd, uint64_t b, uint32_t c, uint64_t t, double eps,
                                 double momentum, uint32_t train) {
    typedef typename Num<T>::acc A;
    __shared__ A sh[NN_BLOCK];
    const size_t cnt = b * t;
    NN_BLOCK_ROWS(ch, c) {
        if (train) {
            A s = 0;
            for (size_t i = threadIdx.x; i < cnt; i += blockDim.x) s += Num<T>::to(x[bn_at(i, ch, c, t)]);
            const A mu = block_reduce(s, sh, SumOp()) / A(cnt);
            A q = 0;
            for (size_t i = threadIdx.x; i < cnt; i += blockDim.x) {
                const A d = Num<T>::to(x[bn_at(i, ch, c, t)]) - mu;
                q += d * d;
            }
            const A v = block_reduce(q, sh, SumOp()) / A(cnt);
            if (threadIdx.x == 0) {
                const A mom = A(momentum);
                mean[ch] = Num<W>::from(mu);
                rstd[ch] = Num<W>::from(A(1) / nn_sqrt(v + A(eps)));
                run_mean[ch] = Num<W>::from(A(Num<W>::to(run_mean[ch])) * (A(1) - mom) + mu * mom);
                run_var[ch] = Num<W>::from(A(Num<W>::to(run_var[ch])) * (A(1) - mom) + v * (A(cnt) / A(cnt - 1)) * mom);
            }
        } else if (threadIdx.x == 0) {
            mean[ch] = run_mean[ch];
            rstd[ch] = Num<W>::from(A(1) / nn_sqrt(A(Num<W>::to(run_var[ch])) + A(eps)));
        }
    }
}

template <typename T, typename W>
__device__ void batch_norm_apply(const T* __restrict__ x, const W* __restrict__ mean, const W* __restrict__ rstd,
                                 const W* __restrict__ w, const W* __restrict__ bias, T* __restrict__ y, uint64_t total, uint32_t c,
                                 uint64_t t) {
    typedef typename Num<T>::acc A;
    NN_GRID_STRIDE(i, total) {
        const size_t ch = (i / t) % c;
        const A v = (Num<T>::to(x[i]) - A(Num<W>::to(mean[ch]))) * A(Num<W>::to(rstd[ch])) * A(Num<W>::to(w[ch])) +
                    A(Num<W>::to(bias[ch]));
        y[i] = Num<T>::from(v);
    }
}

template <typename T, typename W>
__device__ void batch_norm_bwd_sums(const T* __restrict__ x, const W* __restrict__ mean, const W* __restrict__ rstd,
                                    const T* __restrict__ g, W* __restrict__ sg, W* __restrict__ sgx, uint64_t b, uint32_t c,
                                    uint64_t t) {
    typedef typename Num<T>::acc A;
    __shared__ A sh[NN_BLOCK];
    const size_t cnt = b * t;
    NN_BLOCK_ROWS(ch, c) {
        const A mu = Num<W>::to(mean[ch]), inv = Num<W>::to(rstd[ch]);
        A s1 = 0, s2 = 0;
        for (size_t i = threadIdx.x; i < cnt; i += blockDim.x) {
            const size_t k = bn_at(i, ch, c, t);
            const A gv = Num<T>::to(g[k]);
            s1 += gv;
            s2 += gv * (Num<T>::to(x[k]) - mu) * inv;
        }
        s1 = block_reduce(s1, sh, SumOp());
        s2 = block_reduce(s2, sh, SumOp());
        if (threadIdx.x == 0) {
            sg[ch] = Num<W>::from(s1);
            sgx[ch] = Num<W>::from(s2);
        }
    }
}

template <typename T, typename W>
__device__ void batch_norm_bwd_dx(const T* __restrict__ x, const W* __restrict__ w, const W* __restrict__ mean,
                                  const W* __restrict__ rstd, const T* __restrict__ g, const W* __restrict__ sg,
                                  const W* __restrict__ sgx, T* __restrict__ gx, uint64_t total, uint32_t c, uint64_t t,
                                  uint32_t train) {
    typedef typename Num<T>::acc A;
    const A cnt = A(total / c);
    NN_GRID_STRIDE(i, total) {
        const size_t ch = (i / t) % c;
        const A inv = Num<W>::to(rstd[ch]), wr = A(Num<W>::to(w[ch])) * inv, gv = Num<T>::to(g[i]);
        A v;
        if (train) {
            const A xh = (Num<T>::to(x[i]) - A(Num<W>::to(mean[ch]))) * inv;
            v = wr * (gv - A(Num<W>::to(sg[ch])) / cnt - xh * A(Num<W>::to(sgx[ch])) / cnt);
        } else {
            v = wr * gv;
        }
        gx[i] = Num<T>::from(v);
    }
}

// apply and gx in u32 index math (the host's choice when x has fewer than
// 2^31 elements): the channel of element i is (i / t) % c by two
// host-computed divisors (common.cuh FastDiv: a multiply-high, an add and
// a shift each) instead of two 64-bit divisions; t = 1 (channels last)
// divides by 1 exactly.
__device__ __forceinline__ uint32_t bn_channel(uint32_t i, const FastDiv& ft, const FastDiv& fc) {
    const uint32_t q = fast_div(ft, i);
    return q - fast_div(fc, q) * fc.d;
}

template <typename T, typename W>
__device__ void batch_norm_apply_u32(const T* __restrict__ x, const W* __restrict__ mean, const W* __restrict__ rstd,
                                     const W* __restrict__ w, const W* __restrict__ bias, T* __restrict__ y, uint32_t total,
                                     FastDiv ft, FastDiv fc) {
    typedef typename Num<T>::acc A;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
        const uint32_t ch = bn_channel(i, ft, fc);
        const A v = (Num<T>::to(x[i]) - A(Num<W>::to(mean[ch]))) * A(Num<W>::to(rstd[ch])) * A(Num<W>::to(w[ch])) +
                    A(Num<W>::to(bias[ch]));
        y[i] = Num<T>::from(v);
    }
}

template <typename T, typename W>
__device__ void batch_norm_bwd_dx_u32(const T* __restrict__ x, const W* __restrict__ w, const W* __restrict__ mean,
                                      const W* __restrict__ rstd, const T* __restrict__ g, const W* __restrict__ sg,
                                      const W* __restrict__ sgx, T* __restrict__ gx, uint32_t total, FastDiv ft, FastDiv fc,
                                      uint32_t train) {
    typedef typename Num<T>::acc A;
    const A cnt = A(total / fc.d);
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x) {
        const uint32_t ch = bn_channel(i, ft, fc);
        const A inv = Num<W>::to(rstd[ch]), wr = A(Num<W>::to(w[ch])) * inv, gv = Num<T>::to(g[i]);
        A v;
        if (train) {
            const A xh = (Num<T>::to(x[i]) - A(Num<W>::to(mean[ch]))) * inv;
            v = wr * (gv - A(Num<W>::to(sg[ch])) / cnt - xh * A(Num<W>::to(sgx[ch])) / cnt);
        } else {
            v = wr * gv;
        }
        gx[i] = Num<T>::from(v);
    }
}

// Channels-last batch norm (x (N, C), the Conformer convolution module's
// layout): the training statistics and the backward sums as tiled column
// reductions (the shape of reduce.cu's sum_cols_tiled). Channels are cut
// into strips of BN_STRIP = 32, rows into `tiles` tiles of `tile_rows`;
// work item (strip, tile) goes to a block of BN_STRIP x BN_LANES = 256
// threads, grid-stride over the strips * tiles items (a 1-D grid, so a
// capped grid wraps). Thread (lane, rl), rl = the warp: channel strip*32 +
// lane, rows r0 + rl, r0 + rl + BN_LANES, ... of the tile, so a warp reads
// 32 adjacent channels of a row (one 128-byte line in f32: coalesced). The
// BN_LANES partials of a channel are added in lane order, the tile's
// result goes to `part` (strips * tiles * 2 * 32 values of W), and the last
// block of a strip to arrive (an arrival counter per strip of the device's
// kept counters, which it sets back to 0) folds the strip's tile results
// in tile order: the same bits for the same shape whatever the grid or the
// schedule (the atomic only elects the folding block, it feeds no result).
// One launch each.
// Host tiling (src/backend/cuda/norm.rs `bn_tiling`): about 512 items, at
// least 32 rows a tile: at N = 16*128 = 2048, C = 256 that is 8 strips x
// 64 tiles of 32 rows = 512 blocks of 256 threads, about 3.9 blocks (31
// warps) per SM of a 132-SM GPU.
#define BN_STRIP 32
#define BN_LANES 8

// The strip's items share this fold of sh's BN_LANES rows into row 0's
// lanes; returns the fold to the rl == 0 threads (others get 0).
template <typename A>
__device__ __forceinline__ A bn_fold_lanes(A v, A (*sh)[BN_STRIP + 1], uint32_t lane, uint32_t rl) {
    sh[rl][lane] = v;
    __syncthreads();
    A t = A(0);
    if (rl == 0) {
        t = sh[0][lane];
#pragma unroll
        for (int q = 1; q < BN_LANES; ++q) t += sh[q][lane];
    }
    __syncthreads();
    return t;
}

// Training statistics of x (n, c): each tile's mean and sum of squared
// deviations from it (two passes over the tile, the second from cache),
// merged by the folding block in tile order with Chan, Golub and LeVeque's
// pairwise update (mean_ab = mean_a + d nb/n, M2_ab = M2_a + M2_b +
// d^2 na nb / n, d = mean_b - mean_a); then mean, rstd and the running
// statistics as batch_norm_stats. Needs n >= 1 (training: n >= 2).
template <typename T, typename W>
__device__ void batch_norm_stats_cl(const T* __restrict__ x, W* __restrict__ run_mean, W* __restrict__ run_var,
                                    W* __restrict__ mean, W* __restrict__ rstd, W* part, unsigned long long* counters, uint32_t n,
                                    uint32_t c, uint32_t tile_rows, double eps, double momentum) {
    typedef typename Num<T>::acc A;
    __shared__ A sh[BN_LANES][BN_STRIP + 1];
    __shared__ A smu[BN_STRIP];
    __shared__ int is_last;
    const uint32_t strips = (c + BN_STRIP - 1) / BN_STRIP, tiles = (n + tile_rows - 1) / tile_rows;
    const uint32_t lane = threadIdx.x % BN_STRIP, rl = threadIdx.x / BN_STRIP;
    for (uint32_t item = blockIdx.x; item < strips * tiles; item += gridDim.x) {
        const uint32_t s = item / tiles, tile = item - s * tiles;
        const uint32_t ch = s * BN_STRIP + lane;
        const uint32_t r0 = tile * tile_rows, r1 = r0 + tile_rows < n ? r0 + tile_rows : n;
        A acc = A(0);
        if (ch < c)
            for (uint32_t r = r0 + rl; r < r1; r += BN_LANES) acc += Num<T>::to(x[(size_t)r * c + ch]);
        A t = bn_fold_lanes(acc, sh, lane, rl);
        if (rl == 0) smu[lane] = t / A(r1 - r0);
        __syncthreads();
        const A mu = smu[lane];
        acc = A(0);
        if (ch < c)
            for (uint32_t r = r0 + rl; r < r1; r += BN_LANES) {
                const A d = Num<T>::to(x[(size_t)r * c + ch]) - mu;
                acc += d * d;
            }
        t = bn_fold_lanes(acc, sh, lane, rl);
        W* p = part + ((size_t)s * tiles + tile) * 2 * BN_STRIP;
        if (rl == 0) {
            p[lane] = Num<W>::from(mu);
            p[BN_STRIP + lane] = Num<W>::from(t);
            // The tile's results are visible to every block before the
            // counter says this tile is done.
            __threadfence();
        }
        if (last_tile_arrived(&counters[s], (unsigned long long)tiles, &is_last) && rl == 0 && ch < c) {
            __threadfence();
            const volatile W* q = part + (size_t)s * tiles * 2 * BN_STRIP + lane;
            A na = A(tile_rows < n ? tile_rows : n), ma = A(q[0]), m2 = A(q[BN_STRIP]);
            for (uint32_t k = 1; k < tiles; ++k) {
                const uint32_t k0 = k * tile_rows;
                const A nb = A((k0 + tile_rows < n ? k0 + tile_rows : n) - k0);
                const A mb = A(q[(size_t)k * 2 * BN_STRIP]), m2b = A(q[(size_t)k * 2 * BN_STRIP + BN_STRIP]);
                const A nab = na + nb, d = mb - ma;
                ma = ma + d * (nb / nab);
                m2 = m2 + m2b + d * d * (na * nb / nab);
                na = nab;
            }
            const A v = m2 / A(n), mom = A(momentum);
            mean[ch] = Num<W>::from(ma);
            rstd[ch] = Num<W>::from(A(1) / nn_sqrt(v + A(eps)));
            run_mean[ch] = Num<W>::from(A(Num<W>::to(run_mean[ch])) * (A(1) - mom) + ma * mom);
            run_var[ch] = Num<W>::from(A(Num<W>::to(run_var[ch])) * (A(1) - mom) + v * (A(n) / A(n - 1)) * mom);
        }
        // `sh`, `smu` and `is_last` are rewritten by the next item.
        __syncthreads();
    }
}

// Backward sums of x, g (n, c): sg = sum g, sgx = sum g * xh per channel,
// tiled as batch_norm_stats_cl, the folding block adding the tile sums in
// tile order.
// SWISH: the forward was swish(batch_norm(x)) and g its gradient; the sums
// are of g * swish'(xh * w + b) (w, bias the affine parameters). X: x's
// type when it is not T (as layer_norm_fwd).
template <typename T, typename W, bool SWISH = false, typename X = T>
__device__ void batch_norm_bwd_sums_cl(const X* __restrict__ x, const W* __restrict__ mean, const W* __restrict__ rstd,
                                       const T* __restrict__ g, W* __restrict__ sg, W* __restrict__ sgx, W* part,
                                       unsigned long long* counters, uint32_t n, uint32_t c, uint32_t tile_rows,
                                       const W* __restrict__ w = nullptr, const W* __restrict__ bias = nullptr) {
    typedef typename Num<T>::acc A;
    __shared__ A sh[BN_LANES][BN_STRIP + 1];
    __shared__ int is_last;
    const uint32_t strips = (c + BN_STRIP - 1) / BN_STRIP, tiles = (n + tile_rows - 1) / tile_rows;
    const uint32_t lane = threadIdx.x % BN_STRIP, rl = threadIdx.x / BN_STRIP;
    for (uint32_t item = blockIdx.x; item < strips * tiles; item += gridDim.x) {
        const uint32_t s = item / tiles, tile = item - s * tiles;
        const uint32_t ch = s * BN_STRIP + lane;
        const uint32_t r0 = tile * tile_rows, r1 = r0 + tile_rows < n ? r0 + tile_rows : n;
        A s1 = A(0), s2 = A(0);
        if (ch < c) {
            const A mu = Num<W>::to(mean[ch]), inv = Num<W>::to(rstd[ch]);
            const A wc = SWISH ? A(Num<W>::to(w[ch])) : A(0), bc = SWISH ? A(Num<W>::to(bias[ch])) : A(0);
            for (uint32_t r = r0 + rl; r < r1; r += BN_LANES) {
                const size_t k = (size_t)r * c + ch;
                A gv = Num<T>::to(g[k]);
                if (SWISH) {
                    const A xh = (Num<X>::to(x[k]) - mu) * inv;
                    gv = gv * nn_swish_grad(xh * wc + bc);
                    s1 += gv;
                    s2 += gv * xh;
                } else {
                    s1 += gv;
                    s2 += gv * (Num<X>::to(x[k]) - mu) * inv;
                }
            }
        }
        s1 = bn_fold_lanes(s1, sh, lane, rl);
        s2 = bn_fold_lanes(s2, sh, lane, rl);
        W* p = part + ((size_t)s * tiles + tile) * 2 * BN_STRIP;
        if (rl == 0) {
            p[lane] = Num<W>::from(s1);
            p[BN_STRIP + lane] = Num<W>::from(s2);
            __threadfence();
        }
        if (last_tile_arrived(&counters[s], (unsigned long long)tiles, &is_last) && rl == 0 && ch < c) {
            __threadfence();
            const volatile W* q = part + (size_t)s * tiles * 2 * BN_STRIP + lane;
            A t1 = A(0), t2 = A(0);
            for (uint32_t k = 0; k < tiles; ++k) {
                t1 += A(q[(size_t)k * 2 * BN_STRIP]);
                t2 += A(q[(size_t)k * 2 * BN_STRIP + BN_STRIP]);
            }
            sg[ch] = Num<W>::from(t1);
            sgx[ch] = Num<W>::from(t2);
        }
        __syncthreads();
    }
}
