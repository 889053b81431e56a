// Flash attention with relative positions (WeNet's rel_selfattn without
// rel_shift), plain, causal and cross attention, forward and backward; the
// T1 x T2 score matrix is never written to global memory.
//
// Layouts (row-major): q, o, dout, dq (B, T1, H, d); k, v, dk, dv (B, T2, H, d)
// (the projections' layout, no head permutes); p (PB, T2, H, d) with PB 1
// (one table for every sequence) or B; u, vb (H, d) in the compute type;
// lse, dsum (B, H, T1) and sk (B, T2, H) in the compute type; dp (B, T2, H, d)
// in the compute type (summed over b by attention_pos_grads when PB is 1).
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
//   du    = sum_{b,j} scale s_j k_j,   dvb = sum_{b,j} scale s_j p_j   (attention_pos_grads, from sk)
//
// Shape: a block of ATT_THREADS threads per (b, h, tile of TL rows), the
// units grid-strided so any grid covers them. Forward and dq: a query tile,
// the key tiles in turn through shared memory, online softmax in the
// compute type (f32 for f32/f16/bf16). dk/dv: a key tile, the query tiles
// in turn, its accumulators in registers. Two backward kernels instead of
// atomics: dq's sums are in a fixed order, so results are reproducible.
// Head dims up to ATT_DMAX (64 and 128 are the targets). Scalar tiles
// (every dtype). Shared memory: at most 42 KiB static per block (dq, f32),
// no register spills (ptxas, sm_90).
//
// Status: passed tests/cuda_attention.rs on an H200 (2026-12-04), and
// racecheck found no hazard; there it is 2.2x slower than the composition
// (scalar tiles against cuBLAS), so the attention fusion stays off by
// default until the tensor-core variant beats it (cuda/README.md).
//
// Tensor-core variants (attention_fwd_wmma, attention_bwd_dq_wmma,
// attention_bwd_dkv_wmma; f16 and bf16, d % 16 == 0, d <= ATT_DMAX), at the
// end of this file: the same parameters and outputs (dq's takes no o: D
// always comes from the extra pass), the same masks and Philox element
// indices, m16n16k16 fragments with f32 accumulators; a two-pass forward
// (exact lse first, then O += P·V with P already normalised: no per-row
// rescaling of an opaque accumulator), fragments accumulating the
// backward's sums. The lse that the backward reads must come from the same
// set's forward (its scores round k + p to the input type); the wrapper
// picks one set per dtype and d. Two widths of that set: attention_*_wmma
// (head dims up to 128) and attention_*_wmma64 (up to 64, the default
// there), the same code sized at compile time, bitwise equal where both
// apply. Blocks of 4 warps: 64 query rows (fwd, dq) or 32 keys (dk/dv).
// ptxas sm_90 (nvcc -cubin -arch=sm_90 -Xptxas -v), registers per thread
// and static shared memory, fwd / dq / dk-dv:
//   wmma   f16  168 / 216 / 116 regs, bf16 168 / 255 / 128 regs (dq bf16
//          spills: 32 bytes stored, 68 loaded); 28.4 / 36.6 / 44.5 KiB
//   wmma64 f16   96 / 128 /  70 regs, bf16  96 / 155 /  72 regs, no
//          spills; 21.4 / 29.6 / 30.5 KiB
// so at 4-warp blocks an SM holds (by registers, 64 K per SM) 3 / 2 / 4
// blocks of the wide set and 5 / 4 (bf16 3) / 7 of wmma64. Launches per
// forward and backward as the scalar set (1 + 2, and attention_pos_grads
// with positions). Status: tested on the emulator only; neither width has
// run on a real GPU, and their speed there is unmeasured.
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
        const uint8_t *mask_, uint64_t mb, uint64_t mi, uint64_t mj, uint64_t seed, uint64_t offset, double keep, double dscale,      \
        uint64_t q_ld, uint64_t kv_ld, uint64_t q_off, uint64_t k_off, uint64_t v_off
#define ATT_ARGS \
    q, k, v, p_, flags, u_, vb_, B, T1, T2, H, d, scale, lens_, chunk, left, causal, mask_, mb, mi, mj, seed, offset, keep, dscale, q_ld, kv_ld, q_off, k_off, v_off

// Operand layouts: row (b, i) of q (and dq) starts at (b·T1 + i)·q_ld + q_off,
// row (b, j) of k and dk at (b·T2 + j)·kv_ld + k_off, of v and dv at
// (b·T2 + j)·kv_ld + v_off; head h's d columns follow at h·d. The
// projections' own layout is ld = H·d, offsets 0; a packed projection
// (B, T, 3·H·d) of q, k and v (self-attention) or (B, T2, 2·H·d) of k and v
// (cross-attention) is read, and its gradient written, in place with
// ld = 3·H·d or 2·H·d and offsets 0, H·d, 2·H·d. o, dout, p and dp are
// always (·, T, H, d) contiguous.
//
// `flags`: which optional inputs are real (the others' pointers are any
// valid buffer, never read): ATT_POS p, u and vb; ATT_POS_PER_SEQ p has B
// tables; ATT_LENS key lengths; ATT_MASK the mask tensor.
#define ATT_POS 1u
#define ATT_POS_PER_SEQ 2u
#define ATT_LENS 4u
#define ATT_MASK 8u

// Work unit `un` of a grid-stride loop over (batch, head, tile): the
// tile's first row (tiles of `len` rows, `tiles` of them per head), its head
// and its batch index; every attention kernel walks its units this way.
// Index of element (h, 0) of row (b, i) of a (B, T, ...) operand laid out
// with row stride ld and column offset off (see the layouts above).
__device__ __forceinline__ uint64_t att_at(uint32_t b, uint32_t T, uint32_t i, uint64_t ld, uint64_t off, uint32_t h, uint32_t d) {
    return ((uint64_t)b * T + i) * ld + off + (uint64_t)h * d;
}

struct AttUnit {
    uint32_t r0, h, b;
};
__device__ __forceinline__ AttUnit att_unit(uint64_t un, uint32_t tiles, uint32_t H, uint32_t len) {
    return AttUnit{(uint32_t)(un % tiles) * len, (uint32_t)((un / tiles) % H), (uint32_t)(un / ((uint64_t)tiles * H))};
}

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
                                              uint64_t kv_ld, uint64_t k_off, uint64_t v_off, A (*kps)[ATT_DMAX], A (*vs)[ATT_DMAX],
                                              A* cb) {
    const uint32_t tid = threadIdx.x, nt = blockDim.x;
    const uint32_t pbb = p_per_seq ? b : 0;
    for (uint32_t e = tid; e < TL * d; e += nt) {
        const uint32_t r = e / d, c = e % d, j = j0 + r;
        A kv = 0, vv = 0;
        if (j < T2) {
            kv = Num<T>::to(k[att_at(b, T2, j, kv_ld, k_off, h, d) + c]);
            if (p) kv += Num<T>::to(p[(((uint64_t)pbb * T2 + j) * H + h) * d + c]);
            vv = Num<T>::to(v[att_at(b, T2, j, kv_ld, v_off, h, d) + c]);
        }
        kps[r][c] = kv;
        vs[r][c] = vv;
    }
    if (tid < TL) {
        const uint32_t j = j0 + tid;
        A s = 0;
        if (p && j < T2) {
            for (uint32_t c = 0; c < d; ++c)
                s += u[h * d + c] * Num<T>::to(k[att_at(b, T2, j, kv_ld, k_off, h, d) + c]) +
                     vb[h * d + c] * Num<T>::to(p[(((uint64_t)pbb * T2 + j) * H + h) * d + c]);
        }
        cb[tid] = s;
    }
}

// Loads rows i0.. of (b, h) of x (B, T1, ·) (row stride ld, column offset
// off) into xs; zeros past T1.
template <typename T, typename A, int TL>
__device__ __forceinline__ void att_load_rows(const T* x, uint32_t b, uint32_t h, uint32_t i0, uint32_t T1, uint32_t d, uint64_t ld,
                                              uint64_t off, A (*xs)[ATT_DMAX]) {
    for (uint32_t e = threadIdx.x; e < TL * d; e += blockDim.x) {
        const uint32_t r = e / d, c = e % d, i = i0 + r;
        xs[r][c] = i < T1 ? Num<T>::to(x[att_at(b, T1, i, ld, off, h, d) + c]) : A(0);
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
        const AttUnit unit = att_unit(un, tiles, H, TL);
        const uint32_t i0 = unit.r0, h = unit.h, b = unit.b;
        att_load_rows<T, A, TL>(q, b, h, i0, T1, d, q_ld, q_off, qs);
        for (uint32_t e = tid; e < TL * d; e += nt) os[e / d][e % d] = 0;
        if (tid < TL) {
            mrow[tid] = A(-INFINITY);
            lrow[tid] = 0;
        }
        __syncthreads();
        for (uint32_t j0 = 0; j0 < T2; j0 += TL) {
            att_load_keys<T, A, TL>(k, v, p, p_per_seq, u, vb, b, h, j0, T2, H, d, kv_ld, k_off, v_off, kps, vs, cb);
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
        const AttUnit unit = att_unit(un, tiles, H, TL);
        const uint32_t i0 = unit.r0, h = unit.h, b = unit.b;
        att_load_rows<T, A, TL>(q, b, h, i0, T1, d, q_ld, q_off, qs);
        att_load_rows<T, A, TL>(dout, b, h, i0, T1, d, (uint64_t)H * d, 0, dos);
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
                att_load_keys<T, A, TL>(k, v, p, p_per_seq, u, vb, b, h, j0, T2, H, d, kv_ld, k_off, v_off, kps, vs, cb);
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
            att_load_keys<T, A, TL>(k, v, p, p_per_seq, u, vb, b, h, j0, T2, H, d, kv_ld, k_off, v_off, kps, vs, cb);
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
            if (i < T1) dq[att_at(b, T1, i, q_ld, q_off, h, d) + c] = Num<T>::from(dqs[r][c] * scale);
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
        const AttUnit unit = att_unit(un, tiles, H, TL);
        const uint32_t j0 = unit.r0, h = unit.h, b = unit.b;
        att_load_keys<T, A, TL>(k, v, p, p_per_seq, u, vb, b, h, j0, T2, H, d, kv_ld, k_off, v_off, kps, vs, cb);
        A gacc[NACC], vacc[NACC];
#pragma unroll
        for (int a = 0; a < NACC; ++a) gacc[a] = vacc[a] = 0;
        if (tid < TL) ssum[tid] = 0;
        __syncthreads();
        for (uint32_t i0 = 0; i0 < T1; i0 += TL) {
            att_load_rows<T, A, TL>(q, b, h, i0, T1, d, q_ld, q_off, qs);
            att_load_rows<T, A, TL>(dout, b, h, i0, T1, d, (uint64_t)H * d, 0, dos);
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
                    dv[att_at(b, T2, j, kv_ld, v_off, h, d) + c] = Num<T>::from(vacc[a]);
                    dk[att_at(b, T2, j, kv_ld, k_off, h, d) + c] = Num<T>::from((gacc[a] + (u ? u[h * d + c] * ssum[jj] : A(0))) * scale);
                    if (p) dp[(((uint64_t)b * T2 + j) * H + h) * d + c] = (gacc[a] + vb[h * d + c] * ssum[jj]) * scale;
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

// ---- Tensor-core variants (nvcuda::wmma), f16 and bf16 ----
//
// Same parameters and contract as the scalar kernels; the wrapper picks
// them for f16/bf16 when d % 16 == 0 and d <= ATT_DMAX. Products run on
// m16n16k16 fragments (half or bf16 inputs, f32 accumulators); scores,
// masks, dropout and softmax are element-wise in f32 on a per-warp f32
// scratch, with the element indices (and Philox words) of the scalar
// kernels. A block of ATW_WARPS warps; each warp owns 16 query rows.
//
// The accumulator's element layout is opaque, so an output fragment cannot
// be rescaled per row as online softmax needs. The forward is two-pass
// instead: pass 1 runs S = Q·(K+P)^T over every key tile for each row's max
// and sum (the exact lse); pass 2 recomputes S, forms P = exp(s - lse)·Z,
// already normalised, rounds it to the input type and accumulates O += P·V
// in fragments that never need rescaling. Cost: S is computed twice, 6
// instead of 4 T1·T2·d multiply-adds per (b, h) (1.5x the tensor FLOPs).
// Roundings beyond the scalar kernel's: k + p summed in f32 and rounded
// once to the input type (the operand of the score products), P (forward),
// dS and P·Z (backward) rounded to the input type as operands of the next
// product.
#include <mma.h>

#define ATW_WARPS 4
#define ATW_QT (16 * ATW_WARPS)
#define ATW_KT 32

// Two head-dim widths, one instantiation each: NT, the 16-column fragments
// per row, is 8 (head dims up to 128: attention_*_wmma) or 4 (up to 64:
// attention_*_wmma64). The fragment arrays (Q, dO, the output and dQ
// accumulators) and the shared tiles are sized by NT at compile time, so a
// 64-wide head does not carry a 128-wide head's registers and shared
// memory; the arithmetic and its order are the loop over d / 16 either way,
// so both widths give the same bits where both apply.
template <int NT> __host__ __device__ constexpr uint32_t atw_row() { return 16 * NT < ATT_DMAX ? 16 * NT + 8 : 16 * NT; }

// bf16 fragments need sm_80, half ones sm_70: compiled for an older arch
// the kernels trap instead (the default CUDA_ARCHS, 80,90, has none).
template <typename T> struct AtwArch { static constexpr bool ok = true; };
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
template <> struct AtwArch<__nv_bfloat16> { static constexpr bool ok = false; };
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 700
template <> struct AtwArch<__half> { static constexpr bool ok = false; };
#endif

// Row stride (elements) of a half tile in shared memory: d + 8 (16 bytes,
// shifting each row's banks) while that fits the row capacity atw_row<NT>
// (16·NT, plus those 8 below ATT_DMAX), else d; a multiple of 8 as wmma's
// ldm must be.
template <int NT> __device__ __forceinline__ uint32_t atw_ld(uint32_t d) { return d + 8 <= atw_row<NT>() ? d + 8 : d; }

// Rows r0.. (n of them) of (b, h) of x (B, T, ·) (row stride xld, column
// offset off) into xs (row stride ld), copied in the input type; zeros past T.
template <typename T>
__device__ __forceinline__ void atw_load_rows(const T* x, uint32_t b, uint32_t h, uint32_t r0, uint32_t n, uint32_t Tn, uint64_t xld,
                                              uint64_t off, uint32_t d, uint32_t ld, T* xs) {
    for (uint32_t e = threadIdx.x; e < n * d; e += blockDim.x) {
        const uint32_t r = e / d, c = e % d, i = r0 + r;
        xs[r * ld + c] = i < Tn ? x[att_at(b, Tn, i, xld, off, h, d) + c] : Num<T>::from(0.0f);
    }
}

// Key rows j0.. (ATW_KT) of (b, h): kps = k + p summed in f32 and rounded
// once (k alone without positions), vs = v when given, cb = u·k + vb·p in
// f32 (0 without positions); zeros past T2.
template <typename T>
__device__ __forceinline__ void atw_load_keys(const T* k, const T* v, const T* p, uint32_t p_per_seq, const float* u, const float* vb,
                                              uint32_t b, uint32_t h, uint32_t j0, uint32_t T2, uint32_t H, uint32_t d, uint64_t kv_ld,
                                              uint64_t k_off, uint64_t v_off, uint32_t ld, T* kps, T* vs, float* cb) {
    const uint32_t tid = threadIdx.x, nt = blockDim.x;
    const uint32_t pbb = p_per_seq ? b : 0;
    for (uint32_t e = tid; e < ATW_KT * d; e += nt) {
        const uint32_t r = e / d, c = e % d, j = j0 + r;
        float kv = 0;
        T vv = Num<T>::from(0.0f);
        if (j < T2) {
            kv = Num<T>::to(k[att_at(b, T2, j, kv_ld, k_off, h, d) + c]);
            if (p) kv += Num<T>::to(p[(((uint64_t)pbb * T2 + j) * H + h) * d + c]);
            if (vs) vv = v[att_at(b, T2, j, kv_ld, v_off, h, d) + c];
        }
        kps[r * ld + c] = Num<T>::from(kv);
        if (vs) vs[r * ld + c] = vv;
    }
    if (tid < ATW_KT) {
        const uint32_t j = j0 + tid;
        float s = 0;
        if (p && j < T2) {
            for (uint32_t c = 0; c < d; ++c)
                s += u[h * d + c] * Num<T>::to(k[att_at(b, T2, j, kv_ld, k_off, h, d) + c]) +
                     vb[h * d + c] * Num<T>::to(p[(((uint64_t)pbb * T2 + j) * H + h) * d + c]);
        }
        cb[tid] = s;
    }
}

template <typename T> using AtwA = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, T, nvcuda::wmma::row_major>;
template <typename T> using AtwBr = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, T, nvcuda::wmma::row_major>;
template <typename T> using AtwBc = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, T, nvcuda::wmma::col_major>;
typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> AtwC;

// S (16 x ATW_KT, f32, row-major) = the warp's 16 rows (xf: d/16 fragments)
// times the key tile's rows (ks, row stride ld) transposed.
template <int NT, typename T>
__device__ __forceinline__ void atw_rows_by_keys(const AtwA<T>* xf, const T* ks, uint32_t ld, uint32_t dn, float* S) {
    using namespace nvcuda;
#pragma unroll
    for (int n = 0; n < ATW_KT / 16; ++n) {
        AtwC acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int c = 0; c < NT; ++c) {
            if (c < (int)dn) {
                AtwBc<T> kb;
                wmma::load_matrix_sync(kb, ks + n * 16 * ld + c * 16, ld);
                wmma::mma_sync(acc, xf[c], kb, acc);
            }
        }
        wmma::store_matrix_sync(S + n * 16, acc, ATW_KT, wmma::mem_row_major);
    }
}

// The scores of the warp's rows r0.. against keys j0.. in S, element-wise:
// s = (S + cb)·scale, -inf where masked or past T1/T2.
__device__ __forceinline__ void atw_scores(const AttMask& mk, uint32_t b, uint32_t r0, uint32_t j0, uint32_t T1, uint32_t T2, float scale,
                                           const float* cb, float* S, uint32_t lane) {
    for (uint32_t e = lane; e < 16 * ATW_KT; e += 32) {
        const uint32_t r = e / ATW_KT, jj = e % ATW_KT, i = r0 + r, j = j0 + jj;
        S[e] = (i >= T1 || j >= T2 || mk.masked(b, i, j)) ? -INFINITY : (S[e] + cb[jj]) * scale;
    }
}

// Copies a 16 x 16 accumulator to rows r0.. (below T1) and columns c0.. of
// (b, h) of y (B, T1, ·) (row stride yld, column offset off), times `mul`,
// through the warp's scratch S.
template <typename T>
__device__ __forceinline__ void atw_store_rows(const AtwC& acc, float mul, T* y, uint32_t b, uint32_t h, uint32_t r0, uint32_t c0, uint32_t T1,
                                               uint64_t yld, uint64_t off, uint32_t d, float* S, uint32_t lane) {
    nvcuda::wmma::store_matrix_sync(S, acc, 16, nvcuda::wmma::mem_row_major);
    __syncwarp();
    for (uint32_t e = lane; e < 256; e += 32) {
        const uint32_t r = e / 16, c = e % 16, i = r0 + r;
        if (i < T1) y[att_at(b, T1, i, yld, off, h, d) + c0 + c] = Num<T>::from(S[e] * mul);
    }
    __syncwarp();
}

template <int NT, typename T>
__device__ void attention_fwd_wmma(ATT_PARAMS(T, float), T* __restrict__ o, float* __restrict__ lse) {
    using namespace nvcuda;
    typedef float A;
    __shared__ __align__(32) T xs[ATW_QT * atw_row<NT>()];
    __shared__ __align__(32) float sw[ATW_WARPS][16 * ATW_KT];
    __shared__ __align__(32) T pw[ATW_WARPS][16 * ATW_KT];
    __shared__ float cb[ATW_KT], lrow[ATW_QT];
    ATT_SETUP(A);
    (void)nt;
    const uint32_t warp = tid / 32, lane = tid % 32, ld = atw_ld<NT>(d), dn = d / 16;
    T* kps = xs;
    T* vs = xs + ATW_KT * atw_row<NT>();
    float* S = sw[warp];
    T* P = pw[warp];
    const uint32_t tiles = (T1 + ATW_QT - 1) / ATW_QT;
    const uint64_t units = (uint64_t)B * H * tiles;
    for (uint64_t un = blockIdx.x; un < units; un += gridDim.x) {
        const AttUnit unit = att_unit(un, tiles, H, ATW_QT);
        const uint32_t i0 = unit.r0, h = unit.h, b = unit.b;
        const uint32_t r0 = i0 + warp * 16;
        atw_load_rows<T>(q, b, h, i0, ATW_QT, T1, q_ld, q_off, d, ld, xs);
        __syncthreads();
        AtwA<T> qf[NT];
#pragma unroll
        for (int c = 0; c < NT; ++c)
            if (c < (int)dn) wmma::load_matrix_sync(qf[c], xs + warp * 16 * ld + c * 16, ld);
        __syncthreads();
        // Pass 1: each row's running max and sum (lane r < 16: row r0 + r).
        A mx = -INFINITY, sum = 0;
        for (uint32_t j0 = 0; j0 < T2; j0 += ATW_KT) {
            atw_load_keys<T>(k, v, p, p_per_seq, u, vb, b, h, j0, T2, H, d, kv_ld, k_off, v_off, ld, kps, (T*)nullptr, cb);
            __syncthreads();
            atw_rows_by_keys<NT, T>(qf, kps, ld, dn, S);
            __syncwarp();
            atw_scores(mk, b, r0, j0, T1, T2, scale, cb, S, lane);
            __syncwarp();
            if (lane < 16) {
                const float* s = S + lane * ATW_KT;
                A m2 = mx;
                for (int jj = 0; jj < ATW_KT; ++jj) m2 = s[jj] > m2 ? s[jj] : m2;
                if (m2 != A(-INFINITY)) {
                    A part = 0;
                    for (int jj = 0; jj < ATW_KT; ++jj) part += s[jj] == A(-INFINITY) ? A(0) : nn_exp(s[jj] - m2);
                    sum = sum * nn_exp(mx - m2) + part;
                    mx = m2;
                }
            }
            __syncthreads();
        }
        if (lane < 16) {
            const A l = sum > 0 ? mx + nn_log(sum) : A(INFINITY);
            lrow[warp * 16 + lane] = l;
            if (r0 + lane < T1) lse[((uint64_t)b * H + h) * T1 + r0 + lane] = l;
        }
        __syncwarp();
        // Pass 2: O += (exp(s - lse)·Z) V, P rounded to the input type.
        AtwC of[NT];
#pragma unroll
        for (int c = 0; c < NT; ++c) wmma::fill_fragment(of[c], 0.0f);
        for (uint32_t j0 = 0; j0 < T2; j0 += ATW_KT) {
            atw_load_keys<T>(k, v, p, p_per_seq, u, vb, b, h, j0, T2, H, d, kv_ld, k_off, v_off, ld, kps, vs, cb);
            __syncthreads();
            atw_rows_by_keys<NT, T>(qf, kps, ld, dn, S);
            __syncwarp();
            atw_scores(mk, b, r0, j0, T1, T2, scale, cb, S, lane);
            __syncwarp();
            for (uint32_t e = lane; e < 16 * ATW_KT; e += 32) {
                const uint32_t r = e / ATW_KT, jj = e % ATW_KT;
                const A s = S[e];
                A pz = 0;
                if (s != A(-INFINITY)) {
                    const A pe = nn_exp(s - lrow[warp * 16 + r]);
                    if (pe != A(0)) pz = pe * dr.factor((((uint64_t)b * H + h) * T1 + r0 + r) * T2 + j0 + jj);
                }
                P[e] = Num<T>::from(pz);
            }
            __syncwarp();
#pragma unroll
            for (int kk = 0; kk < ATW_KT / 16; ++kk) {
                AtwA<T> pa;
                wmma::load_matrix_sync(pa, P + kk * 16, ATW_KT);
#pragma unroll
                for (int c = 0; c < NT; ++c) {
                    if (c < (int)dn) {
                        AtwBr<T> vf;
                        wmma::load_matrix_sync(vf, vs + kk * 16 * ld + c * 16, ld);
                        wmma::mma_sync(of[c], pa, vf, of[c]);
                    }
                }
            }
            __syncthreads();
        }
#pragma unroll
        for (int c = 0; c < NT; ++c)
            if (c < (int)dn) atw_store_rows<T>(of[c], 1.0f, o, b, h, r0, c * 16, T1, (uint64_t)H * d, 0, d, S, lane);
        __syncthreads();
    }
}

// The backward's dq: per warp 16 query rows; per key tile S = Q·(K+P)^T
// and dPv = dO·V^T in fragments, then element-wise P = exp(s - lse) and
// dS = P (Z dPv - D), rounded to the input type, and dQ += dS·(K+P) in
// fragments. D by one more pass over the keys (D = sum_j P Z dPv), as the
// scalar kernel's HALF branch. Q and dO are kept as fragments, staged
// through the key tiles' shared memory.
template <int NT, typename T>
__device__ void attention_bwd_dq_wmma(ATT_PARAMS(T, float), const T* __restrict__ dout, const float* __restrict__ lse,
                                      float* __restrict__ dsum, T* __restrict__ dq) {
    using namespace nvcuda;
    typedef float A;
    __shared__ __align__(32) T xs[ATW_QT * atw_row<NT>()];
    __shared__ __align__(32) float sw[ATW_WARPS][16 * ATW_KT];
    __shared__ __align__(32) float gw[ATW_WARPS][16 * ATW_KT];
    __shared__ __align__(32) T pw[ATW_WARPS][16 * ATW_KT];
    __shared__ float cb[ATW_KT], lr[ATW_QT], dd[ATW_QT];
    ATT_SETUP(A);
    (void)nt;
    const uint32_t warp = tid / 32, lane = tid % 32, ld = atw_ld<NT>(d), dn = d / 16;
    T* kps = xs;
    T* vs = xs + ATW_KT * atw_row<NT>();
    float* S = sw[warp];
    float* G = gw[warp];
    T* P = pw[warp];
    const uint32_t tiles = (T1 + ATW_QT - 1) / ATW_QT;
    const uint64_t units = (uint64_t)B * H * tiles;
    for (uint64_t un = blockIdx.x; un < units; un += gridDim.x) {
        const AttUnit unit = att_unit(un, tiles, H, ATW_QT);
        const uint32_t i0 = unit.r0, h = unit.h, b = unit.b;
        const uint32_t r0 = i0 + warp * 16;
        AtwA<T> qf[NT], df[NT];
        atw_load_rows<T>(q, b, h, i0, ATW_QT, T1, q_ld, q_off, d, ld, xs);
        __syncthreads();
#pragma unroll
        for (int c = 0; c < NT; ++c)
            if (c < (int)dn) wmma::load_matrix_sync(qf[c], xs + warp * 16 * ld + c * 16, ld);
        __syncthreads();
        atw_load_rows<T>(dout, b, h, i0, ATW_QT, T1, (uint64_t)H * d, 0, d, ld, xs);
        if (tid < ATW_QT) {
            const uint32_t i = i0 + tid;
            lr[tid] = i < T1 ? lse[((uint64_t)b * H + h) * T1 + i] : A(INFINITY);
        }
        __syncthreads();
#pragma unroll
        for (int c = 0; c < NT; ++c)
            if (c < (int)dn) wmma::load_matrix_sync(df[c], xs + warp * 16 * ld + c * 16, ld);
        __syncthreads();
        AtwC gf[NT];
#pragma unroll
        for (int c = 0; c < NT; ++c) wmma::fill_fragment(gf[c], 0.0f);
        // Pass 0 computes D (lane r < 16 sums row r), pass 1 dQ.
        A dh = 0;
        for (int pass = 0; pass < 2; ++pass) {
            for (uint32_t j0 = 0; j0 < T2; j0 += ATW_KT) {
                atw_load_keys<T>(k, v, p, p_per_seq, u, vb, b, h, j0, T2, H, d, kv_ld, k_off, v_off, ld, kps, vs, cb);
                __syncthreads();
                atw_rows_by_keys<NT, T>(qf, kps, ld, dn, S);
                atw_rows_by_keys<NT, T>(df, vs, ld, dn, G);
                __syncwarp();
                atw_scores(mk, b, r0, j0, T1, T2, scale, cb, S, lane);
                __syncwarp();
                for (uint32_t e = lane; e < 16 * ATW_KT; e += 32) {
                    const uint32_t r = e / ATW_KT, jj = e % ATW_KT;
                    const A s = S[e];
                    A pzg = 0, dsv = 0;
                    if (s != A(-INFINITY)) {
                        const A pe = nn_exp(s - lr[warp * 16 + r]);
                        if (pe != A(0)) {
                            const A z = dr.factor((((uint64_t)b * H + h) * T1 + r0 + r) * T2 + j0 + jj);
                            pzg = pe * z * G[e];
                            if (pass) dsv = pe * (z * G[e] - dd[warp * 16 + r]);
                        }
                    }
                    if (pass) P[e] = Num<T>::from(dsv);
                    else G[e] = pzg;
                }
                __syncwarp();
                if (pass) {
#pragma unroll
                    for (int kk = 0; kk < ATW_KT / 16; ++kk) {
                        AtwA<T> da;
                        wmma::load_matrix_sync(da, P + kk * 16, ATW_KT);
#pragma unroll
                        for (int c = 0; c < NT; ++c) {
                            if (c < (int)dn) {
                                AtwBr<T> kf;
                                wmma::load_matrix_sync(kf, kps + kk * 16 * ld + c * 16, ld);
                                wmma::mma_sync(gf[c], da, kf, gf[c]);
                            }
                        }
                    }
                } else if (lane < 16) {
                    A acc = 0;
                    for (int jj = 0; jj < ATW_KT; ++jj) acc += G[lane * ATW_KT + jj];
                    dh += acc;
                }
                __syncthreads();
            }
            if (!pass && lane < 16) {
                dd[warp * 16 + lane] = dh;
                if (r0 + lane < T1) dsum[((uint64_t)b * H + h) * T1 + r0 + lane] = dh;
            }
            __syncwarp();
        }
#pragma unroll
        for (int c = 0; c < NT; ++c)
            if (c < (int)dn) atw_store_rows<T>(gf[c], scale, dq, b, h, r0, c * 16, T1, q_ld, q_off, d, S, lane);
        __syncthreads();
    }
}

// The backward's dk, dv, dp, sk: a block per tile of ATW_KT keys, the query
// tiles (ATW_KT rows) in turn. S^T = (K+P)·Q^T and dPv^T = V·dO^T, one
// 16 x 16 tile per warp, into shared f32; element-wise dS^T and (P·Z)^T
// (rounded to the input type) by the block; then warp w accumulates key
// rows 16·(w % 2).. and the column tiles c with c % 2 == w / 2 of
// dV += (P·Z)^T·dO and G += dS^T·Q in fragments.
template <int NT, typename T>
__device__ void attention_bwd_dkv_wmma(ATT_PARAMS(T, float), const T* __restrict__ dout, const float* __restrict__ lse,
                                       const float* __restrict__ dsum, T* __restrict__ dk, T* __restrict__ dv, float* __restrict__ dp,
                                       float* __restrict__ sk) {
    using namespace nvcuda;
    typedef float A;
    constexpr int KT = ATW_KT, QT = ATW_KT;
    __shared__ __align__(32) T kps[KT * atw_row<NT>()], vs[KT * atw_row<NT>()], qs[QT * atw_row<NT>()], dos[QT * atw_row<NT>()];
    __shared__ __align__(32) float st[KT * QT], gt[KT * QT];
    __shared__ __align__(32) T dst[KT * QT], pzt[KT * QT];
    __shared__ float cb[KT], lr[QT], dd[QT], ssum[KT];
    ATT_SETUP(A);
    const uint32_t warp = tid / 32, lane = tid % 32, ld = atw_ld<NT>(d), dn = d / 16;
    const uint32_t kt = warp % 2, ch = warp / 2;
    const uint32_t tiles = (T2 + KT - 1) / KT;
    const uint64_t units = (uint64_t)B * H * tiles;
    for (uint64_t un = blockIdx.x; un < units; un += gridDim.x) {
        const AttUnit unit = att_unit(un, tiles, H, KT);
        const uint32_t j0 = unit.r0, h = unit.h, b = unit.b;
        atw_load_keys<T>(k, v, p, p_per_seq, u, vb, b, h, j0, T2, H, d, kv_ld, k_off, v_off, ld, kps, vs, cb);
        if (tid < KT) ssum[tid] = 0;
        AtwC vf[NT / 2], gf[NT / 2];
#pragma unroll
        for (int c = 0; c < NT / 2; ++c) {
            wmma::fill_fragment(vf[c], 0.0f);
            wmma::fill_fragment(gf[c], 0.0f);
        }
        for (uint32_t i0 = 0; i0 < T1; i0 += QT) {
            atw_load_rows<T>(q, b, h, i0, QT, T1, q_ld, q_off, d, ld, qs);
            atw_load_rows<T>(dout, b, h, i0, QT, T1, (uint64_t)H * d, 0, d, ld, dos);
            if (tid < QT) {
                const uint32_t i = i0 + tid;
                lr[tid] = i < T1 ? lse[((uint64_t)b * H + h) * T1 + i] : A(INFINITY);
                dd[tid] = i < T1 ? dsum[((uint64_t)b * H + h) * T1 + i] : A(0);
            }
            __syncthreads();
            {
                // Warp w: S^T and dPv^T of key rows 16·(w % 2).., query columns 16·(w / 2)..
                AtwC sa, ga;
                wmma::fill_fragment(sa, 0.0f);
                wmma::fill_fragment(ga, 0.0f);
#pragma unroll
                for (int c = 0; c < NT; ++c) {
                    if (c < (int)dn) {
                        AtwA<T> ka, va;
                        AtwBc<T> qb, db;
                        wmma::load_matrix_sync(ka, kps + kt * 16 * ld + c * 16, ld);
                        wmma::load_matrix_sync(qb, qs + ch * 16 * ld + c * 16, ld);
                        wmma::mma_sync(sa, ka, qb, sa);
                        wmma::load_matrix_sync(va, vs + kt * 16 * ld + c * 16, ld);
                        wmma::load_matrix_sync(db, dos + ch * 16 * ld + c * 16, ld);
                        wmma::mma_sync(ga, va, db, ga);
                    }
                }
                wmma::store_matrix_sync(st + kt * 16 * QT + ch * 16, sa, QT, wmma::mem_row_major);
                wmma::store_matrix_sync(gt + kt * 16 * QT + ch * 16, ga, QT, wmma::mem_row_major);
            }
            __syncthreads();
            for (uint32_t e = tid; e < KT * QT; e += nt) {
                const uint32_t jj = e / QT, r = e % QT, i = i0 + r, j = j0 + jj;
                A dsv = 0, pzv = 0;
                if (i < T1 && j < T2 && !mk.masked(b, i, j)) {
                    const A pe = nn_exp((st[e] + cb[jj]) * scale - lr[r]);
                    if (pe != A(0)) {
                        const A z = dr.factor((((uint64_t)b * H + h) * T1 + i) * T2 + j);
                        pzv = pe * z;
                        dsv = pe * (z * gt[e] - dd[r]);
                    }
                }
                st[e] = dsv;
                dst[e] = Num<T>::from(dsv);
                pzt[e] = Num<T>::from(pzv);
            }
            __syncthreads();
            if (tid < KT) {
                A s = ssum[tid];
                for (int r = 0; r < QT; ++r) s += st[tid * QT + r];
                ssum[tid] = s;
            }
#pragma unroll
            for (int kk = 0; kk < QT / 16; ++kk) {
                AtwA<T> pa, da;
                wmma::load_matrix_sync(pa, pzt + kt * 16 * QT + kk * 16, QT);
                wmma::load_matrix_sync(da, dst + kt * 16 * QT + kk * 16, QT);
#pragma unroll
                for (int c = 0; c < NT; ++c) {
                    if (c < (int)dn && c % 2 == (int)ch) {
                        AtwBr<T> ob, qb;
                        wmma::load_matrix_sync(ob, dos + kk * 16 * ld + c * 16, ld);
                        wmma::mma_sync(vf[c / 2], pa, ob, vf[c / 2]);
                        wmma::load_matrix_sync(qb, qs + kk * 16 * ld + c * 16, ld);
                        wmma::mma_sync(gf[c / 2], da, qb, gf[c / 2]);
                    }
                }
            }
            __syncthreads();
        }
        // Out: warp w's 16 x 16 tiles through its quarter of st.
        float* W = st + warp * 256;
#pragma unroll
        for (int c = 0; c < NT; ++c) {
            if (c < (int)dn && c % 2 == (int)ch) {
                wmma::store_matrix_sync(W, gf[c / 2], 16, wmma::mem_row_major);
                __syncwarp();
                for (uint32_t e = lane; e < 256; e += 32) {
                    const uint32_t jj = kt * 16 + e / 16, cc = c * 16 + e % 16, j = j0 + jj;
                    if (j < T2) {
                        dk[att_at(b, T2, j, kv_ld, k_off, h, d) + cc] = Num<T>::from((W[e] + (u ? u[h * d + cc] * ssum[jj] : A(0))) * scale);
                        if (p) dp[(((uint64_t)b * T2 + j) * H + h) * d + cc] = (W[e] + vb[h * d + cc] * ssum[jj]) * scale;
                    }
                }
                __syncwarp();
                wmma::store_matrix_sync(W, vf[c / 2], 16, wmma::mem_row_major);
                __syncwarp();
                for (uint32_t e = lane; e < 256; e += 32) {
                    const uint32_t jj = kt * 16 + e / 16, cc = c * 16 + e % 16, j = j0 + jj;
                    if (j < T2) dv[att_at(b, T2, j, kv_ld, v_off, h, d) + cc] = Num<T>::from(W[e]);
                }
                __syncwarp();
            }
        }
        if (p && tid < KT && j0 + tid < T2) sk[((uint64_t)b * T2 + j0 + tid) * H + h] = ssum[tid] * scale;
        __syncthreads();
    }
}

// The kernels' bodies where the arch has the fragments, else a trap.
template <int NT, typename T>
__device__ void attention_fwd_wmma_arch(ATT_PARAMS(T, float), T* o, float* lse) {
    if constexpr (AtwArch<T>::ok) attention_fwd_wmma<NT, T>(ATT_ARGS, o, lse);
    else __trap();
}
template <int NT, typename T>
__device__ void attention_bwd_dq_wmma_arch(ATT_PARAMS(T, float), const T* dout, const float* lse, float* dsum, T* dq) {
    if constexpr (AtwArch<T>::ok) attention_bwd_dq_wmma<NT, T>(ATT_ARGS, dout, lse, dsum, dq);
    else __trap();
}
template <int NT, typename T>
__device__ void attention_bwd_dkv_wmma_arch(ATT_PARAMS(T, float), const T* dout, const float* lse, const float* dsum, T* dk, T* dv,
                                            float* dp, float* sk) {
    if constexpr (AtwArch<T>::ok) attention_bwd_dkv_wmma<NT, T>(ATT_ARGS, dout, lse, dsum, dk, dv, dp, sk);
    else __trap();
}

// dq's wmma kernel takes no o (D comes from the extra pass). SET names the
// width: wmma (NT 8, head dims up to 128) or wmma64 (NT 4, up to 64).
#define ATTENTION_WMMA_KERNELS(SET, NT, SUF, T)                                                                          \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_fwd_##SET##_##SUF(ATT_PARAMS(T, acc_t<T>), T* o, \
                                                                                         acc_t<T>* lse) {                \
        attention_fwd_wmma_arch<NT, T>(ATT_ARGS, o, lse);                                                                \
    }                                                                                                                    \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_bwd_dq_##SET##_##SUF(                           \
        ATT_PARAMS(T, acc_t<T>), const T* dout, const acc_t<T>* lse, acc_t<T>* dsum, T* dq) {                             \
        attention_bwd_dq_wmma_arch<NT, T>(ATT_ARGS, dout, lse, dsum, dq);                                                \
    }                                                                                                                    \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_bwd_dkv_##SET##_##SUF(                          \
        ATT_PARAMS(T, acc_t<T>), const T* dout, const acc_t<T>* lse, const acc_t<T>* dsum, T* dk, T* dv, acc_t<T>* dp,    \
        acc_t<T>* sk) {                                                                                                  \
        attention_bwd_dkv_wmma_arch<NT, T>(ATT_ARGS, dout, lse, dsum, dk, dv, dp, sk);                                   \
    }
ATTENTION_WMMA_KERNELS(wmma, 8, f16, __half)
ATTENTION_WMMA_KERNELS(wmma, 8, bf16, __nv_bfloat16)
ATTENTION_WMMA_KERNELS(wmma64, 4, f16, __half)
ATTENTION_WMMA_KERNELS(wmma64, 4, bf16, __nv_bfloat16)

// The relative-position gradients from attention_bwd_dkv's per-sequence
// results (dp (B, T2, H, d), sk (B, T2, H), in the compute type A), in one
// launch where the host's composition took eight (a batch sum and a cast of
// dp, and per bias a widening cast of k or p, a product and a two-dim sum):
//   dpo[r, h, i] = sum_b dp[b, j, h, i] (shared table: r = j) or dp[r, h, i]
//                  (a table per sequence), rounded to T
//   du[h, i]     = sum_{b, j} sk[b, j, h] k[b, j, h, i]
//   dvb[h, i]    = sum_{b, j} sk[b, j, h] p[pb, j, h, i]   (pb = b, or 0 when shared)
// in A. The B·T2 rows are cut into chunks of `chunk` rows, one chunk per
// block (grid-stride over chunks): thread `col` of (h, i) columns sums the
// chunk's rows in row order into partial row c of `part` (chunks, 2, H·d);
// the blocks then write dpo (grid-stride, each element summing b in order);
// the last block to arrive (common.cuh last_tile_arrived on `arrivals`, a
// counter 0 at the launch and 0 after it) adds the partial rows in chunk
// order into du and dvb. Every sum in a fixed order: the same bits every run.
template <typename T>
__device__ void attention_pos_grads(const acc_t<T>* __restrict__ dp, const acc_t<T>* __restrict__ sk, const T* __restrict__ k,
                                    const T* __restrict__ p, T* __restrict__ dpo, acc_t<T>* part, acc_t<T>* __restrict__ du,
                                    acc_t<T>* __restrict__ dvb, unsigned long long* arrivals, uint64_t B, uint64_t T2, uint32_t H,
                                    uint32_t d, uint32_t shared_table, uint64_t chunk, uint64_t kv_ld, uint64_t k_off) {
    typedef acc_t<T> A;
    const uint64_t rows = B * T2, hd = (uint64_t)H * d, chunks = (rows + chunk - 1) / chunk;
    for (uint64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
        const uint64_t r0 = c * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
        for (uint64_t col = threadIdx.x; col < hd; col += blockDim.x) {
            const uint64_t h = col / d;
            A su = 0, sv = 0;
            for (uint64_t r = r0; r < r1; ++r) {
                const A s = sk[r * H + h];
                const uint64_t pr = shared_table ? r % T2 : r;
                su += s * to_acc(k[r * kv_ld + k_off + col]);
                sv += s * to_acc(p[pr * hd + col]);
            }
            part[(c * 2) * hd + col] = su;
            part[(c * 2 + 1) * hd + col] = sv;
        }
    }
    const uint64_t nout = (shared_table ? T2 : rows) * hd;
    for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; e < nout; e += (uint64_t)gridDim.x * blockDim.x) {
        A s = dp[e];
        if (shared_table)
            for (uint64_t b = 1; b < B; ++b) s += dp[b * T2 * hd + e];
        dpo[e] = from_acc<T>(s);
    }
    __shared__ int is_last;
    __threadfence();
    if (last_tile_arrived(arrivals, gridDim.x, &is_last)) {
        __threadfence();
        const volatile A* q = part;
        for (uint64_t col = threadIdx.x; col < hd; col += blockDim.x) {
            A su = 0, sv = 0;
            for (uint64_t c = 0; c < chunks; ++c) {
                su += q[(c * 2) * hd + col];
                sv += q[(c * 2 + 1) * hd + col];
            }
            du[col] = su;
            dvb[col] = sv;
        }
    }
}

#define ATTENTION_POS_GRADS_KERNELS(SUF, T)                                                                             \
    extern "C" __global__ void attention_pos_grads_##SUF(const acc_t<T>* dp, const acc_t<T>* sk, const T* k, const T* p, \
                                                         T* dpo, acc_t<T>* part, acc_t<T>* du, acc_t<T>* dvb,            \
                                                         unsigned long long* arrivals, uint64_t B, uint64_t T2,          \
                                                         uint32_t H, uint32_t d, uint32_t shared_table,                  \
                                                         uint64_t chunk, uint64_t kv_ld, uint64_t k_off) {               \
        attention_pos_grads<T>(dp, sk, k, p, dpo, part, du, dvb, arrivals, B, T2, H, d, shared_table, chunk, kv_ld, k_off); \
    }
NN_FLOAT_DTYPES(ATTENTION_POS_GRADS_KERNELS)
