// Optimizer kernels, the GPU twins of src/backend/cpu/optim.rs and of the
// global gradient norm in src/optim/clip.rs.
//
// adam_{f32,f64}: one Adam/AdamW step in place, one thread per element
// (grid-stride), in the parameter's precision (f32 master weights), with
// the CPU's order of operations:
//   decoupled: p −= lr·wd·p            else if wd ≠ 0: g' = g + wd·p
//   m = β1·m + (1−β1)·g',  v = β2·v + (1−β2)·g'²
//   p −= lr·(m·ibc1) / (√v·isbc2 + ε)  ibc1 = 1/(1−β1ᵗ), isbc2 = 1/√(1−β2ᵗ)
// Every product, sum, quotient and square root is an explicitly rounded
// intrinsic (no FMA contraction), so the update is bit-identical to the
// CPU's for the same inputs.
// Layouts: p, g, m, v (n) contiguous.
//
// sumsq_partial_{f32,f64} + sum_partials: the deterministic global squared
// norm. Each block of the first writes the f64 sum of squares of its
// grid-stride share of one tensor to partials[offset + blockIdx.x] (a
// shared-memory tree, no atomics); the second, one block, sums the whole
// partials buffer in a fixed order. For a fixed launch shape the result is
// bit-identical on every run.
//
// unscale_{f32,f64}: out = g · inv_scale (inv_scale rounded to T, as the
// CPU does) and found_inf[0] = 1 when any product is inf or NaN (every
// writer stores the same byte, so the race is benign; no float atomics).
// out may alias g.
//
// The fused multi-tensor step (mt_*): the same unscale → norm → clip →
// Adam sequence over every parameter in two launches. The parameters are
// cut into chunks of `chunk` elements (the last chunk of a tensor may be
// shorter). The step's table lives in device memory (one asynchronous copy
// from pinned memory per step, so a launch takes any number of tensors and
// chunks): per chunk one word, its tensor's slot (low 32 bits) and its
// index within that tensor (high 32 bits), then per tensor its p, g, m, v
// addresses and its length (MtHead says where each array starts). One
// block per chunk, grid-stride over chunks; each thread visits its strided
// elements of a chunk in ascending order, MT_UNROLL of them loaded before
// any is used, so a thread keeps several loads in flight (the reason the
// earlier kernels, one load per thread in flight over at most 192 blocks,
// ran at a fraction of the memory's bandwidth):
//   mt_norm_{dt}    pass A: u = g·T(inv_scale) (when amp), and per chunk
//                   (global index j = first_chunk + c) the f64 sum of u²
//                   (each thread's strided share in ascending order, then
//                   the block tree) in partials[2j] and whether any u is
//                   inf/NaN in partials[2j+1] (0 or 1). Every slot is
//                   written: no memset, no atomics on values; a chunk's
//                   value does not depend on the grid. With `fold` set (the
//                   step's last norm launch), the block that finishes last
//                   (common.cuh's last_tile_arrived on a kept counter) then
//                   runs pass B.
//   pass B          S = Σ partials[2j] over all `total` chunks in a fixed
//                   order (a block tree), norm = √S, found = any flag,
//                   skip = found or norm not finite, clip = !skip and
//                   max_norm > 0 and norm > max_norm, coef = max_norm /
//                   (norm + 1e-6) (f64, as clip.rs computes it); state =
//                   [norm, found, skip, clip, coef]. Nothing returns to the
//                   host but this buffer.
//   mt_adam_{dt}    pass C: nothing when state[2] (skip); else per element
//                   g' = g·T(inv_scale) (when amp), then g' = g'·T(coef) + 0
//                   (when clip: today's affine kernel, x·mul + add, with the
//                   same roundings: −0 becomes +0), then adam_{dt}'s update.
//                   The gradients are read, never written.
// So the fused step rounds exactly as unscale_{dt}, elementwise affine and
// adam_{dt} one after the other: bit-identical parameters and moments.
//
// The block size of the reductions must be a power of two no larger than
// OPT_THREADS.

#include <math.h>
#include "common.cuh"
#include <stdint.h>

#define OPT_THREADS 256

namespace {

// IEEE round-to-nearest arithmetic that nvcc never fuses into an FMA.
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float quo(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float root(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ double quo(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ double root(double a) { return __dsqrt_rn(a); }

// One Adam(W) update of a parameter value pi with moments mi, vi from its
// (already unscaled and clipped) gradient gi, in registers.
template <typename T>
__device__ __forceinline__ void adam_vals(T& pi, T& mi, T& vi, T gi, T lr, T b1, T b2, T eps, T wd, T ibc1, T isbc2,
                                          bool l2, int decoupled) {
    const T one = T(1);
    // The CPU's expressions, evaluated left to right:
    //   p − (lr·wd)·p;  g + wd·p;  β1·m + (1−β1)·g;  β2·v + ((1−β2)·g)·g;
    //   p − (lr·(m·ibc1)) / (√v·isbc2 + ε)
    if (decoupled) {
        pi = sub(pi, mul(mul(lr, wd), pi));
    } else if (l2) {
        gi = add(gi, mul(wd, pi));
    }
    mi = add(mul(b1, mi), mul(sub(one, b1), gi));
    vi = add(mul(b2, vi), mul(mul(sub(one, b2), gi), gi));
    pi = sub(pi, quo(mul(lr, mul(mi, ibc1)), add(mul(root(vi), isbc2), eps)));
}

template <typename T>
__device__ void adam_impl(T* p, const T* g, T* m, T* v, uint64_t n, double lr_, double b1_, double b2_, double eps_,
                          double wd_, double ibc1_, double isbc2_, int decoupled) {
    const T lr = T(lr_), b1 = T(b1_), b2 = T(b2_), eps = T(eps_), wd = T(wd_), ibc1 = T(ibc1_), isbc2 = T(isbc2_);
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
        T pi = p[i], mi = m[i], vi = v[i];
        adam_vals(pi, mi, vi, g[i], lr, b1, b2, eps, wd, ibc1, isbc2, wd_ != 0.0, decoupled);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
    }
}

template <typename T>
__device__ void sumsq_partial_impl(const T* x, uint64_t n, double* partials, uint64_t offset) {
    __shared__ double sh[OPT_THREADS];
    double acc = 0.0;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
        const double xv = (double)x[i];
        acc += xv * xv;
    }
    const double total = block_sum(acc, sh);
    if (threadIdx.x == 0) partials[offset + blockIdx.x] = total;
}

template <typename T>
__device__ void unscale_impl(const T* g, T* out, uint64_t n, double inv_scale, uint8_t* found_inf) {
    const T s = T(inv_scale);
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
        const T o = mul(g[i], s);
        out[i] = o;
        if (!isfinite(o)) found_inf[0] = 1;
    }
}

}  // namespace

// One block: the sum of partials[0..n) in a fixed order, written to out[0].
extern "C" __global__ void sum_partials(const double* partials, uint64_t n, double* out) {
    __shared__ double sh[OPT_THREADS];
    double acc = 0.0;
    for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partials[i];
    const double total = block_sum(acc, sh);
    if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = total;
}

#define OPTIM_KERNELS(SUFFIX, T)                                                                                \
    extern "C" __global__ void adam_##SUFFIX(T* p, const T* g, T* m, T* v, uint64_t n, double lr, double b1,    \
                                             double b2, double eps, double wd, double ibc1, double isbc2,       \
                                             int decoupled) {                                                   \
        adam_impl<T>(p, g, m, v, n, lr, b1, b2, eps, wd, ibc1, isbc2, decoupled);                               \
    }                                                                                                           \
    extern "C" __global__ void sumsq_partial_##SUFFIX(const T* x, uint64_t n, double* partials, uint64_t offset) { \
        sumsq_partial_impl<T>(x, n, partials, offset);                                                          \
    }                                                                                                           \
    extern "C" __global__ void unscale_##SUFFIX(const T* g, T* out, uint64_t n, double inv_scale,               \
                                                uint8_t* found_inf) {                                           \
        unscale_impl<T>(g, out, n, inv_scale, found_inf);                                                       \
    }

OPTIM_KERNELS(f32, float)
OPTIM_KERNELS(f64, double)

// ---- The fused multi-tensor step (see the file comment). ----

// Loads each thread issues before it uses any (memory-level parallelism).
#define MT_UNROLL 4

// Where the step's table is and what it covers, passed by value (host:
// `MtHead` in src/backend/cuda/optim.rs, 64-bit words in this order).
struct MtHead {
    u64 table;        // device address of the u64 table (see the file comment)
    u64 n_tensors;    // tensors of this launch (slots 0..n_tensors)
    u64 n_chunks;     // chunks of this launch
    u64 chunk;        // elements per chunk
    u64 first_chunk;  // global index of this launch's chunk 0 (its partials slot)
};

namespace {

// Chunk c's tensor slot and element range (the table's lengths follow its
// four address arrays).
__device__ __forceinline__ TableChunk mt_chunk(const MtHead& h, u64 c) {
    const u64* t = (const u64*)h.table;
    return table_chunk(t, c, t + h.n_chunks + 4 * h.n_tensors, h.chunk);
}

// Slot k's address of array `field` (0 p, 1 g, 2 m, 3 v).
template <typename T>
__device__ __forceinline__ T* mt_ptr(const MtHead& h, int field, uint32_t k) {
    return (T*)((const u64*)h.table)[h.n_chunks + (u64)field * h.n_tensors + k];
}

// Pass B over partials[0..2·total) into state[0..5): every thread of one
// block calls it; `sh` holds OPT_THREADS doubles.
__device__ void mt_decide(const double* partials, u64 total, double max_norm, double* state, double* sh) {
    double acc = 0.0, bad = 0.0;
    for (u64 j = threadIdx.x; j < total; j += blockDim.x) {
        acc = add(acc, partials[2 * j]);
        bad = add(bad, partials[2 * j + 1]);
    }
    const double sum = block_sum(acc, sh);
    const double nbad = block_sum(bad, sh);
    if (threadIdx.x == 0) {
        const double norm = root(sum);
        const bool found = nbad != 0.0;
        const bool skip = found || !isfinite(norm);
        const bool clip = !skip && max_norm > 0.0 && norm > max_norm;
        state[0] = norm;
        state[1] = found ? 1.0 : 0.0;
        state[2] = skip ? 1.0 : 0.0;
        state[3] = clip ? 1.0 : 0.0;
        state[4] = clip ? quo(max_norm, add(norm, 1e-6)) : 1.0;
    }
}

template <typename T>
__device__ void mt_norm_impl(const MtHead& h, double inv_scale, int amp, double* partials, int fold, u64 total,
                             double max_norm, double* state, unsigned long long* counter) {
    __shared__ double sh[OPT_THREADS];
    __shared__ int last;
    const T s = T(inv_scale);
    const u64 step = (u64)blockDim.x;
    for (u64 c = blockIdx.x; c < h.n_chunks; c += gridDim.x) {
        const TableChunk r = mt_chunk(h, c);
        const T* g = mt_ptr<T>(h, 1, r.k);
        double acc = 0.0, bad = 0.0;
        for (u64 i0 = r.lo + threadIdx.x; i0 < r.hi; i0 += MT_UNROLL * step) {
            T u[MT_UNROLL];
#pragma unroll
            for (int q = 0; q < MT_UNROLL; ++q) {
                const u64 i = i0 + q * step;
                u[q] = i < r.hi ? g[i] : T(0);
            }
#pragma unroll
            for (int q = 0; q < MT_UNROLL; ++q) {
                if (i0 + q * step >= r.hi) break;
                T x = u[q];
                if (amp) x = mul(x, s);
                if (!isfinite(x)) bad = 1.0;
                const double d = (double)x;
                acc = add(acc, mul(d, d));
            }
        }
        const double sum = block_sum(acc, sh);
        const double nbad = block_sum(bad, sh);
        if (threadIdx.x == 0) {
            partials[2 * (h.first_chunk + c)] = sum;
            partials[2 * (h.first_chunk + c) + 1] = nbad != 0.0 ? 1.0 : 0.0;
        }
    }
    if (!fold) return;
    // Every block's partials visible before its arrival is counted.
    __threadfence();
    if (!last_tile_arrived(counter, (unsigned long long)gridDim.x, &last)) return;
    __threadfence();
    mt_decide(partials, total, max_norm, state, sh);
}

template <typename T>
__device__ void mt_adam_impl(const MtHead& h, const double* state, double inv_scale, int amp, double lr_, double b1_,
                             double b2_, double eps_, double wd_, double ibc1_, double isbc2_, int decoupled) {
    if (state[2] != 0.0) return;  // skipped: an inf/NaN gradient or a non-finite norm
    const bool clip = state[3] != 0.0;
    const T s = T(inv_scale), coef = T(state[4]), zero = T(0);
    const T lr = T(lr_), b1 = T(b1_), b2 = T(b2_), eps = T(eps_), wd = T(wd_), ibc1 = T(ibc1_), isbc2 = T(isbc2_);
    const u64 step = (u64)blockDim.x;
    for (u64 c = blockIdx.x; c < h.n_chunks; c += gridDim.x) {
        const TableChunk r = mt_chunk(h, c);
        T* p = mt_ptr<T>(h, 0, r.k);
        const T* g = mt_ptr<T>(h, 1, r.k);
        T* m = mt_ptr<T>(h, 2, r.k);
        T* v = mt_ptr<T>(h, 3, r.k);
        for (u64 i0 = r.lo + threadIdx.x; i0 < r.hi; i0 += MT_UNROLL * step) {
            T pq[MT_UNROLL], gq[MT_UNROLL], mq[MT_UNROLL], vq[MT_UNROLL];
#pragma unroll
            for (int q = 0; q < MT_UNROLL; ++q) {
                const u64 i = i0 + q * step;
                if (i < r.hi) {
                    pq[q] = p[i];
                    gq[q] = g[i];
                    mq[q] = m[i];
                    vq[q] = v[i];
                }
            }
#pragma unroll
            for (int q = 0; q < MT_UNROLL; ++q) {
                const u64 i = i0 + q * step;
                if (i >= r.hi) break;
                T gi = gq[q];
                if (amp) gi = mul(gi, s);
                if (clip) gi = add(mul(gi, coef), zero);
                adam_vals(pq[q], mq[q], vq[q], gi, lr, b1, b2, eps, wd, ibc1, isbc2, wd_ != 0.0, decoupled);
                p[i] = pq[q];
                m[i] = mq[q];
                v[i] = vq[q];
            }
        }
    }
}

}  // namespace

#define MT_KERNELS(SUFFIX, T)                                                                                     \
    extern "C" __global__ void mt_norm_##SUFFIX(MtHead h, double inv_scale, int amp, double* partials, int fold, \
                                                uint64_t total, double max_norm, double* state,                  \
                                                unsigned long long* counter) {                                    \
        mt_norm_impl<T>(h, inv_scale, amp, partials, fold, total, max_norm, state, counter);                      \
    }                                                                                                             \
    extern "C" __global__ void mt_adam_##SUFFIX(MtHead h, const double* state, double inv_scale, int amp,         \
                                                double lr, double b1, double b2, double eps, double wd,           \
                                                double ibc1, double isbc2, int decoupled) {                       \
        mt_adam_impl<T>(h, state, inv_scale, amp, lr, b1, b2, eps, wd, ibc1, isbc2, decoupled);                   \
    }

MT_KERNELS(f32, float)
MT_KERNELS(f64, double)
