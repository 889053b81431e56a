// Flash attention with relative positions (WeNet's rel_selfattn without
// rel_shift), plain, causal and cross attention, forward and backward; the
// T1 x T2 score matrix is never written to global memory.
//
// Layouts (row-major): q, o, dout, dq (B, T1, H, d); k, v, dk, dv (B, T2, H, d)
// (the projections' layout, no head permutes); p (PB, T2, H, d) with PB 1
// (one table for every sequence) or B; u, vb (H, d) in the compute type;
// lse, dsum (B, H, T1) and sk (B, T2, H) in the compute type; dp (B, T2, H, d)
// in the compute type (summed over b on the host when PB is 1).
//
//   s_ij  = ((q_i + u)·k_j + (q_i + vb)·p_j) · scale        (scale = 1/sqrt(d))
//         = (q_i·(k_j + p_j) + c_j) · scale,   c_j = u·k_j + vb·p_j
//   (without positions: s_ij = q_i·k_j · scale)
//   masked (i, j): j >= lens[b]; causal and j > i; chunk c: j >= (i/c + 1)·c,
//     or, with `left` >= 0 left chunks, j < max(i/c - left, 0)·c (WeNet's
//     subsequent_chunk_mask); or mask[b·mb + i·mi + j·mj] != 0.
//   P_ij  = exp(s_ij - m_i) / l_i over the unmasked j (masked: exactly 0; a
//     row with every key masked gives P = 0 and o_i = 0, never NaN)
//   Z_ij  = dropout's scaled keep mask, the Philox word of element
//     ((b·H + h)·T1 + i)·T2 + j of a draw at (seed, offset): the mask
//     ops::dropout would draw over the (B, H, T1, T2) probabilities
//   o_i   = sum_j P_ij Z_ij v_j;          lse_i = m_i + log l_i (+inf: fully masked)
//
// Backward (FlashAttention-2's scheme, recomputing s per tile from lse):
//   D_i   = dout_i·o_i   (= sum_j P_ij Z_ij (dout_i·v_j), computed so, by one
//           more pass over the keys, for f16/bf16 whose o is rounded)
//   dS_ij = P_ij (Z_ij (dout_i·v_j) - D_i)
//   dq_i  = scale · sum_j dS_ij (k_j + p_j)
//   dv_j  = sum_i P_ij Z_ij dout_i
//   G_j   = sum_i dS_ij q_i,   s_j = sum_i dS_ij
//   dk_j  = scale (G_j + u s_j),   dp_j = scale (G_j + vb s_j)
//   du    = sum_{b,j} scale s_j k_j,   dvb = sum_{b,j} scale s_j p_j   (host, from sk)
//
// Shape: a block of ATT_THREADS threads per (b, h, tile of TL rows), the
// units grid-strided so any grid covers them. Forward and dq: a query tile,
// the key tiles in turn through shared memory, online softmax in the
// compute type (f32 for f32/f16/bf16). dk/dv: a key tile, the query tiles
// in turn, its accumulators in registers. Two backward kernels instead of
// atomics: dq's sums are in a fixed order, so results are reproducible.
// Head dims up to ATT_DMAX (64 and 128 are the targets). Scalar tiles; the
// tensor-core (wmma) variant is future work. Shared memory: at most 42 KiB
// static per block (dq, f32), no register spills (ptxas, sm_90).
//
// Status: passed tests/cuda_attention.rs on an H200 (2026-12-04), and
// racecheck found no hazard; there it is 2.2x slower than the composition
// (scalar tiles against cuBLAS), so the attention fusion stays off by
// default until the tensor-core variant beats it (cuda/README.md).
#include "nn_common.cuh"

#include "philox.cuh"

#define ATT_THREADS 128
#define ATT_DMAX 128

// Rows per tile: 16 in f32 (4 tiles of 16 x 128 floats = 32 KiB), 8 in f64.
template <typename A> struct AttTile { static constexpr int n = 16; };
template <> struct AttTile<double> { static constexpr int n = 8; };

struct AttMask {
    const long long* lens;
    uint32_t chunk;
    int32_t left;
    uint32_t causal;
    const uint8_t* mask;
    uint64_t mb, mi, mj;
    __device__ __forceinline__ bool masked(uint32_t b, uint32_t i, uint32_t j) const {
        if (lens && (long long)j >= lens[b]) return true;
        if (causal && j > i) return true;
        if (chunk) {
            const uint32_t c = i / chunk;
            if (j >= (c + 1) * chunk) return true;
            if (left >= 0 && c > (uint32_t)left && j < (c - (uint32_t)left) * chunk) return true;
        }
        return mask && mask[b * mb + i * mi + j * mj] != 0;
    }
};

template <typename A> struct AttDrop {
    uint2 key;
    uint64_t offset;
    double keep;
    A z;
    // Z of element e of the draw: z where its uniform is below keep, else 0.
    __device__ __forceinline__ A factor(uint64_t e) const {
        if (keep >= 1.0) return A(1);
        const unsigned long long b = offset + e / 4;
        const uint4 w = philox4x32_10(make_uint4((uint32_t)b, (uint32_t)(b >> 32), 0u, 0u), key);
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
        return ((double)words[e % 4] + 0.5) / 4294967296.0 < keep ? z : A(0);
    }
};

// Every kernel's leading parameters: inputs, sizes, mask and dropout.
#define ATT_PARAMS(T, A)                                                                                                 \
    const T *q, const T *k, const T *v, const T *p_, uint32_t flags, const A *u_, const A *vb_, uint32_t B, uint32_t T1,   \
        uint32_t T2, uint32_t H, uint32_t d, A scale, const long long *lens_, uint32_t chunk, int32_t left, uint32_t causal, \
        const uint8_t *mask_, uint64_t mb, uint64_t mi, uint64_t mj, uint64_t seed, uint64_t offset, double keep, double dscale
#define ATT_ARGS q, k, v, p_, flags, u_, vb_, B, T1, T2, H, d, scale, lens_, chunk, left, causal, mask_, mb, mi, mj, seed, offset, keep, dscale

// `flags`: which optional inputs are real (the others' pointers are any
// valid buffer, never read): ATT_POS p, u and vb; ATT_POS_PER_SEQ p has B
// tables; ATT_LENS key lengths; ATT_MASK the mask tensor.
#define ATT_POS 1u
#define ATT_POS_PER_SEQ 2u
#define ATT_LENS 4u
#define ATT_MASK 8u

#define ATT_SETUP(A)                                                                                                     \
    const T* p = (flags & ATT_POS) ? p_ : nullptr;                                                                       \
    const A* u = (flags & ATT_POS) ? u_ : nullptr;                                                                       \
    const A* vb = (flags & ATT_POS) ? vb_ : nullptr;                                                                     \
    const uint32_t p_per_seq = (flags & ATT_POS_PER_SEQ) ? 1u : 0u;                                                      \
    const long long* lens = (flags & ATT_LENS) ? lens_ : nullptr;                                                        \
    const uint8_t* mask = (flags & ATT_MASK) ? mask_ : nullptr;                                                          \
    const AttMask mk{lens, chunk, left, causal, mask, mb, mi, mj};                                                       \
    const AttDrop<A> dr{make_uint2((uint32_t)seed, (uint32_t)(seed >> 32)), offset, keep, Num<T>::to(Num<T>::from_f64(dscale))}; \
    const uint32_t tid = threadIdx.x, nt = blockDim.x

// Loads key rows j0.. of (b, h): kps = k + p (k alone without positions),
// vs = v, cb = u·k + vb·p (0 without positions); zeros past T2.
template <typename T, typename A, int TL>
__device__ __forceinline__ void att_load_keys(const T* k, const T* v, const T* p, uint32_t p_per_seq, const A* u, const A* vb,
                                              uint32_t b, uint32_t h, uint32_t j0, uint32_t T2, uint32_t H, uint32_t d,
                                              A (*kps)[ATT_DMAX], A (*vs)[ATT_DMAX], A* cb) {
    const uint32_t tid = threadIdx.x, nt = blockDim.x;
    const uint32_t pbb = p_per_seq ? b : 0;
    for (uint32_t e = tid; e < TL * d; e += nt) {
        const uint32_t r = e / d, c = e % d, j = j0 + r;
        A kv = 0, vv = 0;
        if (j < T2) {
            const uint64_t at = (((uint64_t)b * T2 + j) * H + h) * d + c;
            kv = Num<T>::to(k[at]);
            if (p) kv += Num<T>::to(p[(((uint64_t)pbb * T2 + j) * H + h) * d + c]);
            vv = Num<T>::to(v[at]);
        }
        kps[r][c] = kv;
        vs[r][c] = vv;
    }
    if (tid < TL) {
        const uint32_t j = j0 + tid;
        A s = 0;
        if (p && j < T2) {
            for (uint32_t c = 0; c < d; ++c)
                s += u[h * d + c] * Num<T>::to(k[(((uint64_t)b * T2 + j) * H + h) * d + c]) +
                     vb[h * d + c] * Num<T>::to(p[(((uint64_t)pbb * T2 + j) * H + h) * d + c]);
        }
        cb[tid] = s;
    }
}

// Loads rows i0.. of (b, h) of x (B, T1, H, d) into xs; zeros past T1.
template <typename T, typename A, int TL>
__device__ __forceinline__ void att_load_rows(const T* x, uint32_t b, uint32_t h, uint32_t i0, uint32_t T1, uint32_t H, uint32_t d,
                                              A (*xs)[ATT_DMAX]) {
    for (uint32_t e = threadIdx.x; e < TL * d; e += blockDim.x) {
        const uint32_t r = e / d, c = e % d, i = i0 + r;
        xs[r][c] = i < T1 ? Num<T>::to(x[(((uint64_t)b * T1 + i) * H + h) * d + c]) : A(0);
    }
}

template <typename A>
__device__ __forceinline__ A att_dot(const A* a, const A* b, uint32_t d) {
    A s = 0;
    for (uint32_t c = 0; c < d; ++c) s += a[c] * b[c];
    return s;
}

template <typename T>
__device__ void attention_fwd(ATT_PARAMS(T, acc_t<T>), T* __restrict__ o, acc_t<T>* __restrict__ lse) {
    typedef acc_t<T> A;
    constexpr int TL = AttTile<A>::n;
    __shared__ A qs[TL][ATT_DMAX], kps[TL][ATT_DMAX], vs[TL][ATT_DMAX], os[TL][ATT_DMAX];
    __shared__ A ss[TL][TL], cb[TL], mrow[TL], lrow[TL], alpha[TL];
    ATT_SETUP(A);
    const uint32_t tiles = (T1 + TL - 1) / TL;
    const uint64_t units = (uint64_t)B * H * tiles;
    for (uint64_t un = blockIdx.x; un < units; un += gridDim.x) {
        const uint32_t i0 = (uint32_t)(un % tiles) * TL, h = (uint32_t)((un / tiles) % H), b = (uint32_t)(un / ((uint64_t)tiles * H));
        att_load_rows<T, A, TL>(q, b, h, i0, T1, H, d, qs);
        for (uint32_t e = tid; e < TL * d; e += nt) os[e / d][e % d] = 0;
        if (tid < TL) {
            mrow[tid] = A(-INFINITY);
            lrow[tid] = 0;
        }
        __syncthreads();
        for (uint32_t j0 = 0; j0 < T2; j0 += TL) {
            att_load_keys<T, A, TL>(k, v, p, p_per_seq, u, vb, b, h, j0, T2, H, d, kps, vs, cb);
            __syncthreads();
            for (uint32_t e = tid; e < TL * TL; e += nt) {
                const uint32_t r = e / TL, jj = e % TL, i = i0 + r, j = j0 + jj;
                ss[r][jj] = (i >= T1 || j >= T2 || mk.masked(b, i, j)) ? A(-INFINITY) : (att_dot(qs[r], kps[jj], d) + cb[jj]) * scale;
            }
            __syncthreads();
            // Online softmax, one thread per row: the running max and sum
            // (of the probabilities before dropout) rescale the output.
            if (tid < TL) {
                const uint32_t r = tid;
                A mx = mrow[r];
                for (int jj = 0; jj < TL; ++jj) mx = ss[r][jj] > mx ? ss[r][jj] : mx;
                A al = 1, sum = 0;
                if (mx == A(-INFINITY)) {
                    for (int jj = 0; jj < TL; ++jj) ss[r][jj] = 0;
                } else {
                    al = nn_exp(mrow[r] - mx);
                    const uint64_t e0 = (((uint64_t)b * H + h) * T1 + i0 + r) * T2 + j0;
                    for (int jj = 0; jj < TL; ++jj) {
                        const A pe = ss[r][jj] == A(-INFINITY) ? A(0) : nn_exp(ss[r][jj] - mx);
                        sum += pe;
                        ss[r][jj] = pe == A(0) ? A(0) : pe * dr.factor(e0 + jj);
                    }
                }
                lrow[r] = lrow[r] * al + sum;
                mrow[r] = mx;
                alpha[r] = al;
            }
            __syncthreads();
            for (uint32_t e = tid; e < TL * d; e += nt) {
                const uint32_t r = e / d, c = e % d;
                A acc = os[r][c] * alpha[r];
                for (int jj = 0; jj < TL; ++jj) acc += ss[r][jj] * vs[jj][c];
                os[r][c] = acc;
            }
            __syncthreads();
        }
        for (uint32_t e = tid; e < TL * d; e += nt) {
            const uint32_t r = e / d, c = e % d, i = i0 + r;
            if (i < T1) o[(((uint64_t)b * T1 + i) * H + h) * d + c] = Num<T>::from(lrow[r] > 0 ? os[r][c] / lrow[r] : A(0));
        }
        if (tid < TL && i0 + tid < T1)
            lse[((uint64_t)b * H + h) * T1 + i0 + tid] = lrow[tid] > 0 ? mrow[tid] + nn_log(lrow[tid]) : A(INFINITY);
        __syncthreads();
    }
}

// dS of query rows i0.. (qs, dos, lr = lse, dd = D) against key rows j0..
// (kps, vs, cb) into ds, and P·Z into pz when given.
template <typename A, int TL>
__device__ __forceinline__ void att_ds_tile(const AttMask& mk, const AttDrop<A>& dr, uint32_t b, uint32_t h, uint32_t i0, uint32_t j0,
                                            uint32_t T1, uint32_t T2, uint32_t H, uint32_t d, A scale, A (*qs)[ATT_DMAX],
                                            A (*dos)[ATT_DMAX], A (*kps)[ATT_DMAX], A (*vs)[ATT_DMAX], const A* cb, const A* lr,
                                            const A* dd, A (*ds)[TL], A (*pz)[TL]) {
    for (uint32_t e = threadIdx.x; e < TL * TL; e += blockDim.x) {
        const uint32_t r = e / TL, jj = e % TL, i = i0 + r, j = j0 + jj;
        A dsv = 0, pzv = 0;
        if (i < T1 && j < T2 && !mk.masked(b, i, j)) {
            const A s = (att_dot(qs[r], kps[jj], d) + cb[jj]) * scale;
            const A pe = nn_exp(s - lr[r]);
            if (pe != A(0)) {
                const A z = dr.factor((((uint64_t)b * H + h) * T1 + i) * T2 + j);
                pzv = pe * z;
                dsv = pe * (z * att_dot(dos[r], vs[jj], d) - dd[r]);
            }
        }
        ds[r][jj] = dsv;
        if (pz) pz[r][jj] = pzv;
    }
}

template <typename T>
__device__ void attention_bwd_dq(ATT_PARAMS(T, acc_t<T>), const T* __restrict__ o, const T* __restrict__ dout,
                                 const acc_t<T>* __restrict__ lse, acc_t<T>* __restrict__ dsum, T* __restrict__ dq) {
    typedef acc_t<T> A;
    constexpr int TL = AttTile<A>::n;
    __shared__ A qs[TL][ATT_DMAX], dos[TL][ATT_DMAX], kps[TL][ATT_DMAX], vs[TL][ATT_DMAX], dqs[TL][ATT_DMAX];
    __shared__ A ds[TL][TL], cb[TL], lr[TL], dd[TL], dh[TL];
    ATT_SETUP(A);
    constexpr bool HALF = sizeof(T) == 2;
    const uint32_t tiles = (T1 + TL - 1) / TL;
    const uint64_t units = (uint64_t)B * H * tiles;
    for (uint64_t un = blockIdx.x; un < units; un += gridDim.x) {
        const uint32_t i0 = (uint32_t)(un % tiles) * TL, h = (uint32_t)((un / tiles) % H), b = (uint32_t)(un / ((uint64_t)tiles * H));
        att_load_rows<T, A, TL>(q, b, h, i0, T1, H, d, qs);
        att_load_rows<T, A, TL>(dout, b, h, i0, T1, H, d, dos);
        for (uint32_t e = tid; e < TL * d; e += nt) dqs[e / d][e % d] = 0;
        if (tid < TL) dh[tid] = 0;
        if (tid < TL) {
            const uint32_t i = i0 + tid;
            A dv = 0;
            if (i < T1 && !HALF) {
                const uint64_t at = (((uint64_t)b * T1 + i) * H + h) * d;
                for (uint32_t c = 0; c < d; ++c) dv += Num<T>::to(dout[at + c]) * Num<T>::to(o[at + c]);
            }
            dd[tid] = dv;
            lr[tid] = i < T1 ? lse[((uint64_t)b * H + h) * T1 + i] : A(INFINITY);
        }
        __syncthreads();
        // Half outputs are rounded: D from dout·o would carry o's rounding
        // into every dS of the row. Instead D = sum_j P Z (dout·v) from the
        // recomputed scores, one more pass over the keys (dS with D = 0).
        if (HALF) {
            for (uint32_t j0 = 0; j0 < T2; j0 += TL) {
                att_load_keys<T, A, TL>(k, v, p, p_per_seq, u, vb, b, h, j0, T2, H, d, kps, vs, cb);
                __syncthreads();
                att_ds_tile<A, TL>(mk, dr, b, h, i0, j0, T1, T2, H, d, scale, qs, dos, kps, vs, cb, lr, dd, ds, (A(*)[TL]) nullptr);
                __syncthreads();
                if (tid < TL) {
                    A acc = 0;
                    for (int jj = 0; jj < TL; ++jj) acc += ds[tid][jj];
                    dh[tid] += acc;
                }
                __syncthreads();
            }
            if (tid < TL) dd[tid] = dh[tid];
            __syncthreads();
        }
        if (tid < TL && i0 + tid < T1) dsum[((uint64_t)b * H + h) * T1 + i0 + tid] = dd[tid];
        for (uint32_t j0 = 0; j0 < T2; j0 += TL) {
            att_load_keys<T, A, TL>(k, v, p, p_per_seq, u, vb, b, h, j0, T2, H, d, kps, vs, cb);
            __syncthreads();
            att_ds_tile<A, TL>(mk, dr, b, h, i0, j0, T1, T2, H, d, scale, qs, dos, kps, vs, cb, lr, dd, ds, (A(*)[TL]) nullptr);
            __syncthreads();
            for (uint32_t e = tid; e < TL * d; e += nt) {
                const uint32_t r = e / d, c = e % d;
                A acc = dqs[r][c];
                for (int jj = 0; jj < TL; ++jj) acc += ds[r][jj] * kps[jj][c];
                dqs[r][c] = acc;
            }
            __syncthreads();
        }
        for (uint32_t e = tid; e < TL * d; e += nt) {
            const uint32_t r = e / d, c = e % d, i = i0 + r;
            if (i < T1) dq[(((uint64_t)b * T1 + i) * H + h) * d + c] = Num<T>::from(dqs[r][c] * scale);
        }
        __syncthreads();
    }
}

template <typename T>
__device__ void attention_bwd_dkv(ATT_PARAMS(T, acc_t<T>), const T* __restrict__ dout, const acc_t<T>* __restrict__ lse,
                                  const acc_t<T>* __restrict__ dsum, T* __restrict__ dk, T* __restrict__ dv, acc_t<T>* __restrict__ dp,
                                  acc_t<T>* __restrict__ sk) {
    typedef acc_t<T> A;
    constexpr int TL = AttTile<A>::n;
    constexpr int NACC = TL * ATT_DMAX / ATT_THREADS;
    __shared__ A kps[TL][ATT_DMAX], vs[TL][ATT_DMAX], qs[TL][ATT_DMAX], dos[TL][ATT_DMAX];
    __shared__ A ds[TL][TL], pz[TL][TL], cb[TL], lr[TL], dd[TL], ssum[TL];
    ATT_SETUP(A);
    (void)nt;
    const uint32_t tiles = (T2 + TL - 1) / TL;
    const uint64_t units = (uint64_t)B * H * tiles;
    for (uint64_t un = blockIdx.x; un < units; un += gridDim.x) {
        const uint32_t j0 = (uint32_t)(un % tiles) * TL, h = (uint32_t)((un / tiles) % H), b = (uint32_t)(un / ((uint64_t)tiles * H));
        att_load_keys<T, A, TL>(k, v, p, p_per_seq, u, vb, b, h, j0, T2, H, d, kps, vs, cb);
        A gacc[NACC], vacc[NACC];
#pragma unroll
        for (int a = 0; a < NACC; ++a) gacc[a] = vacc[a] = 0;
        if (tid < TL) ssum[tid] = 0;
        __syncthreads();
        for (uint32_t i0 = 0; i0 < T1; i0 += TL) {
            att_load_rows<T, A, TL>(q, b, h, i0, T1, H, d, qs);
            att_load_rows<T, A, TL>(dout, b, h, i0, T1, H, d, dos);
            if (tid < TL) {
                const uint32_t i = i0 + tid;
                lr[tid] = i < T1 ? lse[((uint64_t)b * H + h) * T1 + i] : A(INFINITY);
                dd[tid] = i < T1 ? dsum[((uint64_t)b * H + h) * T1 + i] : A(0);
            }
            __syncthreads();
            att_ds_tile<A, TL>(mk, dr, b, h, i0, j0, T1, T2, H, d, scale, qs, dos, kps, vs, cb, lr, dd, ds, pz);
            __syncthreads();
#pragma unroll
            for (int a = 0; a < NACC; ++a) {
                const uint32_t e = tid + a * ATT_THREADS;
                if (e < TL * d) {
                    const uint32_t jj = e / d, c = e % d;
                    A g = gacc[a], w = vacc[a];
                    for (int r = 0; r < TL; ++r) {
                        g += ds[r][jj] * qs[r][c];
                        w += pz[r][jj] * dos[r][c];
                    }
                    gacc[a] = g;
                    vacc[a] = w;
                }
            }
            if (tid < TL) {
                A s = ssum[tid];
                for (int r = 0; r < TL; ++r) s += ds[r][tid];
                ssum[tid] = s;
            }
            __syncthreads();
        }
#pragma unroll
        for (int a = 0; a < NACC; ++a) {
            const uint32_t e = tid + a * ATT_THREADS;
            if (e < TL * d) {
                const uint32_t jj = e / d, c = e % d, j = j0 + jj;
                if (j < T2) {
                    const uint64_t at = (((uint64_t)b * T2 + j) * H + h) * d + c;
                    dv[at] = Num<T>::from(vacc[a]);
                    dk[at] = Num<T>::from((gacc[a] + (u ? u[h * d + c] * ssum[jj] : A(0))) * scale);
                    if (p) dp[at] = (gacc[a] + vb[h * d + c] * ssum[jj]) * scale;
                }
            }
        }
        if (p && tid < TL && j0 + tid < T2) sk[((uint64_t)b * T2 + j0 + tid) * H + h] = ssum[tid] * scale;
        __syncthreads();
    }
}

#define ATTENTION_KERNELS(SUF, T)                                                                                        \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_fwd_##SUF(ATT_PARAMS(T, acc_t<T>), T* o,         \
                                                                                  acc_t<T>* lse) {                       \
        attention_fwd<T>(ATT_ARGS, o, lse);                                                                              \
    }                                                                                                                    \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                                            \
        attention_bwd_dq_##SUF(ATT_PARAMS(T, acc_t<T>), const T* o, const T* dout, const acc_t<T>* lse, acc_t<T>* dsum, T* dq) { \
        attention_bwd_dq<T>(ATT_ARGS, o, dout, lse, dsum, dq);                                                           \
    }                                                                                                                    \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                                            \
        attention_bwd_dkv_##SUF(ATT_PARAMS(T, acc_t<T>), const T* dout, const acc_t<T>* lse, const acc_t<T>* dsum, T* dk,    \
                                T* dv, acc_t<T>* dp, acc_t<T>* sk) {                                                     \
        attention_bwd_dkv<T>(ATT_ARGS, dout, lse, dsum, dk, dv, dp, sk);                                                 \
    }
NN_FLOAT_DTYPES(ATTENTION_KERNELS)
