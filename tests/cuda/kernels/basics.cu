// Kernels for the emulator tests; each also compiles with NVRTC (tests/cuda/test_nvrtc.py).
#include "emmy_intrinsics.cuh"
#include "emmy_kernel.cuh"

// Sum of each row: a strided loop, a shuffle tree in each warp, a shared-memory tree across warps.
extern "C" __global__ void __launch_bounds__(256)
row_sum(float* __restrict__ out, const float* __restrict__ x, int n) {
    __shared__ float partial[32];
    const float* row = x + (size_t)blockIdx.x * n;
    float acc = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += row[i];
    for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    for (int s = blockDim.x / 64; s > 0; s /= 2) {   // tree over the warp partials
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

// Row max with the helper, dynamic shared memory sized by the launch.
extern "C" __global__ void row_max_dynamic(float* out, const float* x, int n) {
    extern __shared__ __align__(16) float scratch[];
    const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float m = -EMMY_INF_F32;
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, x[(size_t)blockIdx.x * n + i]);
    m = warp_max(m);
    if (lane == 0) scratch[warp] = m;
    __syncthreads();
    if (warp == 0) {
        m = warp_max(lane < warps ? scratch[lane] : -EMMY_INF_F32);
        if (lane == 0) out[blockIdx.x] = m;
    }
}

// Atomics across blocks: a float total, an int histogram, an int max, a CAS counter.
extern "C" __global__ void atomics(float* total, int* hist, int* biggest, int* cas_count,
                                   const float* x, const int* bins, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    atomicAdd(total, x[i]);
    atomicAdd(&hist[bins[i]], 1);
    atomicMax(biggest, bins[i] * 1000 + (i % 1000));
    int old = *cas_count, seen;
    do { seen = old; old = atomicCAS(cas_count, seen, seen + 1); } while (old != seen);
}

// y = a * x + b with 16-byte vector loads and stores; the tail is scalar.
extern "C" __global__ void axpb_float4(float* __restrict__ y, const float* __restrict__ x,
                                       float a, float b, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (4 * i + 3 < n) {
        float4 v = reinterpret_cast<const float4*>(x)[i];
        v.x = a * v.x + b; v.y = a * v.y + b; v.z = a * v.z + b; v.w = a * v.w + b;
        reinterpret_cast<float4*>(y)[i] = v;
    } else {
        for (int j = 4 * i; j < n; ++j) y[j] = a * x[j] + b;
    }
}

// Every shuffle and vote, one lane's view per output column.
extern "C" __global__ void warp_ops(int* out, const int* x) {
    const int lane = threadIdx.x % 32, v = x[threadIdx.x];
    int* o = out + threadIdx.x * 8;
    o[0] = __shfl_sync(0xffffffffu, v, 5);
    o[1] = __shfl_up_sync(0xffffffffu, v, 3);
    o[2] = __shfl_down_sync(0xffffffffu, v, 3);
    o[3] = __shfl_xor_sync(0xffffffffu, v, 6);
    o[4] = __shfl_down_sync(0xffffffffu, v, 1, 8);   // within segments of 8 lanes
    o[5] = (int)__ballot_sync(0xffffffffu, v % 3 == 0);
    o[6] = __all_sync(0xffffffffu, v >= 0) + 2 * __any_sync(0xffffffffu, v > 90);
    o[7] = __syncthreads_count(lane % 4 == 0);
}

// cp.async lands at the wait, not before: `before` sees the old shared value, `after` the copy.
extern "C" __global__ void async_copy_timing(float* before, float* after, const float* x) {
    __shared__ __align__(16) float s[128];
    const int t = threadIdx.x;
    for (int j = 0; j < 4; ++j) s[4 * t + j] = -1.f;
    cp_async_16(&s[4 * t], &x[4 * t]);
    cp_async_commit();
    before[t] = s[4 * t];
    cp_async_wait<0>();
    after[t] = s[4 * t + 3];
}

// Round trips through __half and __nv_bfloat16.
extern "C" __global__ void half_round_trip(float* h, float* b, const float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        h[i] = __half2float(__float2half(x[i]));
        b[i] = __bfloat162float(__float2bfloat16(x[i]));
    }
}

// float -> 8-bit float bits (as em_cvt converts: e4m3 saturating, e5m2 to infinity), and
// every byte widened back to float in both formats.
extern "C" __global__ void fp8_round_trip(unsigned char* e4, unsigned char* e5, float* w4,
                                          float* w5, const float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        e4[i] = em_cvt<__nv_fp8_e4m3>(x[i]).__x;
        e5[i] = em_cvt<__nv_fp8_e5m2>(x[i]).__x;
    }
    if (i < 256) {
        __nv_fp8_e4m3 a;
        __nv_fp8_e5m2 b;
        a.__x = b.__x = static_cast<unsigned char>(i);
        w4[i] = em_cvt<float>(a);
        w5[i] = em_cvt<float>(b);
    }
}

// Where each thread of a 3-D grid of 3-D blocks finds itself.
extern "C" __global__ void indices(int* out) {
    const int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const int thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int* o = out + 6 * (block * blockDim.x * blockDim.y * blockDim.z + thread);
    o[0] = threadIdx.x; o[1] = threadIdx.y; o[2] = threadIdx.z;
    o[3] = blockIdx.x; o[4] = blockIdx.y; o[5] = blockIdx.z;
}

// A forgotten barrier: each thread reads its neighbour's slot right after writing its own.
extern "C" __global__ void missing_barrier(float* out) {
    __shared__ float s[64];
    s[threadIdx.x] = threadIdx.x + 1.f;
    out[threadIdx.x] = s[(threadIdx.x + 1) % 64];
}

// Faults: a barrier only some threads reach, and a store far out of bounds.
extern "C" __global__ void divergent_barrier(float* out) {
    if (threadIdx.x < 16) {
        __syncthreads();
        out[threadIdx.x] = 1.f;
    } else {
        __syncwarp();
        while (out[0] == 0.f) __syncwarp();   // waits on a value the other half never writes
    }
}

extern "C" __global__ void out_of_bounds(float* out, int n) {
    out[threadIdx.x + n + 100000000] = 1.f;
}

extern "C" __global__ void spin_forever(volatile int* flag) {
    while (*flag == 0) {}
}

// Each thread keeps its own running values in registers across many barriers: a fiber switch
// that lost a callee-saved register (or a thread's floating-point state) would mix threads up.
extern "C" __global__ void private_values_across_barriers(float* out, int* steps, int rounds) {
    __shared__ int turn[128];
    float f = threadIdx.x * 0.5f;
    long long a = threadIdx.x, b = 3 * threadIdx.x + 1;
    for (int r = 0; r < rounds; ++r) {
        turn[threadIdx.x] = r;
        __syncthreads();
        a = a * 3 + turn[(threadIdx.x + 1) % blockDim.x];
        b ^= a;
        f = f * 0.75f + 1.0f;
        __syncthreads();
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = f;
    steps[blockIdx.x * blockDim.x + threadIdx.x] = int((a ^ b) & 0x7fffffff);
}

// Bytes as pairs of 16-bit floats (em_8x2_half2, em_8x2_bf162): each word's four bytes read
// signed as f16, unsigned as f16, signed as bf16, unsigned as bf16, two pairs each.
extern "C" __global__ void bytes_to_pairs(unsigned* out, const unsigned* words, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const unsigned w = words[i];
    const __half2 h[4] = {em_8x2_half2<true, 0>(w), em_8x2_half2<true, 1>(w),
                          em_8x2_half2<false, 0>(w), em_8x2_half2<false, 1>(w)};
    const __nv_bfloat162 b[4] = {em_8x2_bf162<true, 0>(w), em_8x2_bf162<true, 1>(w),
                                 em_8x2_bf162<false, 0>(w), em_8x2_bf162<false, 1>(w)};
    memcpy(out + 8 * i, h, 16);
    memcpy(out + 8 * i + 4, b, 16);
}

// Nibbles as pairs of 16-bit floats (em_4x2, int4 weights two to a byte): each byte of each word
// as (low, high) and (high, low) nibbles, unsigned and signed, as f16 and as bf16: 8 variants,
// 4 pairs (one a byte) each.
template <class T2, bool SIGNED, bool HI> __device__ void nibble_pairs(unsigned* out, unsigned w,
                                                                      unsigned bias) {
    const T2 p[4] = {em_4x2<T2, SIGNED, HI, 0>(w, bias), em_4x2<T2, SIGNED, HI, 1>(w, bias),
                     em_4x2<T2, SIGNED, HI, 2>(w, bias), em_4x2<T2, SIGNED, HI, 3>(w, bias)};
    memcpy(out, p, 16);
}
extern "C" __global__ void nibbles_to_pairs(unsigned* out, const unsigned* words, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const unsigned w = words[i];
    unsigned* o = out + 32 * i;
    nibble_pairs<__half2, false, false>(o, w, 0x64006400u);          // 1024
    nibble_pairs<__half2, false, true>(o + 4, w, 0x64006400u);
    nibble_pairs<__half2, true, false>(o + 8, w, 0x64086408u);        // 1032
    nibble_pairs<__half2, true, true>(o + 12, w, 0x64086408u);
    nibble_pairs<__nv_bfloat162, false, false>(o + 16, w, 0x43004300u);   // 128
    nibble_pairs<__nv_bfloat162, false, true>(o + 20, w, 0x43004300u);
    nibble_pairs<__nv_bfloat162, true, false>(o + 24, w, 0x43084308u);    // 136
    nibble_pairs<__nv_bfloat162, true, true>(o + 28, w, 0x43084308u);
}

// Recursion without end: the fiber's stack overflows into its guard page.
__device__ int deeper(volatile int* p, int n) {
    volatile int pad[256];
    pad[n & 255] = n;
    return deeper(p, n + 1) + pad[(n + 1) & 255];
}
extern "C" __global__ void stack_overflow(int* out) {
    out[threadIdx.x] = deeper(out, 0);
}
