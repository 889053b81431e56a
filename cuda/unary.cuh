// The unary maps f and their derivatives d(x, y) (y = f(x)), in the
// compute type A: elementwise.cu's {op}_fwd / {op}_bwd kernels and
// dropout.cu's activations fused with dropout read them from here.
#pragma once
#include "common.cuh"

#define INV_SQRT2 0.70710678118654752440
#define INV_SQRT_2PI 0.39894228040143267794

template <typename A> __device__ __forceinline__ A sigm(A x) { return A(1) / (A(1) + exp(-x)); }

struct Exp { template <typename A> __device__ static A f(A x) { return exp(x); }
             template <typename A> __device__ static A d(A x, A y) { return y; } };
struct Log { template <typename A> __device__ static A f(A x) { return log(x); }
             template <typename A> __device__ static A d(A x, A y) { return A(1) / x; } };
struct Sqrt { template <typename A> __device__ static A f(A x) { return sqrt(x); }
              template <typename A> __device__ static A d(A x, A y) { return A(0.5) / y; } };
struct Rsqrt { template <typename A> __device__ static A f(A x) { return A(1) / sqrt(x); }
               template <typename A> __device__ static A d(A x, A y) { return A(-0.5) * y * y * y; } };
struct Abs { template <typename A> __device__ static A f(A x) { return fabs(x); }
             template <typename A> __device__ static A d(A x, A y) { return x > A(0) ? A(1) : (x < A(0) ? A(-1) : A(0)); } };
struct Relu { template <typename A> __device__ static A f(A x) { return x > A(0) ? x : A(0); }
              template <typename A> __device__ static A d(A x, A y) { return x > A(0) ? A(1) : A(0); } };
struct Silu { template <typename A> __device__ static A f(A x) { return x * sigm(x); }
              template <typename A> __device__ static A d(A x, A y) { A s = sigm(x); return s * (A(1) + x * (A(1) - s)); } };
struct Gelu { template <typename A> __device__ static A f(A x) { return A(0.5) * x * (A(1) + erf(x * A(INV_SQRT2))); }
              template <typename A> __device__ static A d(A x, A y) {
                  A cdf = A(0.5) * (A(1) + erf(x * A(INV_SQRT2)));
                  return cdf + x * A(INV_SQRT_2PI) * exp(A(-0.5) * x * x); } };
struct Sigmoid { template <typename A> __device__ static A f(A x) { return sigm(x); }
                 template <typename A> __device__ static A d(A x, A y) { return y * (A(1) - y); } };
struct Tanh { template <typename A> __device__ static A f(A x) { return tanh(x); }
              template <typename A> __device__ static A d(A x, A y) { return A(1) - y * y; } };
