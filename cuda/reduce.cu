// Reductions over one dim, the twin of src/backend/cpu/reduce.rs.
// Layout (outer, n, inner) around the reduced dim; output (outer, inner).
//
//   sum_rows_{dt}(x, y, rows, n)          inner == 1: one block per row, each
//       thread sums a strided slice in acc_t with 16-byte loads, then
//       common.cuh's block_sum (warp shuffles and one shared exchange; fixed
//       order, so the result is deterministic run to run).
//   sum_rows_warp_{dt}(x, y, rows, n)     inner == 1, short rows: one warp
//       per row, a warp-shuffle sum (the host's choice for n <= 256).
//   sum_rows_tiled_{dt}(x, y, partials, counters, rows, n, tile)  inner == 1,
//       few long rows (a full sum): row tiles in blockIdx.y, the tile sums
//       added in tile order by the row's last block (one launch).
//   sum_cols_{dt}(x, y, outer, n, inner)  inner > 1: one thread per output,
//       summing its column in index order (deterministic, coalesced reads);
//       the host's choice when there are many outputs or few rows.
//   sum_cols_tiled_{dt}(x, y, partials, counters, outer, n, inner, tile_rows)
//       inner > 1, few outputs over many rows: a 2-D grid of (column strip,
//       row tile) blocks and a fixed-order sum of the tile sums by the last
//       block of each strip (see the kernel; one launch, deterministic).
//   sum_rows[_warp|_tiled]_{f16,bf16}_to_f32, sum_cols[_tiled]_{f16,bf16}_to_f32: the same sums
//       of half inputs stored in f32, unrounded: a reduction over several
//       dims keeps its partial sums in f32 and rounds to half once, at the
//       end (4x300x129 halves summed dim by dim in f16 overflow to inf).
//   max_dim_{dt}(x, val, arg, outer, n, inner): value and first arg-max;
//       NaN propagates (the first NaN wins), as on the CPU.
//   max_dim_bwd_{dt}(g, arg, out, outer, n, inner): out (zeroed by the host)
//       gets g at the arg-max positions.
//   expand_dim_{dt}(x, y, outer, n, inner): y[o,k,j] = x[o,j].
#include "common.cuh"

// One thread's share of the sum of p[0..n): the scalar head up to the
// first 16-byte boundary (a row of a buffer whose row bytes are not a
// multiple of 16 starts anywhere), then 16-byte vectors, then the scalar
// tail, each thread adding its elements in index order: a fixed order for a
// fixed shape.
template <typename T>
__device__ __forceinline__ acc_t<T> thread_range_sum(const T* p, i64 n) {
    typedef acc_t<T> A;
    const int W = 16 / sizeof(T);
    const i64 head = elems_to_align16(p, n);
    const i64 nv = (n - head) / W;
    const Pack16<T>* vec = reinterpret_cast<const Pack16<T>*>(p + head);
    A s = A(0);
    for (i64 k = threadIdx.x; k < head; k += blockDim.x) s += to_acc(p[k]);
    for (i64 k = threadIdx.x; k < nv; k += blockDim.x) {
        const Pack16<T> v = vec[k];
#pragma unroll
        for (int j = 0; j < W; ++j) s += to_acc(v.v[j]);
    }
    for (i64 k = head + nv * W + threadIdx.x; k < n; k += blockDim.x) s += to_acc(p[k]);
    return s;
}

template <typename T, typename O = T>
__device__ void sum_rows(const T* x, O* y, i64 rows, i64 n) {
    typedef acc_t<T> A;
    extern __shared__ __align__(8) unsigned char smem_raw[];
    A* smem = reinterpret_cast<A*>(smem_raw);
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const A s = block_sum<A>(thread_range_sum(x + r * n, n), smem);
        if (threadIdx.x == 0) y[r] = from_acc<O>(s);
    }
}

// Few long rows (a full sum of a large tensor: one row, which one block per
// row would leave to a single SM): blockIdx.y cuts each row into gridDim.y
// tiles of `tile` elements; a block sums its tile as sum_rows does and
// writes it to partials[row][tile]; the block that finishes a row last (a
// counter per row, the device's kept counters, which that block sets back
// to 0 (common.cuh last_tile_arrived); no value goes through the atomic)
// adds the row's tile sums in tile order. A fixed order for a fixed shape,
// under every schedule. Blocks grid-stride over rows (blockIdx.x).
template <typename T, typename O = T>
__device__ void sum_rows_tiled(const T* x, O* y, acc_t<T>* partials, unsigned long long* counters, i64 rows, i64 n, i64 tile) {
    typedef acc_t<T> A;
    extern __shared__ __align__(8) unsigned char smem_raw[];
    A* smem = reinterpret_cast<A*>(smem_raw);
    __shared__ int is_last;
    const i64 tiles = gridDim.y, t = blockIdx.y;
    const i64 lo = t * tile, hi = lo + tile < n ? lo + tile : n;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const A s = block_sum<A>(thread_range_sum(x + r * n + lo, hi > lo ? hi - lo : 0), smem);
        if (threadIdx.x == 0) {
            partials[r * tiles + t] = s;
            // The tile sum is visible to every block before the counter
            // says this tile is done.
            __threadfence();
        }
        if (last_tile_arrived(&counters[r], (unsigned long long)tiles, &is_last) && threadIdx.x == 0) {
            __threadfence();
            const volatile A* part = partials + r * tiles;
            A sum = A(0);
            for (i64 q = 0; q < tiles; ++q) sum += part[q];
            y[r] = from_acc<O>(sum);
        }
        // `is_last` is rewritten for the next row.
        __syncthreads();
    }
}

// Short rows (the host's choice for n <= SHORT_ROW): one warp per row,
// blockDim.x / 32 rows per block, a warp-shuffle sum with no barrier and no
// shared memory (a block per row would leave most of its threads idle).
// The row loop is per warp, so every lane of a warp meets every shuffle.
template <typename T, typename O = T>
__device__ void sum_rows_warp(const T* x, O* y, i64 rows, i64 n) {
    typedef acc_t<T> A;
    const unsigned lane = threadIdx.x & 31u;
    const i64 warps = blockDim.x >> 5;
    for (i64 r = (i64)blockIdx.x * warps + (threadIdx.x >> 5); r < rows; r += (i64)gridDim.x * warps) {
        const T* row = x + r * n;
        A s = A(0);
        for (i64 k = lane; k < n; k += 32) s += to_acc(row[k]);
        s = warp_reduce_to_lane0(s, SumOp(), 32u);
        if (lane == 0) y[r] = from_acc<O>(s);
    }
}

template <typename T, typename O = T>
__device__ void sum_cols(const T* x, O* y, i64 outer, i64 n, i64 inner) {
    typedef acc_t<T> A;
    GRID_LOOP(i, outer * inner) {
        i64 o = i / inner, j = i % inner;
        const T* p = x + o * n * inner + j;
        A s = A(0);
        for (i64 k = 0; k < n; ++k) s += to_acc(p[k * inner]);
        y[i] = from_acc<O>(s);
    }
}

// Tiled column sums for few outputs over many rows (a bias gradient
// (2048, 256): the one-pass kernel above gives it one block). The columns
// of each `outer` slice are cut into strips of COL_STRIP, the rows into
// `tiles` tiles of `tile_rows`; block (strip, tile) has COL_STRIP x
// ROW_LANES threads: thread (c, r) adds rows r, r + ROW_LANES, ... of its
// tile in column c (a warp reads COL_STRIP consecutive elements of a row:
// coalesced), the ROW_LANES partials of a column are added in lane order,
// and the tile's sum goes to partials[strip][tile][c]. The block that
// finishes a strip last (a counter per strip of the device's kept counters,
// set back to 0 by that block: the only atomic, and no value goes through
// it) adds the strip's tile sums in tile
// order. So every sum has a fixed order: the same bits every run and under
// every schedule. Blocks grid-stride over strips (blockIdx.x), one tile
// each (blockIdx.y).
#define COL_STRIP 32
#define ROW_LANES 8

template <typename T, typename O = T>
__device__ void sum_cols_tiled(const T* x, O* y, acc_t<T>* partials, unsigned long long* counters, i64 outer, i64 n, i64 inner,
                               i64 tile_rows) {
    typedef acc_t<T> A;
    __shared__ A sh[ROW_LANES][COL_STRIP + 1];
    __shared__ int is_last;
    const i64 strips_per_slice = (inner + COL_STRIP - 1) / COL_STRIP;
    const i64 strips = outer * strips_per_slice;
    const i64 tiles = gridDim.y, tile = blockIdx.y;
    const unsigned c = threadIdx.x % COL_STRIP, r = threadIdx.x / COL_STRIP;
    const i64 r0 = tile * tile_rows;
    const i64 r1 = r0 + tile_rows < n ? r0 + tile_rows : n;
    for (i64 s = blockIdx.x; s < strips; s += gridDim.x) {
        const i64 o = s / strips_per_slice;
        const i64 j = (s - o * strips_per_slice) * COL_STRIP + c;
        A acc = A(0);
        if (j < inner) {
            const T* col = x + o * n * inner + j;
            for (i64 k = r0 + r; k < r1; k += ROW_LANES) acc += to_acc(col[k * inner]);
        }
        sh[r][c] = acc;
        __syncthreads();
        A* part = partials + (s * tiles + tile) * COL_STRIP;
        if (r == 0) {
            A t = sh[0][c];
#pragma unroll
            for (int q = 1; q < ROW_LANES; ++q) t += sh[q][c];
            part[c] = t;
            // The tile sum is visible to every block before the counter
            // says this tile is done.
            __threadfence();
        }
        if (last_tile_arrived(&counters[s], (unsigned long long)tiles, &is_last) && r == 0 && j < inner) {
            __threadfence();
            const volatile A* strip = partials + s * tiles * COL_STRIP + c;
            A t = A(0);
            for (i64 q = 0; q < tiles; ++q) t += strip[q * COL_STRIP];
            y[o * inner + j] = from_acc<O>(t);
        }
        // `sh` and `is_last` are rewritten for the next strip.
        __syncthreads();
    }
}

template <typename T>
__device__ void max_dim(const T* x, T* val, i64* arg, i64 outer, i64 n, i64 inner) {
    typedef acc_t<T> A;
    GRID_LOOP(i, outer * inner) {
        i64 o = i / inner, j = i % inner;
        const T* p = x + o * n * inner + j;
        A best = to_acc(p[0]);
        i64 bi = 0;
        for (i64 k = 1; k < n; ++k) {
            A c = to_acc(p[k * inner]);
            if (c > best || (c != c && best == best)) {
                best = c;
                bi = k;
            }
        }
        val[i] = p[bi * inner];
        arg[i] = bi;
    }
}

template <typename T>
__device__ void max_dim_bwd(const T* g, const i64* arg, T* out, i64 outer, i64 n, i64 inner) {
    GRID_LOOP(i, outer * inner) {
        i64 o = i / inner, j = i % inner;
        out[o * n * inner + arg[i] * inner + j] = g[i];
    }
}

template <typename T>
__device__ void expand_dim(const T* x, T* y, i64 outer, i64 n, i64 inner) {
    GRID_LOOP(i, outer * n * inner) {
        i64 j = i % inner, o = i / (n * inner);
        y[i] = x[o * inner + j];
    }
}

#define REDUCE(dt, T)                                                                                           \
    extern "C" __global__ void sum_rows_##dt(const T* x, T* y, i64 rows, i64 n) { sum_rows<T>(x, y, rows, n); } \
    extern "C" __global__ void sum_rows_warp_##dt(const T* x, T* y, i64 rows, i64 n) {                       \
        sum_rows_warp<T>(x, y, rows, n);                                                                        \
    }                                                                                                           \
    extern "C" __global__ void sum_rows_tiled_##dt(const T* x, T* y, acc_t<T>* partials, unsigned long long* counters, \
                                                   i64 rows, i64 n, i64 tile) {                                        \
        sum_rows_tiled<T>(x, y, partials, counters, rows, n, tile);                                                 \
    }                                                                                                           \
    extern "C" __global__ void sum_cols_##dt(const T* x, T* y, i64 outer, i64 n, i64 inner) {                 \
        sum_cols<T>(x, y, outer, n, inner);                                                                     \
    }                                                                                                           \
    extern "C" __global__ void sum_cols_tiled_##dt(const T* x, T* y, acc_t<T>* partials, unsigned long long* counters, i64 outer, \
                                                   i64 n, i64 inner, i64 tile_rows) {                                        \
        sum_cols_tiled<T>(x, y, partials, counters, outer, n, inner, tile_rows);                                          \
    }                                                                                                                       \
    extern "C" __global__ void max_dim_##dt(const T* x, T* val, i64* arg, i64 outer, i64 n, i64 inner) {      \
        max_dim<T>(x, val, arg, outer, n, inner);                                                               \
    }                                                                                                           \
    extern "C" __global__ void max_dim_bwd_##dt(const T* g, const i64* arg, T* out, i64 outer, i64 n, i64 inner) { \
        max_dim_bwd<T>(g, arg, out, outer, n, inner);                                                               \
    }                                                                                                           \
    extern "C" __global__ void expand_dim_##dt(const T* x, T* y, i64 outer, i64 n, i64 inner) {               \
        expand_dim<T>(x, y, outer, n, inner);                                                                   \
    }

REDUCE(f32, float)
REDUCE(f64, double)
REDUCE(f16, f16)
REDUCE(bf16, bf16)

// Half inputs summed into f32 partials (see the header).
#define REDUCE_TO_F32(dt, T)                                                                                   \
    extern "C" __global__ void sum_rows_##dt##_to_f32(const T* x, float* y, i64 rows, i64 n) {               \
        sum_rows<T, float>(x, y, rows, n);                                                                     \
    }                                                                                                          \
    extern "C" __global__ void sum_rows_warp_##dt##_to_f32(const T* x, float* y, i64 rows, i64 n) {          \
        sum_rows_warp<T, float>(x, y, rows, n);                                                                \
    }                                                                                                          \
    extern "C" __global__ void sum_rows_tiled_##dt##_to_f32(const T* x, float* y, float* partials,            \
                                                            unsigned long long* counters, i64 rows, i64 n,    \
                                                            i64 tile) {                                       \
        sum_rows_tiled<T, float>(x, y, partials, counters, rows, n, tile);                                     \
    }                                                                                                          \
    extern "C" __global__ void sum_cols_##dt##_to_f32(const T* x, float* y, i64 outer, i64 n, i64 inner) {   \
        sum_cols<T, float>(x, y, outer, n, inner);                                                             \
    }                                                                                                          \
    extern "C" __global__ void sum_cols_tiled_##dt##_to_f32(const T* x, float* y, float* partials,            \
                                                            unsigned long long* counters, i64 outer, i64 n,   \
                                                            i64 inner, i64 tile_rows) {                       \
        sum_cols_tiled<T, float>(x, y, partials, counters, outer, n, inner, tile_rows);                        \
    }

REDUCE_TO_F32(f16, f16)
REDUCE_TO_F32(bf16, bf16)
