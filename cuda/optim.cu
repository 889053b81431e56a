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
// Adam sequence over every parameter in a few launches. The parameters are
// cut into chunks of `chunk` elements (the last chunk of a tensor may be
// shorter); a launch takes an MtTable by value (at most MT_TENSORS tensors
// and MT_CHUNKS chunks, 3480 bytes of the 4 KiB parameter space; the host
// fills as many tables as it needs), one block per chunk, grid-stride over
// chunks:
//   mt_norm_{dt}    pass A: u = g·T(inv_scale) (when amp), and per chunk
//                   (global index j = first_chunk + c) the f64 sum of u²
//                   (each thread's strided share, then the block tree) in
//                   partials[2j] and whether any u is inf/NaN in
//                   partials[2j+1] (0 or 1). Every slot is written: no
//                   memset, no atomics; a chunk's value does not depend on
//                   the grid, so the norm is the same for any grid cap.
//   mt_finish       pass B, one block: S = Σ partials[2j] in a fixed order,
//                   norm = √S, found = any flag, skip = found or norm not
//                   finite, clip = !skip and max_norm > 0 and norm >
//                   max_norm, coef = max_norm / (norm + 1e-6) (f64, as
//                   clip.rs computes it); state = [norm, found, skip, clip,
//                   coef]. Nothing returns to the host but this buffer.
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

// One Adam(W) update of element i from its (already unscaled and clipped) gradient gi.
template <typename T>
__device__ __forceinline__ void adam_elem(T* p, T* m, T* v, uint64_t i, T gi, T lr, T b1, T b2, T eps, T wd, T ibc1, T isbc2,
                                          bool l2, int decoupled) {
    const T one = T(1);
    T pi = p[i];
    // The CPU's expressions, evaluated left to right:
    //   p − (lr·wd)·p;  g + wd·p;  β1·m + (1−β1)·g;  β2·v + ((1−β2)·g)·g;
    //   p − (lr·(m·ibc1)) / (√v·isbc2 + ε)
    if (decoupled) {
        pi = sub(pi, mul(mul(lr, wd), pi));
    } else if (l2) {
        gi = add(gi, mul(wd, pi));
    }
    const T mi = add(mul(b1, m[i]), mul(sub(one, b1), gi));
    const T vi = add(mul(b2, v[i]), mul(mul(sub(one, b2), gi), gi));
    m[i] = mi;
    v[i] = vi;
    p[i] = sub(pi, quo(mul(lr, mul(mi, ibc1)), add(mul(root(vi), isbc2), eps)));
}

template <typename T>
__device__ void adam_impl(T* p, const T* g, T* m, T* v, uint64_t n, double lr_, double b1_, double b2_, double eps_,
                          double wd_, double ibc1_, double isbc2_, int decoupled) {
    const T lr = T(lr_), b1 = T(b1_), b2 = T(b2_), eps = T(eps_), wd = T(wd_), ibc1 = T(ibc1_), isbc2 = T(isbc2_);
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
        adam_elem(p, m, v, i, g[i], lr, b1, b2, eps, wd, ibc1, isbc2, wd_ != 0.0, decoupled);
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

#define MT_TENSORS 48
#define MT_CHUNKS 192

// One launch's tensors and chunks, passed by value (host: `mt_table_words`
// in src/backend/cuda/optim.rs, 64-bit words in this order). Pointers are
// device addresses; m and v may be 0 in a table only pass A reads.
struct MtTable {
    u64 chunk;        // elements per chunk
    u64 n_chunks;     // chunks in this table (<= MT_CHUNKS)
    u64 first_chunk;  // global index of chunk 0 of this table (its partials slot)
    u64 p[MT_TENSORS];
    u64 g[MT_TENSORS];
    u64 m[MT_TENSORS];
    u64 v[MT_TENSORS];
    u64 len[MT_TENSORS];
    uint32_t tensor[MT_CHUNKS];  // chunk c -> its tensor's slot
    uint32_t index[MT_CHUNKS];   // chunk c -> its index within that tensor
};

namespace {

template <typename T>
__device__ void mt_norm_impl(const MtTable& t, double inv_scale, int amp, double* partials) {
    __shared__ double sh[OPT_THREADS];
    const T s = T(inv_scale);
    for (u64 c = blockIdx.x; c < t.n_chunks; c += gridDim.x) {
        const uint32_t k = t.tensor[c];
        const T* g = (const T*)t.g[k];
        const u64 lo = (u64)t.index[c] * t.chunk;
        const u64 hi = lo + t.chunk < t.len[k] ? lo + t.chunk : t.len[k];
        double acc = 0.0, bad = 0.0;
        for (u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            T u = g[i];
            if (amp) u = mul(u, s);
            if (!isfinite(u)) bad = 1.0;
            const double x = (double)u;
            acc = add(acc, mul(x, x));
        }
        const double total = block_sum(acc, sh);
        const double nbad = block_sum(bad, sh);
        if (threadIdx.x == 0) {
            partials[2 * (t.first_chunk + c)] = total;
            partials[2 * (t.first_chunk + c) + 1] = nbad != 0.0 ? 1.0 : 0.0;
        }
    }
}

template <typename T>
__device__ void mt_adam_impl(const MtTable& t, const double* state, double inv_scale, int amp, double lr_, double b1_,
                             double b2_, double eps_, double wd_, double ibc1_, double isbc2_, int decoupled) {
    if (state[2] != 0.0) return;  // skipped: an inf/NaN gradient or a non-finite norm
    const bool clip = state[3] != 0.0;
    const T s = T(inv_scale), coef = T(state[4]), zero = T(0);
    const T lr = T(lr_), b1 = T(b1_), b2 = T(b2_), eps = T(eps_), wd = T(wd_), ibc1 = T(ibc1_), isbc2 = T(isbc2_);
    for (u64 c = blockIdx.x; c < t.n_chunks; c += gridDim.x) {
        const uint32_t k = t.tensor[c];
        T* p = (T*)t.p[k];
        const T* g = (const T*)t.g[k];
        T* m = (T*)t.m[k];
        T* v = (T*)t.v[k];
        const u64 lo = (u64)t.index[c] * t.chunk;
        const u64 hi = lo + t.chunk < t.len[k] ? lo + t.chunk : t.len[k];
        for (u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            T gi = g[i];
            if (amp) gi = mul(gi, s);
            if (clip) gi = add(mul(gi, coef), zero);
            adam_elem(p, m, v, i, gi, lr, b1, b2, eps, wd, ibc1, isbc2, wd_ != 0.0, decoupled);
        }
    }
}

}  // namespace

// Pass B, one block: the global norm and the step's decisions from the
// partials of `n_chunks` chunks, into state[0..5).
extern "C" __global__ void mt_finish(const double* partials, uint64_t n_chunks, double max_norm, double* state) {
    __shared__ double sh[OPT_THREADS];
    double acc = 0.0, bad = 0.0;
    for (u64 j = threadIdx.x; j < n_chunks; j += blockDim.x) {
        acc = add(acc, partials[2 * j]);
        bad = add(bad, partials[2 * j + 1]);
    }
    const double total = block_sum(acc, sh);
    const double nbad = block_sum(bad, sh);
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        const double norm = root(total);
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

#define MT_KERNELS(SUFFIX, T)                                                                                     \
    extern "C" __global__ void mt_norm_##SUFFIX(MtTable t, double inv_scale, int amp, double* partials) {         \
        mt_norm_impl<T>(t, inv_scale, amp, partials);                                                             \
    }                                                                                                             \
    extern "C" __global__ void mt_adam_##SUFFIX(MtTable t, const double* state, double inv_scale, int amp,        \
                                                double lr, double b1, double b2, double eps, double wd,           \
                                                double ibc1, double isbc2, int decoupled) {                       \
        mt_adam_impl<T>(t, state, inv_scale, amp, lr, b1, b2, eps, wd, ibc1, isbc2, decoupled);                   \
    }

MT_KERNELS(f32, float)
MT_KERNELS(f64, double)
