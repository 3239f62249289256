// emmy_kernel.cuh: the device functions emitted kernels call by name. Everything here is
// plain CUDA C++ over the intrinsics of emmy_intrinsics.cuh, so the same text builds with
// NVRTC for the GPU and with g++ against the CPU emulation header.
#pragma once
#include "emmy_intrinsics.cuh"

#define EM_FULL 0xffffffffu
#define EM_INF EMMY_INF_F32                  // NVRTC has no INFINITY / NAN macros
#define EM_NAN __int_as_float(0x7fc00000)

// --- types and conversions ---------------------------------------------------------------
template <class A, class B> struct em_same { static constexpr bool value = false; };
template <class A> struct em_same<A, A> { static constexpr bool value = true; };

template <class To, class From> EMMY_FN To em_cvt(From x) {
  if constexpr (em_same<From, To>::value) return x;
  else if constexpr (em_same<To, __nv_fp8_e4m3>::value) return emmy_to_e4m3(em_cvt<float>(x));
  else if constexpr (em_same<To, __nv_fp8_e5m2>::value) return emmy_to_e5m2(em_cvt<float>(x));
  else if constexpr (em_same<From, __nv_fp8_e4m3>::value || em_same<From, __nv_fp8_e5m2>::value)
    return em_cvt<To>(emmy_from_fp8(x));
  else if constexpr (em_same<From, __half>::value) return static_cast<To>(__half2float(x));
  else if constexpr (em_same<From, __nv_bfloat16>::value) return static_cast<To>(__bfloat162float(x));
  else if constexpr (em_same<To, __half>::value) return __float2half_rn(static_cast<float>(x));
  else if constexpr (em_same<To, __nv_bfloat16>::value) return __float2bfloat16_rn(static_cast<float>(x));
  else return static_cast<To>(x);
}

// An additive attention bias in the log2 domain the flash kernels work in: log2(e) * b, with b
// held above -FLT_MAX / log2(e) (-2.36e38) so that the product stays finite. The mask Hugging
// Face models add is finfo.min (-3.4e38): times log2(e) it would be -inf, and a query row masked
// everywhere NaN (inf - inf) where eager gives its scores' uniform average. -inf stays -inf.
EMMY_FN float em_log2e_bias(float b) {
  return 1.4426950408889634f * (b > -EM_INF && b < -2.3e38f ? -2.3e38f : b);
}

template <int V, class T> struct alignas(sizeof(T) * V) EmVec { T x[V]; };

// V consecutive elements (one vector access), converted to the compute type of each output.
template <class T, class... C> EMMY_FN void em_vload(const T* p, C&... out) {
  constexpr int V = sizeof...(C);
  const EmVec<V, T> v = *reinterpret_cast<const EmVec<V, T>*>(p);
  int i = 0;
  ((out = em_cvt<C>(v.x[i++])), ...);
}

template <class T, class... C> EMMY_FN void em_vstore(T* p, C... in) {
  constexpr int V = sizeof...(C);
  EmVec<V, T> v;
  int i = 0;
  ((v.x[i++] = em_cvt<T>(in)), ...);
  *reinterpret_cast<EmVec<V, T>*>(p) = v;
}

// The same as one explicit st.global of 4, 8 or 16 bytes (st_global_words), for the template
// epilogues: NVVM splits their 8-byte stores (addresses computed in 64 bits) into words.
// A vector of fewer than 4 bytes (a pair of bytes or bools) is one plain store.
template <class T, class... C> EMMY_FN void em_vstore_st(T* p, C... in) {
  constexpr int V = sizeof...(C);
  static_assert(sizeof(T) * V <= 2 || sizeof(T) * V == 4 || sizeof(T) * V == 8
                || sizeof(T) * V == 16, "em_vstore_st stores 1, 2, 4, 8 or 16 bytes");
  if constexpr (sizeof(T) * V < 4) {
    em_vstore(p, in...);
  } else {
    EmVec<V, T> v;
    int i = 0;
    ((v.x[i++] = em_cvt<T>(in)), ...);
    uint32_t words[sizeof(v) / 4];
    memcpy(words, &v, sizeof(v));
    st_global_words<sizeof(v) / 4>(p, words);
  }
}

// --- 8-bit integers as pairs of 16-bit floats (a computed operand's int8 weights) ----------
// Exact, with no conversion instruction (conversions issue at a fraction of the integer and
// half2 rates): a byte b under the f16 exponent of 1024 (one PRMT for two bytes) is the half
// 1024 + b, so one half2 subtraction of 1024 leaves b; a signed byte, its sign bit flipped
// first (b ^ 0x80 = b + 128), less 1152. A bf16 has too few mantissa bits for that: each byte
// goes under the f32 exponent of 2^23, the same subtraction in f32 is exact, and the upper
// halves of the two exact floats are their bf16s (one PRMT). HI picks the word's upper bytes.
template <class T2> EMMY_FN T2 em_pair_bits(uint32_t bits) {
  T2 v;
  memcpy(&v, &bits, 4);
  return v;
}
EMMY_FN __half2 em_pair(__half a, __half b) { return __halves2half2(a, b); }
EMMY_FN __nv_bfloat162 em_pair(__nv_bfloat16 a, __nv_bfloat16 b) { return __halves2bfloat162(a, b); }

template <bool SIGNED, int HI> EMMY_FN __half2 em_8x2_half2(uint32_t word) {
  const uint32_t w = SIGNED ? word ^ 0x80808080u : word;
  const __half2 h = em_pair_bits<__half2>(__byte_perm(w, 0x64646464u, HI ? 0x5342u : 0x5140u));
  return __hsub2(h, em_pair_bits<__half2>(SIGNED ? 0x64806480u : 0x64006400u));
}

template <bool SIGNED, int HI> EMMY_FN __nv_bfloat162 em_8x2_bf162(uint32_t word) {
  const uint32_t w = SIGNED ? word ^ 0x80808080u : word;
  const float bias = SIGNED ? 8388736.0f : 8388608.0f;   // 2^23 + 128, 2^23
  const float lo = __uint_as_float(__byte_perm(w, 0x4b000000u, HI ? 0x7442u : 0x7440u)) - bias;
  const float hi = __uint_as_float(__byte_perm(w, 0x4b000000u, HI ? 0x7443u : 0x7441u)) - bias;
  return em_pair_bits<__nv_bfloat162>(__byte_perm(__float_as_uint(lo), __float_as_uint(hi),
                                                  0x7632u));
}

// Byte BYTE of `word` holds two 4-bit integers (int4 weights two to a byte): the pair of them,
// the low nibble first (HI_FIRST: the high one), less the constant whose bits `bias` are less
// the magic number, exactly, with no conversion instruction. The word's low and high nibbles
// are split once (the same for its four bytes), one PRMT puts the byte's two under the two
// halves and one LOP3 the exponent of 1024 (f16) or 128 (bf16) over them, whose last mantissa
// bits then count ones; one HSUB2 takes away the magic number (plus 8 for a signed nibble,
// whose sign bit is flipped first, plus any constant the caller subtracts next).
EMMY_FN constexpr uint32_t em_magic2(const __half2*) { return 0x64006400u; }        // 1024
EMMY_FN constexpr uint32_t em_magic2(const __nv_bfloat162*) { return 0x43004300u; } // 128
template <class T2, bool SIGNED, bool HI_FIRST, int BYTE>
EMMY_FN T2 em_4x2(uint32_t word, uint32_t bias) {
  const uint32_t w = SIGNED ? word ^ 0x88888888u : word;
  const uint32_t lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;
  const uint32_t t = HI_FIRST ? __byte_perm(hi, lo, BYTE | (BYTE + 4) << 8)
                              : __byte_perm(lo, hi, BYTE | (BYTE + 4) << 8);
  const uint32_t v = (t & 0x00FF00FFu) | em_magic2(static_cast<const T2*>(nullptr));
  return __hsub2(em_pair_bits<T2>(v), em_pair_bits<T2>(bias));
}

// AWQ's interleaved order: the pair of nibbles SHIFT and SHIFT + 4 of `word` (bits 4 SHIFT and
// 16 + 4 SHIFT, neighbouring elements of its eight), one shift and one LOP3 under the magic
// number's exponent, one HSUB2, as em_4x2.
template <class T2, bool SIGNED, int SHIFT>
EMMY_FN T2 em_4x2_il(uint32_t word, uint32_t bias) {
  const uint32_t w = SIGNED ? word ^ 0x88888888u : word;
  const uint32_t v = ((w >> (4 * SHIFT)) & 0x000F000Fu) |
                     em_magic2(static_cast<const T2*>(nullptr));
  return __hsub2(em_pair_bits<T2>(v), em_pair_bits<T2>(bias));
}

template <int BYTES> EMMY_FN void em_cp_async(void* smem, const void* gmem) {
  if constexpr (BYTES == 16) cp_async_16(smem, gmem);
  else if constexpr (BYTES == 8) cp_async_8(smem, gmem);
  else cp_async_4(smem, gmem);
}

EMMY_FN void em_cp_async_wait_all() {
  cp_async_commit();
  cp_async_wait_all();
}

// --- element-wise math (float and double overloads; NaN propagates like torch) -------------
#define EM_UNARY(name, f32, f64)                              \
  EMMY_FN float name(float x) { return f32; }                 \
  EMMY_FN double name(double x) { return f64; }
EM_UNARY(em_exp, expf(x), exp(x))
EM_UNARY(em_log, logf(x), log(x))
EM_UNARY(em_log1p, log1pf(x), log1p(x))
EM_UNARY(em_expm1, expm1f(x), expm1(x))
EM_UNARY(em_sqrt, sqrtf(x), sqrt(x))
EM_UNARY(em_rsqrt, rsqrtf(x), 1.0 / sqrt(x))
EM_UNARY(em_sin, sinf(x), sin(x))
EM_UNARY(em_cos, cosf(x), cos(x))
EM_UNARY(em_tanh, tanhf(x), tanh(x))
EM_UNARY(em_erf, erff(x), erf(x))
EM_UNARY(em_floor, floorf(x), floor(x))
EM_UNARY(em_ceil, ceilf(x), ceil(x))
EM_UNARY(em_round, rintf(x), rint(x))   // halves to even
EM_UNARY(em_tan, tanf(x), tan(x))
EM_UNARY(em_asin, asinf(x), asin(x))
EM_UNARY(em_acos, acosf(x), acos(x))
EM_UNARY(em_atan, atanf(x), atan(x))
EM_UNARY(em_sinh, sinhf(x), sinh(x))
EM_UNARY(em_cosh, coshf(x), cosh(x))
EM_UNARY(em_asinh, asinhf(x), asinh(x))
EM_UNARY(em_acosh, acoshf(x), acosh(x))
EM_UNARY(em_atanh, atanhf(x), atanh(x))
#if defined(__CUDACC__)
EM_UNARY(em_lgamma, lgammaf(x), lgamma(x))
#else   // the C library's lgamma writes the global signgam: the re-entrant form, per thread
EM_UNARY(em_lgamma, ({ int s; lgammaf_r(x, &s); }), ({ int s; lgamma_r(x, &s); }))
#endif
EM_UNARY(em_sigmoid, 1.0f / (1.0f + expf(-x)), 1.0 / (1.0 + exp(-x)))
EM_UNARY(em_reciprocal, 1.0f / x, 1.0 / x)
#if defined(__CUDACC__)
EM_UNARY(em_erfinv, erfinvf(x), erfinv(x))
#else   // the C library has no erfinv: Giles' single-precision estimate, then Newton on erf
inline double em_erfinv_host(double x) {
  if (!(x >= -1.0 && x <= 1.0)) return __builtin_nan("");
  if (x == 1.0 || x == -1.0) return x * __builtin_inf();
  double w = -log((1.0 - x) * (1.0 + x)), p;
  if (w < 5.0) {
    w -= 2.5;
    p = 2.81022636e-08;
    p = 3.43273939e-07 + p * w; p = -3.5233877e-06 + p * w; p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w;  p = -0.00125372503 + p * w; p = -0.00417768164 + p * w;
    p = 0.246640727 + p * w;    p = 1.50140941 + p * w;
  } else {
    w = sqrt(w) - 3.0;
    p = -0.000200214257;
    p = 0.000100950558 + p * w; p = 0.00134934322 + p * w;  p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w;  p = -0.0076224613 + p * w;  p = 0.00943887047 + p * w;
    p = 1.00167406 + p * w;     p = 2.83297682 + p * w;
  }
  double y = p * x;
  for (int i = 0; i < 2; ++i) y -= (erf(y) - x) / (1.1283791670955126 * exp(-y * y));
  return y;
}
EM_UNARY(em_erfinv, float(em_erfinv_host(x)), em_erfinv_host(x))
#endif
#undef EM_UNARY

template <class T> EMMY_FN T em_abs(T x) { return x < T(0) ? -x : x; }
template <class T> EMMY_FN T em_sign(T x) { return T((x > T(0)) - (x < T(0))); }
#if defined(__CUDACC__)
EMMY_FN bool em_signbit(float x) { return signbit(x); }
EMMY_FN bool em_signbit(double x) { return signbit(x); }
#else
EMMY_FN bool em_signbit(float x) { return std::signbit(x); }
EMMY_FN bool em_signbit(double x) { return std::signbit(x); }
#endif
EMMY_FN int em_bits(float x) { return __float_as_int(x); }
EMMY_FN long long em_bits(double x) { return __double_as_longlong(x); }
EMMY_FN float em_float_bits(int x) { return __int_as_float(x); }
EMMY_FN double em_float_bits(long long x) { return __longlong_as_double(x); }

// digamma as torch computes it: reflection below 0, the recurrence up to 10, then the
// asymptotic series (Bernoulli numbers); -inf at +0, +inf at -0, NaN at negative integers.
template <class T> EMMY_FN T em_digamma_t(T x) {
  const T pi = T(3.14159265358979323846);
  if (x == T(0)) return em_signbit(x) ? T(EM_INF) : -T(EM_INF);
  T result = T(0);
  if (x < T(0)) {
    if (x == floor(x)) return T(EM_INF) * T(0);   // NaN
    const T frac = x - trunc(x);          // tan(pi x) from the fractional part: no big argument
    result = -pi / tan(pi * frac);
    x = T(1) - x;
  }
  while (x < T(10)) { result -= T(1) / x; x += T(1); }
  if (x == T(10)) return result + T(2.25175258906672110764);
  T y = T(0);
  if (x < T(1.0e17)) {
    const T z = T(1) / (x * x);
    y = T(1.0 / 12); y = y * z + T(-691.0 / 32760); y = y * z + T(1.0 / 132);
    y = y * z + T(-1.0 / 240); y = y * z + T(1.0 / 252); y = y * z + T(-1.0 / 120);
    y = y * z + T(1.0 / 12); y *= z;
  }
  return result + log(x) - T(0.5) / x - y;
}
EMMY_FN float em_digamma(float x) { return em_digamma_t<float>(x); }
EMMY_FN double em_digamma(double x) { return em_digamma_t<double>(x); }

template <class T> EMMY_FN T em_maximum(T a, T b) { return (a != a || a > b) ? a : b; }
template <class T> EMMY_FN T em_minimum(T a, T b) { return (a != a || a < b) ? a : b; }
#if defined(__CUDACC__)
// The same for floats in one instruction (sm_80+): max.NaN / min.NaN return NaN when either
// operand is NaN, where fmaxf would return the other.
EMMY_FN float em_maximum(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
EMMY_FN float em_minimum(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
#endif
EMMY_FN float em_pow(float a, float b) { return powf(a, b); }
EMMY_FN double em_pow(double a, double b) { return pow(a, b); }
// Integer powers as torch computes them: by squaring, wrapping at the type's width (in the
// unsigned type U, where a signed overflow is undefined); a negative exponent gives 1 for a base
// of 1, +-1 for -1 and 0 otherwise.
template <class T, class U> EMMY_FN T em_ipow(T a, T b) {
  if (b < 0) return a == T(1) ? T(1) : a == T(-1) ? ((b & 1) ? T(-1) : T(1)) : T(0);
  U r = 1, x = U(a);
  for (; b; b >>= 1, x *= x)
    if (b & 1) r *= x;
  return T(r);
}
// Integer division, truncated as C's; by zero 0 and the least value by -1 wrapping (where a
// CPU would trap: torch refuses the first, and the second overflows).
template <class T> EMMY_FN T em_idiv(T a, T b) {
  return b == T(0) ? T(0) : b == T(-1) ? T(T(0) - a) : T(a / b);
}
EMMY_FN int em_pow(int a, int b) { return em_ipow<int, unsigned>(a, b); }
EMMY_FN long long em_pow(long long a, long long b) {
  return em_ipow<long long, unsigned long long>(a, b);
}
EMMY_FN float em_atan2(float a, float b) { return atan2f(a, b); }
EMMY_FN double em_atan2(double a, double b) { return atan2(a, b); }
EMMY_FN float em_fmod(float a, float b) { return fmodf(a, b); }
EMMY_FN double em_fmod(double a, double b) { return fmod(a, b); }

// Fast approximations, for kernels whose floating-point data is all 16-bit
// (emmy/kernel_ir/fastmath.py says why that is safe): ex2.approx.ftz (subnormal results flushed
// to zero) and an approximate reciprocal. The emulator computes the same formulas with the C
// library.
EMMY_FN float em_fast_exp(float x) { return ex2_approx(x * 1.44269504f); }   // __expf, ftz
#if defined(__CUDACC__)
EMMY_FN float em_fast_rcp(float x) { return __fdividef(1.0f, x); }
#else
EMMY_FN float em_fast_rcp(float x) { return em_abs(x) > 8.50705917e37f ? 0.0f : 1.0f / x; }
#endif
EMMY_FN float em_fast_sigmoid(float x) { return em_fast_rcp(1.0f + em_fast_exp(-x)); }

// --- reductions: an op is a type with identity() and apply() --------------------------------
template <class T> EMMY_FN T em_lowest() {
  if constexpr (em_same<T, bool>::value) return false;
  else if constexpr (em_same<T, float>::value) return -EMMY_INF_F32;
  else if constexpr (em_same<T, double>::value) return -static_cast<double>(EMMY_INF_F32);
  else if constexpr (em_same<T, unsigned char>::value) return 0;
  else return static_cast<T>(1ull << (8 * sizeof(T) - 1));  // most negative two's complement
}
template <class T> EMMY_FN T em_highest() {
  if constexpr (em_same<T, bool>::value) return true;
  else if constexpr (em_same<T, float>::value) return EMMY_INF_F32;
  else if constexpr (em_same<T, double>::value) return static_cast<double>(EMMY_INF_F32);
  else if constexpr (em_same<T, unsigned char>::value) return 255;
  else return static_cast<T>(~(1ull << (8 * sizeof(T) - 1)));
}

struct EmSum  { template <class T> static EMMY_FN T identity() { return T(0); }
                template <class T> static EMMY_FN T apply(T a, T b) { return a + b; } };
struct EmProd { template <class T> static EMMY_FN T identity() { return T(1); }
                template <class T> static EMMY_FN T apply(T a, T b) { return a * b; } };
struct EmMax  { template <class T> static EMMY_FN T identity() { return em_lowest<T>(); }
                template <class T> static EMMY_FN T apply(T a, T b) { return em_maximum(a, b); } };
struct EmMin  { template <class T> static EMMY_FN T identity() { return em_highest<T>(); }
                template <class T> static EMMY_FN T apply(T a, T b) { return em_minimum(a, b); } };
// log(exp(a) + exp(b)) from the larger: no exp overflows; NaN propagates, -inf is the identity
struct EmLogAddExp {
  template <class T> static EMMY_FN T identity() { return T(-EM_INF); }
  template <class T> static EMMY_FN T apply(T a, T b) {
    if (a != a || b != b) return a + b;
    const T hi = a > b ? a : b, lo = a > b ? b : a;
    return lo == T(-EM_INF) || hi == T(EM_INF) ? hi : hi + em_log1p(em_exp(lo - hi));
  }
};

// Shuffles of a value of type T (CUDA's shuffles take a bool as an int and give an int back).
template <class T> EMMY_FN T em_shfl_xor(T x, int o) { return T(__shfl_xor_sync(EM_FULL, x, o)); }
template <class T> EMMY_FN T em_shfl_up(T x, int o) { return T(__shfl_up_sync(EM_FULL, x, o)); }
template <class T> EMMY_FN T em_shfl(T x, int src) { return T(__shfl_sync(EM_FULL, x, src)); }

// Every lane of the warp gets the combination of all 32 lanes' values (butterfly).
template <class Op, class T> EMMY_FN T em_warp_allreduce(T x) {
  for (int o = 16; o > 0; o >>= 1) x = Op::apply(x, em_shfl_xor(x, o));
  return x;
}

// Every thread of a block of `lanes` threads gets the combination of all values: warps
// combine by shuffles, then each warp's result goes through shared memory.
template <class Op, class T> EMMY_FN T em_block_allreduce(T x, unsigned char* scratch, int lanes) {
  T* s = reinterpret_cast<T*>(scratch);
  x = em_warp_allreduce<Op>(x);
  __syncthreads();
  if (threadIdx.x % 32 == 0) s[threadIdx.x / 32] = x;
  __syncthreads();
  T r = s[0];
  for (int i = 1; i < lanes / 32; ++i) r = Op::apply(r, s[i]);
  return r;
}

// The same through a shared-memory tree (log2(lanes) halving steps).
template <class Op, class T> EMMY_FN T em_block_tree(T x, unsigned char* scratch, int lanes) {
  T* s = reinterpret_cast<T*>(scratch);
  const int t = threadIdx.x;
  __syncthreads();
  s[t] = x;
  __syncthreads();
  for (int w = lanes / 2; w > 0; w >>= 1) {
    if (t < w) s[t] = Op::apply(s[t], s[t + w]);
    __syncthreads();
  }
  return s[0];
}

// The inclusive scan of one value per lane over the warp (Kogge-Stone, by shuffles).
template <class Op, class T> EMMY_FN T em_warp_inclusive(T x) {
  const int lane = threadIdx.x % 32;
  for (int o = 1; o < 32; o <<= 1) {
    T y = em_shfl_up(x, o);
    if (lane >= o) x = Op::apply(y, x);
  }
  return x;
}

// Inclusive and exclusive scan of one value per lane, continuing from `carry`; `carry`
// becomes the last lane's inclusive value.
template <class Op, class T> EMMY_FN void em_warp_scan(T v, T& carry, T& incl, T& excl) {
  const int lane = threadIdx.x % 32;
  const T x = em_warp_inclusive<Op>(v);
  T prev = em_shfl_up(x, 1);
  excl = lane == 0 ? carry : Op::apply(carry, prev);
  incl = Op::apply(carry, x);
  carry = em_shfl(incl, 31);
}

// The same over a block of `lanes` threads (whole warps, in order): each warp scans its values
// by shuffles, the first warp scans the warps' totals in shared memory, and every thread
// continues from `carry` (the same in all of them) and the totals of the warps before its own;
// `carry` becomes the block's last inclusive value in every thread.
template <class Op, class T> EMMY_FN void em_block_scan(T v, T& carry, T& incl, T& excl,
                                                        unsigned char* scratch, int lanes) {
  T* s = reinterpret_cast<T*>(scratch);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = lanes / 32;
  const T x = em_warp_inclusive<Op>(v);
  T prev = em_shfl_up(x, 1);
  __syncthreads();                          // the last chunk's readers of the totals are done
  if (lane == 31) s[warp] = x;
  __syncthreads();
  if (warp == 0) {
    const T t = em_warp_inclusive<Op>(lane < warps ? s[lane] : Op::template identity<T>());
    if (lane < warps) s[lane] = t;
  }
  __syncthreads();
  const T before = warp == 0 ? carry : Op::apply(carry, s[warp - 1]);
  excl = lane == 0 ? before : Op::apply(before, prev);
  incl = Op::apply(before, x);
  carry = Op::apply(carry, s[warps - 1]);
}

// Shifts as torch computes them: a count outside [0, bits) gives 0 (left) or the sign, 0 or
// -1 (right), where C++ leaves it undefined; a left shift drops the bits past the width.
EMMY_FN int em_shl(int a, int b) { return b < 0 || b >= 32 ? 0 : int(unsigned(a) << b); }
EMMY_FN long long em_shl(long long a, long long b) {
  return b < 0 || b >= 64 ? 0 : static_cast<long long>(static_cast<unsigned long long>(a) << b);
}
EMMY_FN int em_shr(int a, int b) { return b < 0 || b >= 32 ? (a < 0 ? -1 : 0) : a >> b; }
EMMY_FN long long em_shr(long long a, long long b) {
  return b < 0 || b >= 64 ? (a < 0 ? -1 : 0) : a >> b;
}

// argmax / argmin: (value, position) pairs; position -1 means "nothing seen"; ties keep the
// lowest position, so the first occurrence wins as in torch.
// NaN is the extreme of both (torch's max and min propagate it): a NaN beats any number, and
// among NaNs the lowest position wins.
template <bool Max, class T> EMMY_FN bool em_arg_better(T v, long long p, T bv, long long bp) {
  if (p < 0) return false;
  if (bp < 0) return true;
  const bool v_nan = v != v, b_nan = bv != bv;   // false for integers and booleans
  if (v_nan || b_nan) return v_nan && (!b_nan || p < bp);
  if (Max ? v > bv : v < bv) return true;
  return v == bv && p < bp;
}
template <bool Max, class T> EMMY_FN void em_arg_update(T& bv, long long& bp, T v, long long p) {
  if (em_arg_better<Max>(v, p, bv, bp)) { bv = v; bp = p; }
}
template <bool Max, class T> EMMY_FN void em_warp_allreduce_arg(T& v, long long& p) {
  for (int o = 16; o > 0; o >>= 1) {
    T ov = em_shfl_xor(v, o);
    long long op = __shfl_xor_sync(EM_FULL, p, o);
    em_arg_update<Max>(v, p, ov, op);
  }
}
template <bool Max, class T> EMMY_FN void em_block_allreduce_arg(T& v, long long& p,
                                                                 unsigned char* scratch, int lanes) {
  T* sv = reinterpret_cast<T*>(scratch);
  long long* sp = reinterpret_cast<long long*>(scratch + 8 * lanes);
  em_warp_allreduce_arg<Max>(v, p);
  __syncthreads();
  if (threadIdx.x % 32 == 0) { sv[threadIdx.x / 32] = v; sp[threadIdx.x / 32] = p; }
  __syncthreads();
  v = sv[0];
  p = sp[0];
  for (int i = 1; i < lanes / 32; ++i) em_arg_update<Max>(v, p, sv[i], sp[i]);
}
