// emmy_intrinsics.cuh: the one helper header emitted CUDA includes.
//
// Each hardware intrinsic the emitter uses has a device version (inline PTX, under NVRTC/nvcc)
// and a CPU version (under cuda_emulate.h, EMMY_EMULATE) that computes the same values with
// the register layouts the PTX ISA documents, so the emulator checks the emitter's indexing.
//
//   cp.async    cp_async_4 / _8 / _16, cp_async_16_zfill, cp_async_commit,
//               cp_async_wait<N>, cp_async_wait_all
//   ldmatrix    ldmatrix_x1 / _x2 / _x4 and their _trans forms (m8n8, b16)
//   mma.sync    mma_m16n8k16_f16f32, mma_m16n8k16_bf16f32  (row.col, f32 accumulate),
//               mma_m16n8k8_tf32 with to_tf32 (cvt.rna.tf32.f32)
//   packing     pack_f16x2, pack_bf16x2
//   stores      st_global_words<W> (one 4-, 8- or 16-byte st.global)
//   warps       warp_sum, warp_max, warp_min (butterfly; every lane gets the result)
//   ex2         ex2_approx (ex2.approx.ftz.f32)
//   constants   EMMY_INF_F32
#pragma once

// Emitted source includes this header and nothing else; it brings the 16- and 8-bit float
// types and the fixed-width integers (uint32_t, int64_t, ...) on both sides.
#if defined(__CUDACC__)
#include <cuda/std/cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#elif !defined(EMMY_EMULATE)
#error "emmy_intrinsics.cuh: compile with NVRTC/nvcc, or include cuda_emulate.h first"
#endif

#define EMMY_FN __device__ __forceinline__

// Float infinity both compilers accept (NVRTC has no INFINITY macro).
#define EMMY_INF_F32 __int_as_float(0x7f800000)

// 8-bit floats as torch converts to them: round to nearest even; e4m3 (no infinity) saturates
// at +-448, infinity included, e5m2 overflows to infinity. Widening is exact. A source emitted
// for a torch from before e4m3 saturated specializes EmE4m3Nan<0> after its includes (a macro
// would come after the emulator's precompiled headers): NaN where the rounding goes past 448,
// from 464 up, and for infinities.
template <int> struct EmE4m3Nan { static constexpr bool value = false; };
template <int D = 0> EMMY_FN __nv_fp8_e4m3 emmy_to_e4m3(float f) {
    __nv_fp8_e4m3 r;
    if constexpr (EmE4m3Nan<D>::value) {
        if (fabsf(f) > 464.0f) {
            r.__x = static_cast<__nv_fp8_storage_t>(f < 0.0f ? 0xff : 0x7f);
            return r;
        }
    }
    r.__x = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
    return r;
}
EMMY_FN __nv_fp8_e5m2 emmy_to_e5m2(float f) {
    __nv_fp8_e5m2 r;
    r.__x = __nv_cvt_float_to_fp8(f, __NV_NOSAT, __NV_E5M2);
    return r;
}
EMMY_FN float emmy_from_fp8(__nv_fp8_e4m3 v) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(v.__x, __NV_E4M3)));
}
EMMY_FN float emmy_from_fp8(__nv_fp8_e5m2 v) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(v.__x, __NV_E5M2)));
}

#if defined(__CUDACC__)
EMMY_FN unsigned emmy_smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
#endif

// ---------------------------------------------------------------------------------------------
// cp.async: global -> shared copies that complete at a later cp.async.wait_group.
// CPU: the source is read at issue and the destination written at the covering wait.
// ---------------------------------------------------------------------------------------------
#if defined(__CUDACC__)
EMMY_FN void cp_async_16(void* smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n"
                 :: "r"(emmy_smem_addr(smem)), "l"(gmem) : "memory");
}
// Copies the first `src_bytes` (0..16) bytes and zero-fills the rest; reads nothing when 0.
EMMY_FN void cp_async_16_zfill(void* smem, const void* gmem, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(emmy_smem_addr(smem)), "l"(gmem), "r"(src_bytes) : "memory");
}
EMMY_FN void cp_async_8(void* smem, const void* gmem) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n"
                 :: "r"(emmy_smem_addr(smem)), "l"(gmem) : "memory");
}
EMMY_FN void cp_async_4(void* smem, const void* gmem) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n"
                 :: "r"(emmy_smem_addr(smem)), "l"(gmem) : "memory");
}
EMMY_FN void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> EMMY_FN void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}
EMMY_FN void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
#else
inline void cp_async_16(void* smem, const void* gmem) { emmy_emu::async_copy(smem, gmem, 16, 16); }
inline void cp_async_16_zfill(void* smem, const void* gmem, int src_bytes) {
    emmy_emu::async_copy(smem, gmem, 16, static_cast<unsigned>(src_bytes));
}
inline void cp_async_8(void* smem, const void* gmem) { emmy_emu::async_copy(smem, gmem, 8, 8); }
inline void cp_async_4(void* smem, const void* gmem) { emmy_emu::async_copy(smem, gmem, 4, 4); }
inline void cp_async_commit() { emmy_emu::async_commit(); }
template <int N> inline void cp_async_wait() { emmy_emu::async_wait(N); }
inline void cp_async_wait_all() { emmy_emu::async_wait(-1); }
#endif

// ---------------------------------------------------------------------------------------------
// st.global{,.v2,.v4}.b32: W 32-bit words stored as one access at p (4W-byte aligned). NVVM
// may split a plain store of an 8- or 16-byte struct into words when it computes the address
// in 64 bits; this keeps it one instruction. There is no "memory" clobber, so that loads of
// other addresses may still move across it (an epilogue's next bias or residual loads): use
// it only for stores that the kernel does not read back. CPU: the alignment is checked.
// ---------------------------------------------------------------------------------------------
template <int W> EMMY_FN void st_global_words(void* p, const uint32_t (&w)[W]) {
    static_assert(W == 1 || W == 2 || W == 4, "st_global_words stores 1, 2 or 4 words");
#if defined(__CUDACC__)
    if constexpr (W == 1)
        asm volatile("st.global.b32 [%0], %1;\n" :: "l"(p), "r"(w[0]));
    if constexpr (W == 2)
        asm volatile("st.global.v2.b32 [%0], {%1, %2};\n" :: "l"(p), "r"(w[0]), "r"(w[1]));
    if constexpr (W == 4)
        asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n"
                     :: "l"(p), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]));
#else
    if (reinterpret_cast<uintptr_t>(p) % (4 * W))
        emmy_emu::fail("st.global of %d bytes at %p: the address is not %d-byte aligned",
                       4 * W, p, 4 * W);
    std::memcpy(p, w, 4 * W);
#endif
}

// ---------------------------------------------------------------------------------------------
// ldmatrix.sync.aligned.m8n8.xN[.trans].shared.b16: N 8x8 matrices of 16-bit elements.
// Lane 8*j + r passes the shared address of row r of matrix j (lanes 0..8N-1 are read).
// Register j of lane l holds matrix j's elements (row l/4, cols 2*(l%4), 2*(l%4)+1), lower
// column in the low half; with .trans, (rows 2*(l%4), 2*(l%4)+1, col l/4) instead.
// ---------------------------------------------------------------------------------------------
template <int N, bool Trans> EMMY_FN void emmy_ldmatrix(unsigned (&r)[N], const void* row) {
    static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
#if defined(__CUDACC__)
    const unsigned a = emmy_smem_addr(row);
    if constexpr (N == 1 && !Trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
                     : "=r"(r[0]) : "r"(a) : "memory");
    if constexpr (N == 1 && Trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                     : "=r"(r[0]) : "r"(a) : "memory");
    if constexpr (N == 2 && !Trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                     : "=r"(r[0]), "=r"(r[1]) : "r"(a) : "memory");
    if constexpr (N == 2 && Trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                     : "=r"(r[0]), "=r"(r[1]) : "r"(a) : "memory");
    if constexpr (N == 4 && !Trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
    if constexpr (N == 4 && Trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
#else
    const void* const* rows = emmy_emu::warp_exchange(0xffffffffu, row);
    const unsigned l = emmy_emu::lane();
    for (int j = 0; j < N; ++j) {
        const unsigned short* lo;
        const unsigned short* hi;
        if (!Trans) {
            lo = static_cast<const unsigned short*>(rows[8 * j + l / 4]) + 2 * (l % 4);
            hi = lo + 1;
        } else {
            lo = static_cast<const unsigned short*>(rows[8 * j + 2 * (l % 4)]) + l / 4;
            hi = static_cast<const unsigned short*>(rows[8 * j + 2 * (l % 4) + 1]) + l / 4;
        }
        r[j] = unsigned(*lo) | (unsigned(*hi) << 16);
    }
#endif
}
#define EMMY_LDMATRIX(NAME, N, TRANS) \
    EMMY_FN void NAME(unsigned (&r)[N], const void* row) { emmy_ldmatrix<N, TRANS>(r, row); }
EMMY_LDMATRIX(ldmatrix_x1, 1, false)
EMMY_LDMATRIX(ldmatrix_x2, 2, false)
EMMY_LDMATRIX(ldmatrix_x4, 4, false)
EMMY_LDMATRIX(ldmatrix_x1_trans, 1, true)
EMMY_LDMATRIX(ldmatrix_x2_trans, 2, true)
EMMY_LDMATRIX(ldmatrix_x4_trans, 4, true)
#undef EMMY_LDMATRIX

// ---------------------------------------------------------------------------------------------
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32: D(16x8) = A(16x16) B(16x8) + C.
// With g = lane/4, t = lane%4 (PTX ISA, "Matrix Fragments for mma.m16n8k16"):
//   A: 4 regs, 8 elements a0..a7: row g + 8*(i/2 % 2), col 2t + i%2 + 8*(i/4)
//   B: 2 regs, 4 elements b0..b3: row (k) 2t + i%2 + 8*(i/2), col (n) g
//   C, D: 4 floats c0..c3: row g + 8*(i/2), col 2t + i%2
// Element 2m is the low half of register m. CPU: products summed in double, rounded once.
// ---------------------------------------------------------------------------------------------
#if !defined(__CUDACC__)
namespace emmy_emu {
struct MmaOperands { unsigned a[4]; unsigned b[2]; };

template <float (*ToFloat)(uint16_t)>
inline void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                         const float (&c)[4]) {
    MmaOperands mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}};
    const MmaOperands* all = warp_exchange(0xffffffffu, mine);
    auto half = [](unsigned reg, unsigned k) { return uint16_t(reg >> (16 * (k & 1))); };
    auto a_at = [&](unsigned row, unsigned k) {   // lane 4*(row%8) + (k%8)/2 holds A[row][k]
        return ToFloat(half(all[4 * (row & 7) + ((k & 7) >> 1)].a[(row >> 3) + 2 * (k >> 3)], k));
    };
    auto b_at = [&](unsigned k, unsigned n) {     // lane 4*n + (k%8)/2 holds B[k][n]
        return ToFloat(half(all[4 * n + ((k & 7) >> 1)].b[k >> 3], k));
    };
    const unsigned g = lane() / 4, t = lane() % 4;
    float out[4];
    for (unsigned i = 0; i < 4; ++i) {
        const unsigned row = g + 8 * (i / 2), col = 2 * t + i % 2;
        double acc = c[i];
        for (unsigned k = 0; k < 16; ++k) acc += double(a_at(row, k)) * double(b_at(k, col));
        out[i] = float(acc);
    }
    for (unsigned i = 0; i < 4; ++i) d[i] = out[i];
}
}  // namespace emmy_emu
#endif

EMMY_FN void mma_m16n8k16_f16f32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                 const float (&c)[4]) {
#if defined(__CUDACC__)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
    emmy_emu::mma_m16n8k16<emmy_emu::f16_bits_to_f32>(d, a, b, c);
#endif
}

EMMY_FN void mma_m16n8k16_bf16f32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                  const float (&c)[4]) {
#if defined(__CUDACC__)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
    emmy_emu::mma_m16n8k16<emmy_emu::bf16_bits_to_f32>(d, a, b, c);
#endif
}

// Two floats rounded to 16 bits and packed into one register, `lo` in the low half.
EMMY_FN unsigned pack_f16x2(float lo, float hi) {
    return unsigned(__half_as_ushort(__float2half_rn(lo))) |
           (unsigned(__half_as_ushort(__float2half_rn(hi))) << 16);
}
EMMY_FN unsigned pack_bf16x2(float lo, float hi) {
    return unsigned(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
           (unsigned(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

// ---------------------------------------------------------------------------------------------
// Warp reductions over `width` lanes (a power of two <= 32); all lanes of the segment get the
// result. max/min on floats use fmaxf/fminf (a NaN operand is ignored).
// ---------------------------------------------------------------------------------------------
template <class T> EMMY_FN T warp_sum(T v, int width = 32) {
    for (int o = width / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o, width);
    return v;
}
template <class T> EMMY_FN T warp_max(T v, int width = 32) {
    for (int o = width / 2; o > 0; o /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, o, width));
    return v;
}
template <class T> EMMY_FN T warp_min(T v, int width = 32) {
    for (int o = width / 2; o > 0; o /= 2) v = min(v, __shfl_xor_sync(0xffffffffu, v, o, width));
    return v;
}

// ---------------------------------------------------------------------------------------------
// ex2_approx(x): 2^x by ex2.approx.ftz.f32 (one MUFU.EX2; 2 ulp, as exp2f), subnormal inputs
// and results flushed to zero. exp2f adds a range check and two predicated multiplications
// around the same instruction to return subnormal results; softmax's probabilities that small
// (below 2^-126, against a row sum of at least 1) change nothing. CPU: exp2f, result flushed.
// ---------------------------------------------------------------------------------------------
EMMY_FN float ex2_approx(float x) {
#if defined(__CUDACC__)
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#else
    const float r = exp2f(x);
    return r < 1.17549435e-38f ? 0.0f : r;
#endif
}

// ---------------------------------------------------------------------------------------------
// TF32: f32 operands on the tensor cores (sm_80+).
// to_tf32(x): x rounded to 10 mantissa bits, to nearest with ties away from zero
// (cvt.rna.tf32.f32), as the .b32 register mma takes; the CPU version zeroes the low 13 bits.
// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32: D(16x8) = A(16x8) B(8x8) + C.
// With g = lane/4, t = lane%4 (PTX ISA, "Matrix Fragments for mma.m16n8k8", .tf32):
//   A: 4 regs a0..a3: row g + 8*(i%2), col t + 4*(i/2)
//   B: 2 regs b0, b1: row (k) t + 4*i, col (n) g
//   C, D: 4 floats c0..c3: row g + 8*(i/2), col 2t + i%2 (as m16n8k16)
// CPU: the operands' low 13 bits are ignored; products summed in double, rounded once.
// ---------------------------------------------------------------------------------------------
EMMY_FN unsigned to_tf32(float x) {
#if defined(__CUDACC__)
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
#else
    const unsigned u = __float_as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u)                  // inf stays inf, NaN stays NaN
        return (u & 0x007fffffu) ? 0x7fffffffu : u;
    // half an ulp of tf32 added to the magnitude: ties round away from zero; a carry into
    // the exponent is the correct rounding (up to inf past the largest finite value)
    return (u + 0x1000u) & 0xffffe000u;
#endif
}

#if !defined(__CUDACC__)
namespace emmy_emu {
inline float tf32_bits_to_f32(unsigned reg) { return __uint_as_float(reg & 0xffffe000u); }
}  // namespace emmy_emu
#endif

EMMY_FN void mma_m16n8k8_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                              const float (&c)[4]) {
#if defined(__CUDACC__)
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
          "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
    emmy_emu::MmaOperands mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}};
    const emmy_emu::MmaOperands* all = emmy_emu::warp_exchange(0xffffffffu, mine);
    auto a_at = [&](unsigned row, unsigned k) {   // lane 4*(row%8) + k%4 holds A[row][k]
        return emmy_emu::tf32_bits_to_f32(all[4 * (row & 7) + (k & 3)].a[(row >> 3) + 2 * (k >> 2)]);
    };
    auto b_at = [&](unsigned k, unsigned n) {     // lane 4*n + k%4 holds B[k][n]
        return emmy_emu::tf32_bits_to_f32(all[4 * n + (k & 3)].b[k >> 2]);
    };
    const unsigned g = emmy_emu::lane() / 4, t = emmy_emu::lane() % 4;
    float out[4];
    for (unsigned i = 0; i < 4; ++i) {
        const unsigned row = g + 8 * (i / 2), col = 2 * t + i % 2;
        double acc = c[i];
        for (unsigned k = 0; k < 8; ++k) acc += double(a_at(row, k)) * double(b_at(k, col));
        out[i] = float(acc);
    }
    for (unsigned i = 0; i < 4; ++i) d[i] = out[i];
#endif
}
