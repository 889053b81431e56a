// The depthwise conv1d's weight-gradient template of conv.cu (the math and
// layouts are in conv.cu's opening comment), shared with conv_module.cu,
// which feeds it f32 inputs (X) for half weights (T).
#pragma once
#include "nn_common.cuh"

// Weight and bias gradients in one launch: a block per (tap kk, group of 32
// channels) (kk = K: the bias), its NN_BLOCK threads as 32 channel lanes x
// DW_ROWS row lanes. Row lane ly sums, sequence after sequence, the frames
// ly, ly + DW_ROWS, ... of the tap's valid range in order (each warp reads 32
// consecutive channels of one frame), then lane 0 adds the DW_ROWS partial
// sums in order: a fixed order, reproducible bits, no atomics. X: the type
// of x and gy when it is not T's (the sums are in Num<T>::acc either way).
#define DW_ROWS (NN_BLOCK / 32)
template <typename T, typename X = T>
__device__ void conv1d_depthwise_bwd_weight(const X* __restrict__ x, const X* __restrict__ gy, T* __restrict__ gw,
                                            T* __restrict__ gbias, uint32_t b, uint32_t c, uint32_t t, uint32_t k, uint32_t pad,
                                            uint32_t to) {
    typedef typename Num<T>::acc A;
    __shared__ A sh[DW_ROWS][32];
    const uint32_t groups = (c + 31) / 32;
    const uint32_t lx = threadIdx.x % 32, ly = threadIdx.x / 32;
    NN_BLOCK_ROWS(blk, (size_t)(k + 1) * groups) {
        const uint32_t kk = (uint32_t)(blk / groups);
        const size_t ch = (blk % groups) * 32 + lx;
        A s = 0;
        if (ch < c) {
            if (kk == k) {
                for (size_t r = ly; r < (size_t)b * to; r += DW_ROWS) s += Num<X>::to(gy[r * c + ch]);
            } else {
                // Output frames ot whose input frame ot + kk - pad is inside x.
                const long long lo0 = (long long)pad - kk, hi0 = (long long)t + pad - kk;
                const size_t lo = lo0 > 0 ? (size_t)lo0 : 0;
                const size_t hi = hi0 < (long long)to ? (hi0 > 0 ? (size_t)hi0 : 0) : to;
                const size_t span = hi > lo ? hi - lo : 0;
                // Row lane ly takes frames lo + ly, lo + ly + DW_ROWS, ... of
                // each sequence in turn: no division per term (the 64-bit
                // j / span, j % span of a flat index made this kernel 1.4 ms
                // of a 33 ms bf16 step on an H200 for 24 MB read).
                if (span > 0) {
                    for (uint32_t bi = 0; bi < b; ++bi) {
                        const X* gb = gy + (size_t)bi * to * c + ch;
                        const X* xb = x + (size_t)bi * t * c + ch;
                        for (size_t ot = lo + ly; ot < hi; ot += DW_ROWS)
                            s += Num<X>::to(gb[ot * c]) * Num<X>::to(xb[(ot + kk - pad) * c]);
                    }
                }
            }
        }
        sh[ly][lx] = s;
        __syncthreads();
        if (ly == 0 && ch < c) {
            A tot = 0;
            for (uint32_t r = 0; r < DW_ROWS; ++r) tot += sh[r][lx];
            if (kk == k)
                gbias[ch] = Num<T>::from(tot);
            else
                gw[ch * k + kk] = Num<T>::from(tot);
        }
        __syncthreads();
    }
}
