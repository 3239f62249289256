// CUDA device functions for the CPU: fast-math intrinsics, min/max, bit tricks, atomics.
// Included by cuda_emulate.h. The plain math functions (expf, erff, tanhf, fmaxf, ...) come from
// <cmath> unchanged; the approximate intrinsics (__expf, ...) are computed exactly here, which is
// within the error bounds CUDA documents for them.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

// --- floating point --------------------------------------------------------------------------
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float rcbrtf(float x) { return 1.0f / std::cbrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __exp10f(float x) { return std::pow(10.0f, x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __log10f(float x) { return std::log10(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline void __sincosf(float x, float* s, float* c) { *s = std::sin(x); *c = std::cos(x); }
inline float __tanhf(float x) { return std::tanh(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __frsqrt_rn(float x) { return 1.0f / std::sqrt(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __saturatef(float x) { return x != x ? 0.0f : std::fmin(std::fmax(x, 0.0f), 1.0f); }
inline float exp10f(float x) { return std::pow(10.0f, x); }
inline float normcdff(float x) { return 0.5f * std::erfc(-x * 0.70710678118654752f); }

inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
inline int __float2int_rz(float x) { return static_cast<int>(x); }
inline int __float2int_rd(float x) { return static_cast<int>(std::floor(x)); }
inline int __float2int_ru(float x) { return static_cast<int>(std::ceil(x)); }
inline unsigned __float2uint_rn(float x) { return static_cast<unsigned>(std::nearbyint(x)); }
inline float __int2float_rn(int x) { return static_cast<float>(x); }
inline float __uint2float_rn(unsigned x) { return static_cast<float>(x); }

inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
inline unsigned __float_as_uint(float x) { unsigned i; std::memcpy(&i, &x, 4); return i; }
inline float __int_as_float(int i) { float x; std::memcpy(&x, &i, 4); return x; }
inline float __uint_as_float(unsigned i) { float x; std::memcpy(&x, &i, 4); return x; }
inline long long __double_as_longlong(double x) { long long i; std::memcpy(&i, &x, 8); return i; }
inline double __longlong_as_double(long long i) { double x; std::memcpy(&x, &i, 8); return x; }

// __byte_perm(x, y, s): byte n of the result is byte (s >> 4n) & 7 of the eight bytes y:x
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long b = (static_cast<unsigned long long>(y) << 32) | x;
    unsigned r = 0;
    for (int n = 0; n < 4; ++n)
        r |= static_cast<unsigned>((b >> (((s >> (4 * n)) & 7u) * 8)) & 0xffu) << (8 * n);
    return r;
}

// --- integer min/max (CUDA overloads these for each integer type) ----------------------------
#define EMMY_EMU_MINMAX(T)                                                                     \
    inline T min(T a, T b) { return a < b ? a : b; }                                           \
    inline T max(T a, T b) { return a > b ? a : b; }
EMMY_EMU_MINMAX(int)
EMMY_EMU_MINMAX(unsigned)
EMMY_EMU_MINMAX(long)
EMMY_EMU_MINMAX(unsigned long)
EMMY_EMU_MINMAX(long long)
EMMY_EMU_MINMAX(unsigned long long)
#undef EMMY_EMU_MINMAX
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
inline unsigned min(int a, unsigned b) { return min(static_cast<unsigned>(a), b); }
inline unsigned min(unsigned a, int b) { return min(a, static_cast<unsigned>(b)); }
inline unsigned max(int a, unsigned b) { return max(static_cast<unsigned>(a), b); }
inline unsigned max(unsigned a, int b) { return max(a, static_cast<unsigned>(b)); }
inline double min(float a, double b) { return std::fmin(a, b); }
inline double min(double a, float b) { return std::fmin(a, b); }
inline double max(float a, double b) { return std::fmax(a, b); }
inline double max(double a, float b) { return std::fmax(a, b); }

// --- bits --------------------------------------------------------------------------------------
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline int __mulhi(int a, int b) { return static_cast<int>((static_cast<long long>(a) * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) {
    return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}
inline int __mul24(int a, int b) { return a * b; }
inline unsigned __umul24(unsigned a, unsigned b) { return a * b; }

// --- loads with cache hints are plain loads on the CPU -----------------------------------------
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
template <class T> inline T __ldcs(const T* p) { return *p; }
template <class T> inline T __ldca(const T* p) { return *p; }
template <class T> inline void __stcg(T* p, T v) { *p = v; }
template <class T> inline void __stcs(T* p, T v) { *p = v; }
template <class T> inline void __stwt(T* p, T v) { *p = v; }

// --- atomics: blocks run on several OS threads, so these are real (GCC __atomic builtins) ------
namespace emmy_emu {
template <int Bytes> struct BitsOf;
template <> struct BitsOf<2> { using type = uint16_t; };
template <> struct BitsOf<4> { using type = uint32_t; };
template <> struct BitsOf<8> { using type = uint64_t; };

// Read-modify-write of any 2/4/8-byte type by compare-and-swap on its bits; returns the old value.
template <class T, class F> inline T atomic_update(T* p, F f) {
    using Bits = typename BitsOf<sizeof(T)>::type;
    Bits* bits = reinterpret_cast<Bits*>(p);
    Bits old_bits = __atomic_load_n(bits, __ATOMIC_SEQ_CST), new_bits;
    T old_value;
    do {
        std::memcpy(&old_value, &old_bits, sizeof(T));
        const T new_value = f(old_value);
        std::memcpy(&new_bits, &new_value, sizeof(T));
    } while (!__atomic_compare_exchange_n(bits, &old_bits, new_bits, true, __ATOMIC_SEQ_CST,
                                          __ATOMIC_SEQ_CST));
    return old_value;
}
}  // namespace emmy_emu

#define EMMY_EMU_ATOMIC_INT(T)                                                                 \
    inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }       \
    inline T atomicSub(T* p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }       \
    inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }     \
    inline T atomicAnd(T* p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }       \
    inline T atomicOr(T* p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }         \
    inline T atomicXor(T* p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); }       \
    inline T atomicCAS(T* p, T expected, T desired) {                                          \
        __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST,            \
                                    __ATOMIC_SEQ_CST);                                         \
        return expected;                                                                       \
    }                                                                                          \
    inline T atomicMax(T* p, T v) {                                                            \
        return emmy_emu::atomic_update(p, [v](T old) { return old > v ? old : v; });           \
    }                                                                                          \
    inline T atomicMin(T* p, T v) {                                                            \
        return emmy_emu::atomic_update(p, [v](T old) { return old < v ? old : v; });           \
    }
EMMY_EMU_ATOMIC_INT(int)
EMMY_EMU_ATOMIC_INT(unsigned)
EMMY_EMU_ATOMIC_INT(long long)
EMMY_EMU_ATOMIC_INT(unsigned long long)
#undef EMMY_EMU_ATOMIC_INT

inline float atomicAdd(float* p, float v) {
    return emmy_emu::atomic_update(p, [v](float old) { return old + v; });
}
inline double atomicAdd(double* p, double v) {
    return emmy_emu::atomic_update(p, [v](double old) { return old + v; });
}
inline float atomicExch(float* p, float v) {
    return emmy_emu::atomic_update(p, [v](float) { return v; });
}
inline unsigned atomicInc(unsigned* p, unsigned limit) {
    return emmy_emu::atomic_update(p, [limit](unsigned old) { return old >= limit ? 0 : old + 1; });
}
inline __half atomicAdd(__half* p, __half v) {
    return emmy_emu::atomic_update(p, [v](__half old) { return __half(float(old) + float(v)); });
}
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* p, __nv_bfloat16 v) {
    return emmy_emu::atomic_update(p, [v](__nv_bfloat16 old) {
        return __nv_bfloat16(float(old) + float(v));
    });
}

inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
