// Test-only kernels for tests/emu_runtime.rs, compiled by build.rs into
// $OUT_DIR/emu/testdata/libemu_selftest.so (never into the real modules).
// Deliberate bugs (a removed barrier, a write past dynamic shared memory, a
// partial __syncthreads, a partial warp shuffle, a failing assert) that the
// emulator must report, and kernels exercising what no project kernel uses
// yet (warp intrinsics, atomics, 3-D launches, wmma).
#include <assert.h>
#include <mma.h>
#include "../../common.cuh"

// common.cuh's block_reduce with its first barrier removed (the bug under test).
template <typename A>
__device__ A block_sum_missing_barrier(A v, A* smem) {
    smem[threadIdx.x] = v;
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) smem[threadIdx.x] = smem[threadIdx.x] + smem[threadIdx.x + s];
        __syncthreads();
    }
    A r = smem[0];
    __syncthreads();
    return r;
}

// reduce.cu's sum_rows_f32 on top of the broken reduction.
extern "C" __global__ void sum_rows_missing_barrier_f32(const float* x, float* y, i64 rows, i64 n) {
    extern __shared__ __align__(8) unsigned char smem_raw[];
    float* smem = reinterpret_cast<float*>(smem_raw);
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* row = x + r * n;
        float s = 0;
        for (i64 k = threadIdx.x; k < n; k += blockDim.x) s += row[k];
        s = block_sum_missing_barrier<float>(s, smem);
        if (threadIdx.x == 0) y[r] = s;
    }
}

// Every thread writes its slot of dynamic shared memory, sized by the host.
extern "C" __global__ void fill_dyn_shared(float* out) {
    extern __shared__ float dyn_f[];
    dyn_f[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = dyn_f[blockDim.x - 1 - threadIdx.x];
}

// Only threads below `upto` reach the barrier.
extern "C" __global__ void partial_syncthreads(float* out, unsigned upto) {
    if (threadIdx.x < upto) __syncthreads();
    out[threadIdx.x] = 1.0f;
}

// Only the lower half of each warp reaches a full-mask shuffle.
extern "C" __global__ void partial_shfl(float* out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x % 32 < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}

extern "C" __global__ void assert_positive(const int* x, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) assert(x[i] > 0);
}

// Static shared memory: even blocks write the first `k` slots, odd blocks none;
// every slot is read after a barrier. Unwritten slots hold NaN bytes (0xFF) in
// the emulator, refilled at every block start.
extern "C" __global__ void read_uninit_shared(unsigned* out, unsigned k) {
    __shared__ unsigned sh[64];
    if (blockIdx.x % 2 == 0 && threadIdx.x < k) sh[threadIdx.x] = threadIdx.x;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = sh[threadIdx.x % 64];
}

// Warp intrinsics: per warp, an xor-butterfly sum, a shfl_down sum (lane 0),
// a broadcast of lane 3 (shfl), an inclusive scan (shfl_up), a ballot, any, all.
extern "C" __global__ void warp_ops(const float* x, float* xor_sum, float* down_sum, float* bcast, float* scan,
                                    unsigned* ballot, int* any_all, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const float v = i < n ? x[i] : 0.0f;
    float a = v;
    for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
    float d = v;
    for (int o = 16; o > 0; o >>= 1) d += __shfl_down_sync(0xffffffffu, d, o);
    const float b = __shfl_sync(0xffffffffu, v, 3);
    float s = v;
    for (int o = 1; o < 32; o <<= 1) {
        const float t = __shfl_up_sync(0xffffffffu, s, o);
        if ((threadIdx.x & 31) >= (unsigned)o) s += t;
    }
    const unsigned bal = __ballot_sync(0xffffffffu, v > 0.5f);
    const int an = __any_sync(0xffffffffu, v > 0.9f), al = __all_sync(0xffffffffu, v > 0.1f);
    __syncwarp();
    if (i < n) {
        xor_sum[i] = a;
        bcast[i] = b;
        scan[i] = s;
    }
    if ((threadIdx.x & 31) == 0) {
        const int w = i / 32;
        down_sum[w] = d;
        ballot[w] = bal;
        any_all[2 * w] = an;
        any_all[2 * w + 1] = al;
    }
}

// Atomics from every thread of every block.
extern "C" __global__ void atomics(int* count, float* fsum, double* dsum, unsigned* umax, unsigned long long* cas_count) {
    const unsigned g = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(count, 1);
    atomicAdd(fsum, 1.0f);
    atomicAdd(dsum, 0.5);
    atomicMax(umax, g);
    unsigned long long old = *cas_count, seen;
    while ((seen = atomicCAS(cas_count, old, old + 1)) != old) old = seen;
}

// 3-D grid and block: every thread writes its coordinates.
extern "C" __global__ void coords3d(unsigned* out) {
    const unsigned bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned* o = out + 6 * (bx * blockDim.x * blockDim.y * blockDim.z + tx);
    o[0] = blockIdx.x;
    o[1] = blockIdx.y;
    o[2] = blockIdx.z;
    o[3] = threadIdx.x;
    o[4] = threadIdx.y;
    o[5] = threadIdx.z;
}

// C (M x N, row-major, f32) = A (M x K, row-major) * B (K x N, stored
// column-major, i.e. as N x K rows), one warp per 16 x 16 tile of C.
template <typename T>
__device__ void wmma_gemm(const T* a, const T* b, float* c, int m, int n, int k) {
    using namespace nvcuda;
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int tiles_n = n / 16;
    if (warp >= (m / 16) * tiles_n) return;
    const int tm = warp / tiles_n, tn = warp % tiles_n;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < k; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
        wmma::load_matrix_sync(fa, a + (size_t)tm * 16 * k + kk, k);
        wmma::load_matrix_sync(fb, b + (size_t)tn * 16 * k + kk, k);
        wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c + (size_t)tm * 16 * n + tn * 16, acc, n, wmma::mem_row_major);
}
extern "C" __global__ void wmma_gemm_f16(const __half* a, const __half* b, float* c, int m, int n, int k) {
    wmma_gemm(a, b, c, m, n, k);
}
extern "C" __global__ void wmma_gemm_bf16(const __nv_bfloat16* a, const __nv_bfloat16* b, float* c, int m, int n, int k) {
    wmma_gemm(a, b, c, m, n, k);
}
// Only lanes 0..15 of the warp load a fragment: a partial warp collective.
extern "C" __global__ void wmma_partial(const __half* a) {
    using namespace nvcuda;
    if (threadIdx.x < 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
        wmma::load_matrix_sync(fa, a, 16);
    }
}

// Barriers that vote: count, and, or over the block.
extern "C" __global__ void sync_votes(int* out) {
    const int c = __syncthreads_count(threadIdx.x % 3 == 0);
    const int a = __syncthreads_and(threadIdx.x < 1000);
    const int a2 = __syncthreads_and(threadIdx.x != 7);
    const int o = __syncthreads_or(threadIdx.x == 5);
    const int o2 = __syncthreads_or(threadIdx.x > 1000);
    int* r = out + 5 * (blockIdx.x * blockDim.x + threadIdx.x);
    r[0] = c;
    r[1] = a;
    r[2] = a2;
    r[3] = o;
    r[4] = o2;
}

// A kernel declared inside an extern "C" block (the table generator must list it).
extern "C" {
__global__ void in_extern_c_block(int* out) { out[threadIdx.x] = (int)threadIdx.x * 3; }
}
