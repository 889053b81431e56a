// Casts between dtypes: y[i] = (To) x[i], elementwise over contiguous
// buffers of n elements. Floats convert through f32 (f64 through f64) with
// round-to-nearest-even into f16/bf16, as the CPU's `half` crate does;
// float -> i64/u8 truncates toward zero (PyTorch's `.to()`), with NaN -> 0
// and out-of-range values saturating (as the CPU's Rust `as` casts).
//
// cast_many_{from}_{to}: the same conversion over many tensors in one launch
// (autocast's half copies of a layer's weights, and their gradients back to
// f32). A launch takes a CastTable by value (at most CAST_TENSORS tensors and
// CAST_CHUNKS chunks, 2576 bytes of the 4 KiB parameter space), one block per
// chunk, grid-stride over chunks. cast_many_dev_{from}_{to} is the same
// conversion from a table in device memory (common.cuh's launch tables: per
// chunk a word, then the sources, destinations and lengths; CastHead gives its
// address), for conversions larger than one CastTable (the whole model's
// weights under autocast): one launch for any number of tensors and chunks,
// where by-value tables took one launch per 64 tensors or 4 Mi elements.
// Each thread loads CAST_UNROLL elements before it stores any.
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

#define CAST_UNROLL 4

// Elements [lo, hi) of x converted into y by one block, each thread's
// strided share CAST_UNROLL loads at a time.
template <typename From, typename To>
__device__ __forceinline__ void cast_range(const From* x, To* y, u64 lo, u64 hi) {
    const u64 step = blockDim.x;
    for (u64 i0 = lo + threadIdx.x; i0 < hi; i0 += CAST_UNROLL * step) {
        From v[CAST_UNROLL];
#pragma unroll
        for (int q = 0; q < CAST_UNROLL; ++q) {
            const u64 i = i0 + q * step;
            if (i < hi) v[q] = x[i];
        }
#pragma unroll
        for (int q = 0; q < CAST_UNROLL; ++q) {
            const u64 i = i0 + q * step;
            if (i < hi) y[i] = store_f64<To>(load_f64(v[q]));
        }
    }
}

template <typename From, typename To>
__device__ void cast_many(const CastTable& t) {
    for (u64 c = blockIdx.x; c < t.n_chunks; c += gridDim.x) {
        const uint32_t k = t.tensor[c];
        const u64 lo = (u64)t.index[c] * t.chunk;
        cast_range<From, To>((const From*)t.src[k], (To*)t.dst[k], lo, lo + t.chunk < t.len[k] ? lo + t.chunk : t.len[k]);
    }
}

// Where a device-memory cast table is and what it covers, by value (host:
// `cast_pieces_chunked` in src/backend/cuda/cast.rs, 64-bit words in this order).
struct CastHead {
    u64 table;     // device address of the u64 table
    u64 n_ranges;  // its entries (sources, destinations, lengths)
    u64 n_chunks;  // its chunks
    u64 chunk;     // elements per chunk
};

template <typename From, typename To>
__device__ void cast_many_dev(const CastHead& h) {
    const u64* t = (const u64*)h.table;
    const u64* src = t + h.n_chunks;
    const u64* dst = src + h.n_ranges;
    for (u64 c = blockIdx.x; c < h.n_chunks; c += gridDim.x) {
        const TableChunk r = table_chunk(t, c, dst + h.n_ranges, h.chunk);
        cast_range<From, To>((const From*)src[r.k], (To*)dst[r.k], r.lo, r.hi);
    }
}

#define CAST_MANY(fname, From, tname, To) \
    extern "C" __global__ void cast_many_##fname##_##tname(CastTable t) { cast_many<From, To>(t); }
// Both table kinds: the conversions and copies `cast_pieces` makes.
#define CAST_MANY_BOTH(fname, From, tname, To) \
    CAST_MANY(fname, From, tname, To)          \
    extern "C" __global__ void cast_many_dev_##fname##_##tname(CastHead h) { cast_many_dev<From, To>(h); }

CAST_MANY_BOTH(f32, float, f16, f16)
CAST_MANY_BOTH(f32, float, bf16, bf16)
CAST_MANY_BOTH(f16, f16, f32, float)
CAST_MANY_BOTH(bf16, bf16, f32, float)
// Copies in place of a conversion: a concatenation of several tensors into
// one buffer (each entry's dst an offset inside it) and its split back
// (`cast_pieces`: the packed q/k/v projection weights of full-precision runs).
CAST_MANY_BOTH(f32, float, f32, float)
CAST_MANY_BOTH(f16, f16, f16, f16)
CAST_MANY_BOTH(bf16, bf16, bf16, bf16)
// Gathers into f64: one-element tensors (a step's loss values) written to
// consecutive elements of one f64 buffer (each table entry's dst is that
// element), so the host reads them with one copy (`gather_scalars_f64`).
CAST_MANY(f32, float, f64, double)
CAST_MANY(f64, double, f64, double)
CAST_MANY(f16, f16, f64, double)
CAST_MANY(bf16, bf16, f64, double)
