// Elementwise kernels, the twin of src/backend/cpu/elementwise.rs.
//
//   unary   y[i] = f(x[i])                      {op}_fwd_{dt}(x, y, n)
//   backward gx[i] = gy[i] * f'(x[i], y[i])     {op}_bwd_{dt}(x, y, gy, gx, n)
//   affine  y[i] = x[i]*mul + add               affine_{dt}(x, y, mul, add, n)
//   pow     y[i] = x[i]^p                       pow_{dt}(x, y, p, n)
//   add_scaled y[i] = a[i] + c*b[i]             add_scaled_{dt}(a, b, y, c, n)
//             (the macaron residual x + 0.5*ff(x) in one launch)
//   binary  y[i] = a[i] op b[i], same shape     {op}_{dt}(a, b, y, n)
//   broadcast y[i] = a[oa(i)] op b[ob(i)]       {op}_bcast_{dt}(a, b, y, Bcast, n)
//             (u32 indices, host divisors)      {op}_bcast_u32_{dt}(a, b, y, Bcast32, n)
//
// Layouts: contiguous row-major buffers of n elements; a broadcast operand
// is read through strides that are 0 on its broadcast dims (Bcast in
// common.cuh, the CPU's `Bcast`; Bcast32 when every index is below 2^31,
// with size-1 dims dropped and contiguous dims merged by the host). Math runs in acc_t<T> (f32 for
// f32/f16/bf16, f64 for f64). The same-shape binary kernels read and write
// 16-byte vectors (the host launches them only on 16-byte aligned buffers,
// which every pooled block is) and finish the tail element by element.
#include "common.cuh"

#include "unary.cuh"

template <typename Op, typename T>
__device__ void unary_fwd(const T* x, T* y, i64 n) {
    GRID_LOOP(i, n) { y[i] = from_acc<T>(Op::f(to_acc(x[i]))); }
}

// The derivative sees x and y in acc_t, as the CPU sees them in T.
template <typename Op, typename T>
__device__ void unary_bwd(const T* x, const T* y, const T* gy, T* gx, i64 n) {
    GRID_LOOP(i, n) { gx[i] = from_acc<T>(to_acc(gy[i]) * Op::d(to_acc(x[i]), to_acc(y[i]))); }
}

#define UNARY(name, Op, dt, T)                                                                        \
    extern "C" __global__ void name##_fwd_##dt(const T* x, T* y, i64 n) { unary_fwd<Op, T>(x, y, n); } \
    extern "C" __global__ void name##_bwd_##dt(const T* x, const T* y, const T* gy, T* gx, i64 n) {   \
        unary_bwd<Op, T>(x, y, gy, gx, n);                                                            \
    }

template <typename T>
__device__ void affine_k(const T* x, T* y, acc_t<T> mul, acc_t<T> add, i64 n) {
    GRID_LOOP(i, n) { y[i] = from_acc<T>(to_acc(x[i]) * mul + add); }
}
template <typename T>
__device__ void add_scaled_k(const T* a, const T* b, T* y, acc_t<T> c, i64 n) {
    GRID_LOOP(i, n) { y[i] = from_acc<T>(to_acc(a[i]) + c * to_acc(b[i])); }
}
template <typename T>
__device__ void pow_k(const T* x, T* y, acc_t<T> p, i64 n) {
    GRID_LOOP(i, n) { y[i] = from_acc<T>(pow(to_acc(x[i]), p)); }
}

struct Add { template <typename A> __device__ static A f(A a, A b) { return a + b; } };
struct Sub { template <typename A> __device__ static A f(A a, A b) { return a - b; } };
struct Mul { template <typename A> __device__ static A f(A a, A b) { return a * b; } };
struct Div { template <typename A> __device__ static A f(A a, A b) { return a / b; } };

template <typename T> struct alignas(16) Vec16 { T v[16 / sizeof(T)]; };

template <typename Op, typename T>
__device__ void binary_same(const T* a, const T* b, T* y, i64 n) {
    const int W = 16 / sizeof(T);
    i64 nv = n / W;
    const Vec16<T>* av = reinterpret_cast<const Vec16<T>*>(a);
    const Vec16<T>* bv = reinterpret_cast<const Vec16<T>*>(b);
    Vec16<T>* yv = reinterpret_cast<Vec16<T>*>(y);
    GRID_LOOP(i, nv) {
        Vec16<T> va = av[i], vb = bv[i], vy;
#pragma unroll
        for (int j = 0; j < W; ++j) vy.v[j] = from_acc<T>(Op::f(to_acc(va.v[j]), to_acc(vb.v[j])));
        yv[i] = vy;
    }
    // The tail (fewer than W elements) after the vectors.
    for (i64 i = nv * W + grid_start(); i < n; i += grid_stride()) y[i] = from_acc<T>(Op::f(to_acc(a[i]), to_acc(b[i])));
}

template <typename Op, typename T>
__device__ void binary_bcast(const T* a, const T* b, T* y, Bcast bc, i64 n) {
    GRID_LOOP(i, n) {
        i64 oa, ob;
        bcast_offsets(bc, i, &oa, &ob);
        y[i] = from_acc<T>(Op::f(to_acc(a[oa]), to_acc(b[ob])));
    }
}

// The same with u32 indices and host-computed divisors (all indices < 2^31).
template <typename Op, typename T>
__device__ void binary_bcast_u32(const T* a, const T* b, T* y, const Bcast32& bc, uint32_t n) {
    GRID_LOOP_U32(i, n) {
        uint32_t oa, ob;
        bcast32_offsets(bc, i, &oa, &ob);
        y[i] = from_acc<T>(Op::f(to_acc(a[oa]), to_acc(b[ob])));
    }
}

#define BINARY(name, Op, dt, T)                                                                            \
    extern "C" __global__ void name##_##dt(const T* a, const T* b, T* y, i64 n) { binary_same<Op, T>(a, b, y, n); } \
    extern "C" __global__ void name##_bcast_##dt(const T* a, const T* b, T* y, Bcast bc, i64 n) {          \
        binary_bcast<Op, T>(a, b, y, bc, n);                                                               \
    }                                                                                                      \
    extern "C" __global__ void name##_bcast_u32_##dt(const T* a, const T* b, T* y, Bcast32 bc, uint32_t n) { \
        binary_bcast_u32<Op, T>(a, b, y, bc, n);                                                           \
    }

#define ALL(dt, T)                                                                                     \
    UNARY(exp, Exp, dt, T)                                                                             \
    UNARY(log, Log, dt, T)                                                                             \
    UNARY(sqrt, Sqrt, dt, T)                                                                           \
    UNARY(rsqrt, Rsqrt, dt, T)                                                                         \
    UNARY(abs, Abs, dt, T)                                                                             \
    UNARY(relu, Relu, dt, T)                                                                           \
    UNARY(silu, Silu, dt, T)                                                                           \
    UNARY(gelu, Gelu, dt, T)                                                                           \
    UNARY(sigmoid, Sigmoid, dt, T)                                                                     \
    UNARY(tanh, Tanh, dt, T)                                                                           \
    BINARY(add, Add, dt, T)                                                                            \
    BINARY(sub, Sub, dt, T)                                                                            \
    BINARY(mul, Mul, dt, T)                                                                            \
    BINARY(div, Div, dt, T)                                                                            \
    extern "C" __global__ void affine_##dt(const T* x, T* y, acc_t<T> mul, acc_t<T> add, i64 n) {     \
        affine_k<T>(x, y, mul, add, n);                                                                \
    }                                                                                                  \
    extern "C" __global__ void add_scaled_##dt(const T* a, const T* b, T* y, acc_t<T> c, i64 n) {     \
        add_scaled_k<T>(a, b, y, c, n);                                                                \
    }                                                                                                  \
    extern "C" __global__ void pow_##dt(const T* x, T* y, acc_t<T> p, i64 n) { pow_k<T>(x, y, p, n); }

ALL(f32, float)
ALL(f64, double)
ALL(f16, f16)
ALL(bf16, bf16)
