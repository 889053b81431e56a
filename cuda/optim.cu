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

template <typename T>
__device__ void adam_impl(T* p, const T* g, T* m, T* v, uint64_t n, double lr_, double b1_, double b2_, double eps_,
                          double wd_, double ibc1_, double isbc2_, int decoupled) {
    const T lr = T(lr_), b1 = T(b1_), b2 = T(b2_), eps = T(eps_), wd = T(wd_), ibc1 = T(ibc1_), isbc2 = T(isbc2_);
    const T one = T(1);
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
        T gi = g[i];
        T pi = p[i];
        // The CPU's expressions, evaluated left to right:
        //   p − (lr·wd)·p;  g + wd·p;  β1·m + (1−β1)·g;  β2·v + ((1−β2)·g)·g;
        //   p − (lr·(m·ibc1)) / (√v·isbc2 + ε)
        if (decoupled) {
            pi = sub(pi, mul(mul(lr, wd), pi));
        } else if (wd_ != 0.0) {
            gi = add(gi, mul(wd, pi));
        }
        const T mi = add(mul(b1, m[i]), mul(sub(one, b1), gi));
        const T vi = add(mul(b2, v[i]), mul(mul(sub(one, b2), gi), gi));
        m[i] = mi;
        v[i] = vi;
        p[i] = sub(pi, quo(mul(lr, mul(mi, ibc1)), add(mul(root(vi), isbc2), eps)));
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
