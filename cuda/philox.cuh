// Philox4x32-10 (Salmon et al., SC'11), the counter-based generator of
// src/tensor/rng.rs: the same words from the same (counter, key), so a
// kernel draws the CPU's dropout masks bit for bit. Shared by dropout.cu
// and attention.cu (attention dropout).
#pragma once
#include <stdint.h>

// Host-callable too, so its known answers can be checked without a GPU.
__host__ __device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
    const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        const unsigned long long p0 = (unsigned long long)M0 * c.x;
        const unsigned long long p1 = (unsigned long long)M1 * c.z;
        c = make_uint4((uint32_t)(p1 >> 32) ^ c.y ^ k.x, (uint32_t)p1, (uint32_t)(p0 >> 32) ^ c.w ^ k.y, (uint32_t)p0);
        k.x += W0;
        k.y += W1;
    }
    return c;
}

// Dropout's draw (src/tensor/rng.rs): the four words of counter block b,
// counter (lo32 b, hi32 b, 0, 0) under the key (lo32 seed, hi32 seed); a
// word keeps its element when its uniform (word + 0.5) / 2^32 (exact in
// f64) is below `keep`.
__host__ __device__ __forceinline__ uint4 philox_block(uint64_t seed, unsigned long long b) {
    return philox4x32_10(make_uint4((uint32_t)b, (uint32_t)(b >> 32), 0u, 0u), make_uint2((uint32_t)seed, (uint32_t)(seed >> 32)));
}
__host__ __device__ __forceinline__ bool philox_keeps(uint32_t word, double keep) { return ((double)word + 0.5) / 4294967296.0 < keep; }
