// Casts between dtypes: y[i] = (To) x[i], elementwise over contiguous
// buffers of n elements. Floats convert through f32 (f64 through f64) with
// round-to-nearest-even into f16/bf16, as the CPU's `half` crate does;
// float -> i64/u8 truncates toward zero (PyTorch's `.to()`), with NaN -> 0
// and out-of-range values saturating (as the CPU's Rust `as` casts).
//
// cast_many_{from}_{to}: the same conversion over many tensors in one launch
// (autocast's half copies of a layer's weights, and their gradients back to
// f32). A launch takes a CastTable by value (at most CAST_TENSORS tensors and
// CAST_CHUNKS chunks, 2576 bytes of the 4 KiB parameter space; the host fills
// as many tables as it needs: `cast_tables` in src/backend/cuda/cast.rs), one
// block per chunk, grid-stride over chunks.
#include "common.cuh"

template <typename T> __device__ __forceinline__ double load_f64(T x) { return (double)to_acc(x); }
__device__ __forceinline__ double load_f64(i64 x) { return (double)x; }
__device__ __forceinline__ double load_f64(uint8_t x) { return (double)x; }

template <typename To> __device__ __forceinline__ To store_f64(double v);
template <> __device__ __forceinline__ float store_f64<float>(double v) { return (float)v; }
template <> __device__ __forceinline__ double store_f64<double>(double v) { return v; }
template <> __device__ __forceinline__ f16 store_f64<f16>(double v) { return __double2half(v); }
template <> __device__ __forceinline__ bf16 store_f64<bf16>(double v) { return __double2bfloat16(v); }
template <> __device__ __forceinline__ i64 store_f64<i64>(double v) { return (i64)v; }
template <> __device__ __forceinline__ uint8_t store_f64<uint8_t>(double v) {
    // Saturating, NaN -> 0, as Rust's `as u8` on the CPU.
    return v != v ? 0 : v <= 0.0 ? 0 : v >= 255.0 ? 255 : (uint8_t)v;
}

// Through f64 so f64 -> f16 rounds once (not twice via f32) and i64 stays exact
// up to 2^53.
template <typename From, typename To>
__device__ void cast(const From* x, To* y, i64 n) {
    GRID_LOOP(i, n) { y[i] = store_f64<To>(load_f64(x[i])); }
}

#define CAST(fname, From, tname, To) \
    extern "C" __global__ void cast_##fname##_##tname(const From* x, To* y, i64 n) { cast<From, To>(x, y, n); }

#define CAST_FROM(fname, From)        \
    CAST(fname, From, f32, float)     \
    CAST(fname, From, f64, double)    \
    CAST(fname, From, f16, f16)       \
    CAST(fname, From, bf16, bf16)     \
    CAST(fname, From, i64, i64)       \
    CAST(fname, From, u8, uint8_t)

CAST_FROM(f32, float)
CAST_FROM(f64, double)
CAST_FROM(f16, f16)
CAST_FROM(bf16, bf16)
CAST_FROM(i64, i64)
CAST_FROM(u8, uint8_t)

#define CAST_TENSORS 64
#define CAST_CHUNKS 256

// One launch's tensors and chunks (host: `CastTable` in src/backend/cuda/cast.rs,
// 64-bit words in this order); pointers are device addresses.
struct CastTable {
    u64 chunk;     // elements per chunk
    u64 n_chunks;  // chunks in this table (<= CAST_CHUNKS)
    u64 src[CAST_TENSORS];
    u64 dst[CAST_TENSORS];
    u64 len[CAST_TENSORS];
    uint32_t tensor[CAST_CHUNKS];  // chunk c -> its tensor's slot
    uint32_t index[CAST_CHUNKS];   // chunk c -> its index within that tensor
};

template <typename From, typename To>
__device__ void cast_many(const CastTable& t) {
    for (u64 c = blockIdx.x; c < t.n_chunks; c += gridDim.x) {
        const uint32_t k = t.tensor[c];
        const From* x = (const From*)t.src[k];
        To* y = (To*)t.dst[k];
        const u64 lo = (u64)t.index[c] * t.chunk;
        const u64 hi = lo + t.chunk < t.len[k] ? lo + t.chunk : t.len[k];
        for (u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) y[i] = store_f64<To>(load_f64(x[i]));
    }
}

#define CAST_MANY(fname, From, tname, To) \
    extern "C" __global__ void cast_many_##fname##_##tname(CastTable t) { cast_many<From, To>(t); }

CAST_MANY(f32, float, f16, f16)
CAST_MANY(f32, float, bf16, bf16)
CAST_MANY(f16, f16, f32, float)
CAST_MANY(bf16, bf16, f32, float)
// Copies in place of a conversion: a concatenation of several tensors into
// one buffer (each entry's dst an offset inside it) and its split back
// (`cast_pieces`: the packed q/k/v projection weights of full-precision runs).
CAST_MANY(f32, float, f32, float)
CAST_MANY(f16, f16, f16, f16)
CAST_MANY(bf16, bf16, bf16, bf16)
// Gathers into f64: one-element tensors (a step's loss values) written to
// consecutive elements of one f64 buffer (each table entry's dst is that
// element), so the host reads them with one copy (`gather_scalars_f64`).
CAST_MANY(f32, float, f64, double)
CAST_MANY(f64, double, f64, double)
CAST_MANY(f16, f16, f64, double)
CAST_MANY(bf16, bf16, f64, double)
