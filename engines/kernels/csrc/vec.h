// Vector types the batch-invariant kernels are written against.
//
// Every kernel is a template over one of these types, and every operation a type offers is
// exactly rounded (add, mul, fma, div, sqrt, max, rounding to an integer, bit moves), so the
// same template gives the same bits whichever type runs it. `Scalar8` is the reference: plain
// C++ on eight lanes, compiled without contraction. `Avx2` runs the same eight lanes in one
// register. `Avx512` (sixteen lanes) serves only the matrix multiply and attention's value sums,
// whose results do not depend on the lane count (see linear.h, attention.h).
//
// Each type lives in its own translation unit, compiled with that instruction set enabled
// (isa_*.cpp); nothing here is compiled for a CPU that lacks it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#define DPGATE_INLINE inline __attribute__((always_inline))

namespace dpgate {

using bf16_t = uint16_t;

DPGATE_INLINE float bf16_to_float(bf16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, NaN kept a (quiet) NaN: the rounding torch uses.
DPGATE_INLINE bf16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return bf16_t(bits >> 16);
}

DPGATE_INLINE float float_from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Constants of the exponential every kernel uses (Cephes' single-precision expf): inputs below
// kExpLow give exactly 0, so masked scores (-inf) contribute exact zeros.
constexpr float kExpHigh = 88.3762626647949f;
constexpr float kExpLow = -87.33654475f;  // ln(2^-126)
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// ---------------------------------------------------------------------------------------------
// The reference: eight lanes of plain C++.
struct Scalar8 {
  static constexpr int L = 8;
  struct reg {
    float v[8];
  };

  static DPGATE_INLINE reg zero() { return set1(0.0f); }
  static DPGATE_INLINE reg set1(float x) {
    reg r;
    for (int l = 0; l < L; ++l) r.v[l] = x;
    return r;
  }
  static DPGATE_INLINE reg load(const float* p) {
    reg r;
    for (int l = 0; l < L; ++l) r.v[l] = p[l];
    return r;
  }
  static DPGATE_INLINE reg load(const bf16_t* p) {
    reg r;
    for (int l = 0; l < L; ++l) r.v[l] = bf16_to_float(p[l]);
    return r;
  }
  static DPGATE_INLINE reg load(const int8_t* p) {
    reg r;
    for (int l = 0; l < L; ++l) r.v[l] = float(p[l]);
    return r;
  }
  // Lane l of lo / hi: the low / high nibble of byte p[l].
  static DPGATE_INLINE void load_nibble_pair(const uint8_t* p, reg& lo, reg& hi) {
    for (int l = 0; l < L; ++l) {
      lo.v[l] = float(p[l] & 15);
      hi.v[l] = float(p[l] >> 4);
    }
  }
  static DPGATE_INLINE void store(float* p, reg a) {
    for (int l = 0; l < L; ++l) p[l] = a.v[l];
  }
  static DPGATE_INLINE void store(bf16_t* p, reg a) {
    for (int l = 0; l < L; ++l) p[l] = float_to_bf16(a.v[l]);
  }
#define DPGATE_LANEWISE(name, expr)              \
  static DPGATE_INLINE reg name(reg a, reg b) { \
    reg r;                                       \
    for (int l = 0; l < L; ++l) {                \
      float x = a.v[l], y = b.v[l];              \
      r.v[l] = (expr);                           \
    }                                            \
    return r;                                    \
  }
  DPGATE_LANEWISE(add, x + y)
  DPGATE_LANEWISE(sub, x - y)
  DPGATE_LANEWISE(mul, x* y)
  DPGATE_LANEWISE(div, x / y)
  DPGATE_LANEWISE(max, x > y ? x : y)
  DPGATE_LANEWISE(min, x < y ? x : y)
#undef DPGATE_LANEWISE
  // a * b + c, rounded once.
  static DPGATE_INLINE reg fma(reg a, reg b, reg c) {
    reg r;
    for (int l = 0; l < L; ++l) r.v[l] = std::fma(a.v[l], b.v[l], c.v[l]);
    return r;
  }
  // c - a * b, rounded once.
  static DPGATE_INLINE reg fnma(reg a, reg b, reg c) {
    reg r;
    for (int l = 0; l < L; ++l) r.v[l] = std::fma(-a.v[l], b.v[l], c.v[l]);
    return r;
  }
  // Lanes where a < limit become `value`.
  static DPGATE_INLINE reg replace_below(reg a, float limit, float value, reg x) {
    reg r;
    for (int l = 0; l < L; ++l) r.v[l] = a.v[l] < limit ? value : x.v[l];
    return r;
  }
  static DPGATE_INLINE reg round_nearest(reg a) {
    reg r;
    for (int l = 0; l < L; ++l) r.v[l] = std::nearbyint(a.v[l]);
    return r;
  }
  // 2^n for integral n in [-126, 127].
  static DPGATE_INLINE reg pow2(reg n) {
    reg r;
    for (int l = 0; l < L; ++l) r.v[l] = float_from_bits(uint32_t(int32_t(n.v[l]) + 127) << 23);
    return r;
  }
  // ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)): the one order every horizontal sum uses.
  static DPGATE_INLINE float hsum(reg a) {
    const float* x = a.v;
    return ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
  }
  static DPGATE_INLINE float hmax(reg a) {
    float m = a.v[0];
    for (int l = 1; l < L; ++l) m = a.v[l] > m ? a.v[l] : m;
    return m;
  }
  // Lane l of the result is hsum(a[l]).
  static DPGATE_INLINE reg hsum8(const reg* a) {
    reg r;
    for (int l = 0; l < L; ++l) r.v[l] = hsum(a[l]);
    return r;
  }
  // out[l] = hsum(a[l]) for l < 4.
  static DPGATE_INLINE void hsum4(const reg* a, float* out) {
    for (int l = 0; l < 4; ++l) out[l] = hsum(a[l]);
  }
};

// ---------------------------------------------------------------------------------------------
#if defined(__AVX2__) && defined(__FMA__)
struct Avx2 {
  static constexpr int L = 8;
  using reg = __m256;

  static DPGATE_INLINE reg zero() { return _mm256_setzero_ps(); }
  static DPGATE_INLINE reg set1(float x) { return _mm256_set1_ps(x); }
  static DPGATE_INLINE reg load(const float* p) { return _mm256_loadu_ps(p); }
  static DPGATE_INLINE reg load(const bf16_t* p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static DPGATE_INLINE reg load(const int8_t* p) {
    __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
  }
  static DPGATE_INLINE void load_nibble_pair(const uint8_t* p, reg& lo, reg& hi) {
    const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    lo = _mm256_cvtepi32_ps(_mm256_and_si256(bytes, _mm256_set1_epi32(15)));
    hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4));
  }
  static DPGATE_INLINE void store(float* p, reg a) { _mm256_storeu_ps(p, a); }
  static DPGATE_INLINE void store(bf16_t* p, reg a) {
    __m256i bits = _mm256_castps_si256(a);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    __m256 is_nan = _mm256_cmp_ps(a, a, _CMP_UNORD_Q);
    rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(is_nan));
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  static DPGATE_INLINE reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static DPGATE_INLINE reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static DPGATE_INLINE reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static DPGATE_INLINE reg div(reg a, reg b) { return _mm256_div_ps(a, b); }
  // vmaxps is defined as `a > b ? a : b` (and vminps as `a < b ? a : b`), exactly Scalar8's.
  static DPGATE_INLINE reg max(reg a, reg b) { return _mm256_max_ps(a, b); }
  static DPGATE_INLINE reg min(reg a, reg b) { return _mm256_min_ps(a, b); }
  static DPGATE_INLINE reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static DPGATE_INLINE reg fnma(reg a, reg b, reg c) { return _mm256_fnmadd_ps(a, b, c); }
  static DPGATE_INLINE reg replace_below(reg a, float limit, float value, reg x) {
    return _mm256_blendv_ps(x, _mm256_set1_ps(value), _mm256_cmp_ps(a, _mm256_set1_ps(limit), _CMP_LT_OQ));
  }
  static DPGATE_INLINE reg round_nearest(reg a) {
    return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static DPGATE_INLINE reg pow2(reg n) {
    __m256i e = _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  }
  static DPGATE_INLINE float hsum(reg a) {
    __m256 pairs = _mm256_hadd_ps(a, a);      // x0+x1, x2+x3 | x4+x5, x6+x7
    __m256 quads = _mm256_hadd_ps(pairs, pairs);  // (x0+x1)+(x2+x3) | (x4+x5)+(x6+x7)
    return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(quads), _mm256_extractf128_ps(quads, 1)));
  }
  static DPGATE_INLINE float hmax(reg a) {
    alignas(32) float x[8];
    _mm256_store_ps(x, a);
    float m = x[0];
    for (int l = 1; l < L; ++l) m = x[l] > m ? x[l] : m;
    return m;
  }
  // Eight horizontal sums at once, each in hsum's order: lane l of the result is hsum(a[l]).
  static DPGATE_INLINE reg hsum8(const reg* a) {
    __m256 t0 = _mm256_hadd_ps(a[0], a[1]);
    __m256 t1 = _mm256_hadd_ps(a[2], a[3]);
    __m256 t2 = _mm256_hadd_ps(a[4], a[5]);
    __m256 t3 = _mm256_hadd_ps(a[6], a[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1);  // per 128-bit half: quad sums of a0, a1, a2, a3
    __m256 u1 = _mm256_hadd_ps(t2, t3);  // ... of a4, a5, a6, a7
    __m256 low = _mm256_permute2f128_ps(u0, u1, 0x20);
    __m256 high = _mm256_permute2f128_ps(u0, u1, 0x31);
    return _mm256_add_ps(low, high);
  }
  // Four horizontal sums in hsum's order: out[l] = hsum(a[l]) for l < 4.
  static DPGATE_INLINE void hsum4(const reg* a, float* out) {
    __m256 quads = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(quads), _mm256_extractf128_ps(quads, 1)));
  }
};
#endif

// ---------------------------------------------------------------------------------------------
#if defined(__AVX512F__)
// Sixteen lanes, for the matrix multiply only.
struct Avx512 {
  static constexpr int L = 16;
  using reg = __m512;

  static DPGATE_INLINE reg zero() { return _mm512_setzero_ps(); }
  static DPGATE_INLINE reg set1(float x) { return _mm512_set1_ps(x); }
  static DPGATE_INLINE reg load(const float* p) { return _mm512_loadu_ps(p); }
  static DPGATE_INLINE reg load(const bf16_t* p) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  static DPGATE_INLINE reg load(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static DPGATE_INLINE void load_nibble_pair(const uint8_t* p, reg& lo, reg& hi) {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    lo = _mm512_cvtepi32_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(15)));
    hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4));
  }
  static DPGATE_INLINE void store(float* p, reg a) { _mm512_storeu_ps(p, a); }
  static DPGATE_INLINE void store(bf16_t* p, reg a) {
    __m512i bits = _mm512_castps_si512(a);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __mmask16 is_nan = _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    rounded = _mm512_mask_mov_epi32(rounded, is_nan, _mm512_set1_epi32(0x7fc0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(rounded));
  }
  static DPGATE_INLINE reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static DPGATE_INLINE reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
};
#endif

// The exponential, the same steps on every vector type: Cephes' range reduction and polynomial.
// Accurate to about one unit in the last place; inputs below kExpLow give exactly 0.
template <class V>
DPGATE_INLINE typename V::reg exp(typename V::reg x) {
  using reg = typename V::reg;
  reg clamped = V::max(V::min(x, V::set1(kExpHigh)), V::set1(kExpLow));
  reg n = V::round_nearest(V::mul(clamped, V::set1(kLog2e)));
  reg r = V::fnma(n, V::set1(kLn2Hi), clamped);
  r = V::fnma(n, V::set1(kLn2Lo), r);
  reg y = V::set1(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) y = V::fma(y, r, V::set1(kExpPoly[i]));
  y = V::fma(y, V::mul(r, r), r);
  y = V::add(y, V::set1(1.0f));
  return V::replace_below(x, kExpLow, 0.0f, V::mul(y, V::pow2(n)));
}

}  // namespace dpgate
