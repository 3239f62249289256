// Tensor-core intrinsics for the emulator tests (and the GPU test, which runs the same kernels).
#include "emmy_intrinsics.cuh"

// Fragments given directly in the documented layout: frags[lane] = a0..a3, b0, b1 registers.
// C holds 1, 2, 3, 4 in every lane's c0..c3.
extern "C" __global__ void mma_frag(float* d, const unsigned* frags, int bf16) {
    const int lane = threadIdx.x;
    const unsigned* f = frags + 6 * lane;
    unsigned a[4] = {f[0], f[1], f[2], f[3]};
    unsigned b[2] = {f[4], f[5]};
    float c[4] = {1.f, 2.f, 3.f, 4.f};
    if (bf16) mma_m16n8k16_bf16f32(c, a, b, c);
    else mma_m16n8k16_f16f32(c, a, b, c);
    for (int i = 0; i < 4; ++i) d[4 * lane + i] = c[i];
}

// Four 8x8 matrices of 16-bit values in shared memory; lane 8j + r addresses row r of matrix j.
// Writes every ldmatrix form's registers: x1, x2, x4, x1.trans, x2.trans, x4.trans (14 a lane).
extern "C" __global__ void ldmatrix_probe(unsigned* out, const unsigned short* m) {
    __shared__ __align__(16) unsigned short s[4 * 64];
    const int lane = threadIdx.x;
    for (int i = lane; i < 256; i += 32) s[i] = m[i];
    __syncthreads();
    const unsigned short* row = &s[8 * lane];
    unsigned r1[1], r2[2], r4[4], t1[1], t2[2], t4[4];
    ldmatrix_x1(r1, row);
    ldmatrix_x2(r2, row);
    ldmatrix_x4(r4, row);
    ldmatrix_x1_trans(t1, row);
    ldmatrix_x2_trans(t2, row);
    ldmatrix_x4_trans(t4, row);
    const unsigned all[14] = {r1[0], r2[0], r2[1], r4[0], r4[1], r4[2], r4[3],
                              t1[0], t2[0], t2[1], t4[0], t4[1], t4[2], t4[3]};
    for (int i = 0; i < 14; ++i) out[14 * lane + i] = all[i];
}

// One warp: C(16x8) = A(16x16, row-major) @ B(16x8, row-major [k][n]), staged through shared
// memory with cp.async; A's fragment from ldmatrix.x4, B's from ldmatrix.x2.trans.
template <bool BF16>
__device__ void mma_tile(float* __restrict__ c, const unsigned short* __restrict__ a,
                         const unsigned short* __restrict__ b) {
    __shared__ __align__(16) unsigned short as[16 * 16];
    __shared__ __align__(16) unsigned short bs[16 * 8];
    const int lane = threadIdx.x;
    cp_async_16(&as[lane * 8], &a[lane * 8]);                 // 32 lanes x 8 = 256 elements
    if (lane < 16) cp_async_16(&bs[lane * 8], &b[lane * 8]);  // 16 lanes x 8 = 128 elements
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    unsigned af[4], bf[2];
    ldmatrix_x4(af, &as[(lane % 16) * 16 + (lane / 16) * 8]);
    ldmatrix_x2_trans(bf, &bs[(lane % 16) * 8]);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if (BF16) mma_m16n8k16_bf16f32(acc, af, bf, acc);
    else mma_m16n8k16_f16f32(acc, af, bf, acc);
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = acc[i];
}

extern "C" __global__ void mma_f16(float* c, const unsigned short* a, const unsigned short* b) {
    mma_tile<false>(c, a, b);
}
extern "C" __global__ void mma_bf16(float* c, const unsigned short* a, const unsigned short* b) {
    mma_tile<true>(c, a, b);
}

// Issue-rate probe: each warp runs `iters` rounds of PEAK_CHAINS independent mma.sync m16n8k16
// chains on register operands, with no memory traffic but the final store. Every 16-bit element
// of A and B is `one` (1.0: 0x3c00 in f16, 0x3f80 in bf16), so each accumulator ends at exactly
// 16 * iters, which each thread writes (the mean of its accumulators).
#define PEAK_CHAINS 8
template <bool BF16>
__device__ void mma_peak_body(float* out, unsigned one, int iters) {
    const unsigned pair = one | one << 16;
    unsigned a[4] = {pair, pair, pair, pair}, b[2] = {pair, pair};
    float c[PEAK_CHAINS][4] = {};
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int j = 0; j < PEAK_CHAINS; ++j) {
            if (BF16) mma_m16n8k16_bf16f32(c[j], a, b, c[j]);
            else mma_m16n8k16_f16f32(c[j], a, b, c[j]);
        }
    }
    float s = 0.f;
    for (int j = 0; j < PEAK_CHAINS; ++j)
        for (int i = 0; i < 4; ++i) s += c[j][i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s / (4 * PEAK_CHAINS);
}

extern "C" __global__ void mma_peak(float* out, unsigned one, int iters, int bf16) {
    if (bf16) mma_peak_body<true>(out, one, iters);
    else mma_peak_body<false>(out, one, iters);
}
