// CUDA's built-in types for the CPU: vector types, dim3, and software __half / __nv_bfloat16.
// Included by cuda_emulate.h; not meant to be included on its own.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

// ---------------------------------------------------------------------------------------------
// Vector types, with the alignment CUDA gives them (vector_types.h), so that a float4 load of a
// misaligned address is as wrong here as there.
// ---------------------------------------------------------------------------------------------
struct __attribute__((aligned(8))) int2 { int x, y; };
struct int3 { int x, y, z; };
struct __attribute__((aligned(16))) int4 { int x, y, z, w; };
struct __attribute__((aligned(8))) uint2 { unsigned x, y; };
struct uint3 { unsigned x, y, z; };
struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };
struct __attribute__((aligned(8))) float2 { float x, y; };
struct float3 { float x, y, z; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(16))) double2 { double x, y; };
struct __attribute__((aligned(4))) char4 { signed char x, y, z, w; };
struct __attribute__((aligned(4))) uchar4 { unsigned char x, y, z, w; };

inline int2 make_int2(int x, int y) { return {x, y}; }
inline int3 make_int3(int x, int y, int z) { return {x, y, z}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return {x, y, z}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float3 make_float3(float x, float y, float z) { return {x, y, z}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline double2 make_double2(double x, double y) { return {x, y}; }

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return {x, y, z}; }
};

// ---------------------------------------------------------------------------------------------
// Bit conversions between f32 and the 16-bit float formats, round to nearest even (what
// __float2half / __float2bfloat16 do). NaN becomes the canonical NaN CUDA produces.
// ---------------------------------------------------------------------------------------------
namespace emmy_emu {

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float f32_from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline uint16_t f32_to_f16_bits(float f) {
    const uint32_t x = f32_bits(f);
    const uint16_t sign = (x >> 16) & 0x8000;
    const uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fff;                   // NaN
    if (a >= 0x477ff000u) return sign | 0x7c00;           // >= 65520 rounds to infinity
    if (a < 0x38800000u) {                                // below 2^-14: subnormal or zero
        // a * 2^24 is exact in f32; nearbyint rounds half to even in the default mode.
        return sign | static_cast<uint16_t>(std::nearbyint(f32_from_bits(a) * 16777216.0f));
    }
    const uint32_t r = a - 0x38000000u;                   // rebias the exponent: 127 -> 15
    return sign | static_cast<uint16_t>((r + 0x0fffu + ((r >> 13) & 1u)) >> 13);
}

inline float f16_bits_to_f32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) {                                         // zero or subnormal: m * 2^-24
        const float v = static_cast<float>(m) * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (e == 31) return f32_from_bits(sign | 0x7f800000u | (m << 13));
    return f32_from_bits(sign | ((e + 112) << 23) | (m << 13));
}

inline uint16_t f32_to_bf16_bits(float f) {
    const uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fff;   // NaN
    return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float bf16_bits_to_f32(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }

}  // namespace emmy_emu

// ---------------------------------------------------------------------------------------------
// __half and __nv_bfloat16: storage is the 16-bit pattern; arithmetic goes through f32 and
// rounds back once, which is exact IEEE half/bf16 arithmetic for + - * / (f32 carries more
// than twice the bits). Conversions to and from float are implicit, as in cuda_fp16.h.
// ---------------------------------------------------------------------------------------------
struct __half_raw { unsigned short x; };
struct __nv_bfloat16_raw { unsigned short x; };

#define EMMY_EMU_HALF_TYPE(T, RAW, TO_BITS, FROM_BITS)                                         \
    struct __attribute__((aligned(2))) T {                                                     \
        unsigned short __x;                                                                    \
        T() = default;                                                                         \
        constexpr T(RAW r) : __x(r.x) {}                                                       \
        T(float f) : __x(emmy_emu::TO_BITS(f)) {}                                              \
        T(double d) : T(static_cast<float>(d)) {}                                              \
        T(int i) : T(static_cast<float>(i)) {}                                                 \
        T(unsigned i) : T(static_cast<float>(i)) {}                                            \
        T(long long i) : T(static_cast<float>(i)) {}                                           \
        operator float() const { return emmy_emu::FROM_BITS(__x); }                            \
        operator RAW() const { return RAW{__x}; }                                              \
        T& operator+=(T o) { return *this = T(float(*this) + float(o)); }                      \
        T& operator-=(T o) { return *this = T(float(*this) - float(o)); }                      \
        T& operator*=(T o) { return *this = T(float(*this) * float(o)); }                      \
        T& operator/=(T o) { return *this = T(float(*this) / float(o)); }                      \
    };                                                                                         \
    inline T operator+(T a, T b) { return T(float(a) + float(b)); }                            \
    inline T operator-(T a, T b) { return T(float(a) - float(b)); }                            \
    inline T operator*(T a, T b) { return T(float(a) * float(b)); }                            \
    inline T operator/(T a, T b) { return T(float(a) / float(b)); }                            \
    inline T operator-(T a) { return T(RAW{static_cast<unsigned short>(a.__x ^ 0x8000)}); }   \
    inline bool operator==(T a, T b) { return float(a) == float(b); }                          \
    inline bool operator!=(T a, T b) { return float(a) != float(b); }                          \
    inline bool operator<(T a, T b) { return float(a) < float(b); }                            \
    inline bool operator<=(T a, T b) { return float(a) <= float(b); }                          \
    inline bool operator>(T a, T b) { return float(a) > float(b); }                            \
    inline bool operator>=(T a, T b) { return float(a) >= float(b); }

EMMY_EMU_HALF_TYPE(__half, __half_raw, f32_to_f16_bits, f16_bits_to_f32)
EMMY_EMU_HALF_TYPE(__nv_bfloat16, __nv_bfloat16_raw, f32_to_bf16_bits, bf16_bits_to_f32)
#undef EMMY_EMU_HALF_TYPE

struct __attribute__((aligned(4))) __half2 { __half x, y; };
struct __attribute__((aligned(4))) __nv_bfloat162 { __nv_bfloat16 x, y; };
using half = __half;
using half2 = __half2;
using nv_bfloat16 = __nv_bfloat16;
using nv_bfloat162 = __nv_bfloat162;

// Conversions (cuda_fp16.h / cuda_bf16.h names).
inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __half2float(__half h) { return float(h); }
inline __half2 __floats2half2_rn(float a, float b) { return {__half(a), __half(b)}; }
inline __half2 __float22half2_rn(float2 v) { return {__half(v.x), __half(v.y)}; }
inline __half2 __float2half2_rn(float a) { return {__half(a), __half(a)}; }
inline float2 __half22float2(__half2 v) { return {float(v.x), float(v.y)}; }
inline __half2 __halves2half2(__half a, __half b) { return {a, b}; }
inline __half __low2half(__half2 v) { return v.x; }
inline __half __high2half(__half2 v) { return v.y; }
inline float __low2float(__half2 v) { return float(v.x); }
inline float __high2float(__half2 v) { return float(v.y); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short u) { return __half(__half_raw{u}); }

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return float(b); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {a, b}; }
inline __nv_bfloat162 __float22bfloat162_rn(float2 v) { return {v.x, v.y}; }
inline __nv_bfloat162 __float2bfloat162_rn(float a) { return {a, a}; }
inline float2 __bfloat1622float2(__nv_bfloat162 v) { return {float(v.x), float(v.y)}; }
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return {a, b}; }
inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 v) { return v.x; }
inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 v) { return v.y; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
    return __nv_bfloat16(__nv_bfloat16_raw{u});
}

// 8-bit floats (cuda_fp8.h): storage types only, converted through float with
// __nv_cvt_float_to_fp8 (round to nearest even; __NV_SATFINITE clamps overflow and infinity to
// the largest finite value, __NV_NOSAT gives e5m2 infinity and e4m3 NaN) and widened with
// __nv_cvt_fp8_to_halfraw (exact).
typedef unsigned char __nv_fp8_storage_t;
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
struct __nv_fp8_e4m3 { __nv_fp8_storage_t __x; };
struct __nv_fp8_e5m2 { __nv_fp8_storage_t __x; };

namespace emmy_emu {

struct Fp8Format { int mantissa, bias; float largest; };

inline Fp8Format fp8_format(__nv_fp8_interpretation_t t) {
    return t == __NV_E4M3 ? Fp8Format{3, 7, 448.0f} : Fp8Format{2, 15, 57344.0f};
}

}  // namespace emmy_emu

inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t sat,
                                                __nv_fp8_interpretation_t t) {
    const emmy_emu::Fp8Format f = emmy_emu::fp8_format(t);
    const uint8_t sign = std::signbit(x) ? 0x80 : 0;
    const uint8_t nan = t == __NV_E4M3 ? 0x7f : 0x7e, top = t == __NV_E4M3 ? 0x7e : 0x7b;
    if (std::isnan(x)) return sign | nan;
    const double a = std::fabs(static_cast<double>(x));
    // the value rounded at its binade's spacing (the subnormals' below the least normal)
    const int e = a == 0 || std::isinf(a) ? 1 - f.bias : std::max(std::ilogb(a), 1 - f.bias);
    const double quantum = std::ldexp(1.0, e - f.mantissa);
    const double r = std::isinf(a) ? a : std::nearbyint(a / quantum) * quantum;
    if (r > f.largest) {
        if (sat == __NV_SATFINITE) return sign | top;
        return sign | (t == __NV_E4M3 ? nan : 0x7c);
    }
    if (r < std::ldexp(1.0, 1 - f.bias))                  // subnormal (or zero)
        return sign | static_cast<uint8_t>(r / std::ldexp(1.0, 1 - f.bias - f.mantissa));
    const int re = std::ilogb(r);
    const int m = static_cast<int>(std::ldexp(r, f.mantissa - re)) - (1 << f.mantissa);
    return sign | static_cast<uint8_t>(((re + f.bias) << f.mantissa) | m);
}

inline __half_raw __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t x, __nv_fp8_interpretation_t t) {
    const emmy_emu::Fp8Format f = emmy_emu::fp8_format(t);
    const int e = (x & 0x7f) >> f.mantissa, m = x & ((1 << f.mantissa) - 1);
    float v;
    if (t == __NV_E4M3 && (x & 0x7f) == 0x7f) v = NAN;
    else if (t == __NV_E5M2 && e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = std::ldexp(static_cast<float>(m), 1 - f.bias - f.mantissa);
    else v = std::ldexp(static_cast<float>((1 << f.mantissa) | m), e - f.bias - f.mantissa);
    return __half_raw{__half(x & 0x80 ? -v : v).__x};
}

// Half arithmetic intrinsics, for both 16-bit formats (fma rounds once, from the exact product).
#define EMMY_EMU_HALF_MATH(T, T2)                                                              \
    inline T __hadd(T a, T b) { return a + b; }                                                \
    inline T __hsub(T a, T b) { return a - b; }                                                \
    inline T __hmul(T a, T b) { return a * b; }                                                \
    inline T __hdiv(T a, T b) { return a / b; }                                                \
    inline T __hneg(T a) { return -a; }                                                        \
    inline T __hfma(T a, T b, T c) { return T(std::fma(float(a), float(b), float(c))); }       \
    inline T __hmax(T a, T b) { return T(std::fmax(float(a), float(b))); }                     \
    inline T __hmin(T a, T b) { return T(std::fmin(float(a), float(b))); }                     \
    inline T __habs(T a) { return T(std::fabs(float(a))); }                                    \
    inline T2 __hadd2(T2 a, T2 b) { return {a.x + b.x, a.y + b.y}; }                           \
    inline T2 __hsub2(T2 a, T2 b) { return {a.x - b.x, a.y - b.y}; }                           \
    inline T2 __hmul2(T2 a, T2 b) { return {a.x * b.x, a.y * b.y}; }                           \
    inline T2 __hneg2(T2 a) { return {-a.x, -a.y}; }                                           \
    inline T2 __hfma2(T2 a, T2 b, T2 c) { return {__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)}; }

EMMY_EMU_HALF_MATH(__half, __half2)
EMMY_EMU_HALF_MATH(__nv_bfloat16, __nv_bfloat162)
#undef EMMY_EMU_HALF_MATH
