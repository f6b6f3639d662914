// y = x @ W.T by integer dot products over a GGUF's weight codes (`--quantization int-dot`).
//
// Activations are quantized per row and per group of 32 values along k (int_quantize): with
// amax the group's largest |x|, s = amax / 127 and a = round_half_even(x * (127 / amax)) in
// -127..127 (a group whose amax is below the smallest normal float is all zeros with s = 0; one
// holding an inf or NaN gets s = amax, so its row's outputs are not finite). Every step is an
// exactly rounded float32 operation, so every instruction set computes the same codes.
//
// A weight is w = D * q + M per group of G = 16 or 32 along k (gguf_blocks.py), stored as an
// unsigned code u = q + bias (bias 0 for nibbles, 128 for signed bytes). Per row m, column n
// and weight group j the kernel forms the exact integer
//     i_j = sum_k a[k] * u[k] - bias * sum_k a[k]     (= sum_k a[k] * q[k]; |i_j| < 2^21)
// by any instruction that multiplies and adds integers without saturating (vpdpbusd, vpmaddwd
// on widened values, plain C++), so its order does not matter, and then one fixed float32 chain
//     acc = 0; for j = 0, 1, ...: t = D_j * float(i_j)            (M = 0)
//                                 t = fma(D_j, float(i_j), M_j * float(sum_j a))   (else)
//                                 acc = fma(s_g(j), t, acc)
// with s_g(j) the activation scale of the 32-value group holding weight group j. float(i_j) and
// float(sum a) are exact, every other step is rounded once in the order written: the result of a
// row depends on nothing but that row and the weights, on every instruction set and at every
// batch size (batch invariant by construction).
//
// Traits, one per instruction set (I): `wreg` holds L columns' four codes, `split` prepares
// it once for every row of a register tile, `broadcast` four activation codes, `dot` adds the
// four products of each column to its int32 lane.
//
// Nibble weights (u = 0..15) take a shorter route where the traits set kNarrowNibbles (AVX2 and
// AVX-512 without VNNI): vpmaddubsw multiplies unsigned code bytes by signed activation bytes
// and adds each pair into an int16 lane, saturating only past 32,767. Here no sum can get there:
// a lane of one instruction is at most 2 * 15 * 127 = 3,810 in magnitude, and a weight group
// (G <= 32 values, G / 4 instructions per lane) adds at most G / 2 * 15 * 127 = 30,480, so the
// int16 sums are exact; vpmaddwd by ones then widens each column's two lanes into its int32
// lane once per group. Same integers, so the same bits as every other route.
//
// Signed bytes (u = q + 128) take one too where the traits set kSignedBytes (AVX2): q = u ^ 128
// as int8, vpmaddubsw multiplies |q| (0..128, unsigned) by the activation with q's sign moved
// onto it (vpsignb: -127..127), so a pair's sum is at most 2 * 128 * 127 = 32,512 in magnitude:
// exact in int16, and vpmaddwd by ones adds it into int32 at once. That is sum a * q itself,
// so this route skips the bias term.

#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <utility>

#include "linear.h"

namespace dpgate {

// Rounds x (|x| < 2^22) to the nearest integer, ties to even: adding and subtracting 1.5 * 2^23
// leaves only the integer part, rounded by the add (the build forbids reassociating it away).
DPGATE_INLINE float round_half_even(float x) {
  constexpr float kMagic = 12582912.0f;
  return (x + kMagic) - kMagic;
}

// Rows row_begin..row_end of g.a into codes, scales and sums (see the rule above). I only gives
// each instruction set its own copy of the loops, compiled with its flags.
template <class I>
inline void int_quantize_rows(const IntActs& g, int64_t row_begin, int64_t row_end) {
  const int64_t groups = g.K / kActGroup;
  for (int64_t m = row_begin; m < row_end; ++m) {
    const float* x = g.a + m * g.lda;
    int8_t* codes = g.codes + m * g.K;
    for (int64_t group = 0; group < groups; ++group) {
      const float* xs = x + group * kActGroup;
      int8_t* qs = codes + group * kActGroup;
      float amax = 0.0f;  // NaN once any value is NaN (a comparison with NaN is false)
      for (int k = 0; k < kActGroup; ++k) {
        const float v = std::fabs(xs[k]);
        amax = (v > amax || v != v) ? v : amax;
      }
      float scale = 0.0f;
      if (!(amax <= FLT_MAX)) {
        scale = amax;  // inf or NaN: the row's outputs become inf or NaN
        std::memset(qs, 0, kActGroup);
      } else if (amax < FLT_MIN) {
        std::memset(qs, 0, kActGroup);
      } else {
        scale = amax / 127.0f;
        const float inverse = 127.0f / amax;
        for (int k = 0; k < kActGroup; ++k) {
          const float r = round_half_even(xs[k] * inverse);
          qs[k] = int8_t(std::min(127.0f, std::max(-127.0f, r)));
        }
      }
      g.scales[m * (g.K / kActGroup) + group] = scale;
      for (int half = 0; half < kActGroup / 16; ++half) {
        int32_t sum = 0;
        for (int k = 0; k < 16; ++k) sum += qs[half * 16 + k];
        g.sums[m * (g.K / 16) + group * (kActGroup / 16) + half] = sum;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The reference: eight lanes of plain C++.
struct IntScalar8 {
  using V = Scalar8;
  static constexpr int L = 8;
  struct ireg {
    int32_t v[8];
  };
  struct wreg {
    uint8_t b[8][4];
  };
  using wsplit = wreg;
  struct areg {
    int32_t a[4];
  };

  static constexpr bool kNarrowNibbles = false, kSignedBytes = false;
  static DPGATE_INLINE ireg zero() { return ireg{}; }
  static DPGATE_INLINE wreg load(const uint8_t* p) {
    wreg w;
    std::memcpy(w.b, p, sizeof(w.b));
    return w;
  }
  static DPGATE_INLINE wreg low_nibbles(wreg w) {
    for (auto& lane : w.b)
      for (uint8_t& byte : lane) byte &= 15;
    return w;
  }
  static DPGATE_INLINE wreg high_nibbles(wreg w) {
    for (auto& lane : w.b)
      for (uint8_t& byte : lane) byte >>= 4;
    return w;
  }
  static DPGATE_INLINE wsplit split(wreg w) { return w; }
  static DPGATE_INLINE areg broadcast(const int8_t* a) { return areg{{a[0], a[1], a[2], a[3]}}; }
  static DPGATE_INLINE ireg dot(ireg acc, const wsplit& w, const areg& a) {
    for (int l = 0; l < L; ++l)
      for (int b = 0; b < 4; ++b) acc.v[l] += int32_t(w.b[l][b]) * a.a[b];
    return acc;
  }
  static DPGATE_INLINE ireg sub(ireg x, int32_t c) {
    for (int32_t& v : x.v) v -= c;
    return x;
  }
  static DPGATE_INLINE V::reg to_float(ireg x) {
    V::reg r;
    for (int l = 0; l < L; ++l) r.v[l] = float(x.v[l]);
    return r;
  }
};

// ---------------------------------------------------------------------------------------------
// Widening: each lane's four unsigned codes split into 16-bit pairs (bytes 0, 2 and 1, 3), each
// multiplied by the matching pair of sign-extended activations with vpmaddwd, whose two
// products (|255 * 127| each) and their sum are exact in int32. No saturating instruction.
#if defined(__AVX2__) && defined(__FMA__)
struct IntAvx2 {
  using V = Avx2;
  static constexpr int L = 8;
  using ireg = __m256i;
  using wreg = __m256i;
  struct wsplit {
    __m256i even, odd;
  };
  using areg = wsplit;

  static DPGATE_INLINE ireg zero() { return _mm256_setzero_si256(); }
  static DPGATE_INLINE wreg load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static DPGATE_INLINE wreg low_nibbles(wreg w) { return _mm256_and_si256(w, _mm256_set1_epi8(15)); }
  static DPGATE_INLINE wreg high_nibbles(wreg w) {
    return _mm256_and_si256(_mm256_srli_epi16(w, 4), _mm256_set1_epi8(15));
  }
  static DPGATE_INLINE wsplit split(wreg w) {
    return {_mm256_and_si256(w, _mm256_set1_epi16(0x00FF)), _mm256_srli_epi16(w, 8)};
  }
  static DPGATE_INLINE areg broadcast(const int8_t* a) {
    int32_t four;
    std::memcpy(&four, a, 4);
    const __m256i b = _mm256_set1_epi32(four);
    return {_mm256_srai_epi16(_mm256_slli_epi16(b, 8), 8), _mm256_srai_epi16(b, 8)};
  }
  static DPGATE_INLINE ireg dot(ireg acc, const wsplit& w, const areg& a) {
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(w.even, a.even));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(w.odd, a.odd));
  }
  // The nibble route (see the top of this file): int16 sums of code * activation pairs.
  static constexpr bool kNarrowNibbles = true;
  using nreg = __m256i;
  static DPGATE_INLINE nreg nzero() { return _mm256_setzero_si256(); }
  static DPGATE_INLINE __m256i broadcast_bytes(const int8_t* a) {
    int32_t four;
    std::memcpy(&four, a, 4);
    return _mm256_set1_epi32(four);
  }
  static DPGATE_INLINE nreg nibble_dot(nreg acc, wreg codes, __m256i a) {
    return _mm256_add_epi16(acc, _mm256_maddubs_epi16(codes, a));
  }
  static DPGATE_INLINE ireg widen(nreg sums) { return _mm256_madd_epi16(sums, _mm256_set1_epi16(1)); }
  // The signed-byte route (see the top of this file).
  static constexpr bool kSignedBytes = true;
  struct sbytes {
    __m256i magnitude, sign;
  };
  static DPGATE_INLINE sbytes signed_split(wreg w) {
    const __m256i q = _mm256_xor_si256(w, _mm256_set1_epi8(char(0x80)));
    return {_mm256_abs_epi8(q), q};
  }
  static DPGATE_INLINE ireg signed_dot(ireg acc, const sbytes& w, __m256i a) {
    const __m256i pairs = _mm256_maddubs_epi16(w.magnitude, _mm256_sign_epi8(a, w.sign));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
  static DPGATE_INLINE ireg sub(ireg x, int32_t c) { return _mm256_sub_epi32(x, _mm256_set1_epi32(c)); }
  static DPGATE_INLINE V::reg to_float(ireg x) { return _mm256_cvtepi32_ps(x); }
};
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
struct IntAvx512 {
  using V = Avx512;
  static constexpr int L = 16;
  using ireg = __m512i;
  using wreg = __m512i;
  struct wsplit {
    __m512i even, odd;
  };
  using areg = wsplit;

  static DPGATE_INLINE ireg zero() { return _mm512_setzero_si512(); }
  static DPGATE_INLINE wreg load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static DPGATE_INLINE wreg low_nibbles(wreg w) { return _mm512_and_si512(w, _mm512_set1_epi8(15)); }
  static DPGATE_INLINE wreg high_nibbles(wreg w) {
    return _mm512_and_si512(_mm512_srli_epi16(w, 4), _mm512_set1_epi8(15));
  }
  static DPGATE_INLINE wsplit split(wreg w) {
    return {_mm512_and_si512(w, _mm512_set1_epi16(0x00FF)), _mm512_srli_epi16(w, 8)};
  }
  static DPGATE_INLINE areg broadcast(const int8_t* a) {
    int32_t four;
    std::memcpy(&four, a, 4);
    const __m512i b = _mm512_set1_epi32(four);
    return {_mm512_srai_epi16(_mm512_slli_epi16(b, 8), 8), _mm512_srai_epi16(b, 8)};
  }
  static DPGATE_INLINE ireg dot(ireg acc, const wsplit& w, const areg& a) {
    acc = _mm512_add_epi32(acc, _mm512_madd_epi16(w.even, a.even));
    return _mm512_add_epi32(acc, _mm512_madd_epi16(w.odd, a.odd));
  }
  // The nibble route (see the top of this file): int16 sums of code * activation pairs.
  static constexpr bool kNarrowNibbles = true;
  using nreg = __m512i;
  static DPGATE_INLINE nreg nzero() { return _mm512_setzero_si512(); }
  static DPGATE_INLINE __m512i broadcast_bytes(const int8_t* a) {
    int32_t four;
    std::memcpy(&four, a, 4);
    return _mm512_set1_epi32(four);
  }
  static DPGATE_INLINE nreg nibble_dot(nreg acc, wreg codes, __m512i a) {
    return _mm512_add_epi16(acc, _mm512_maddubs_epi16(codes, a));
  }
  static DPGATE_INLINE ireg widen(nreg sums) { return _mm512_madd_epi16(sums, _mm512_set1_epi16(1)); }
  static constexpr bool kSignedBytes = false;  // no vpsignb in AVX-512
  static DPGATE_INLINE ireg sub(ireg x, int32_t c) { return _mm512_sub_epi32(x, _mm512_set1_epi32(c)); }
  static DPGATE_INLINE V::reg to_float(ireg x) { return _mm512_cvtepi32_ps(x); }
};
#endif

#if defined(__AVX512VNNI__)
// vpdpbusd: each int32 lane += the four products of its unsigned weight bytes and the signed
// activation bytes, summed exactly (the non-saturating form), 64 products an instruction.
struct IntAvx512Vnni : IntAvx512 {
  static constexpr bool kNarrowNibbles = false;  // vpdpbusd does nibbles in one instruction too
  using wsplit = __m512i;
  using areg = __m512i;

  static DPGATE_INLINE wsplit split(wreg w) { return w; }
  static DPGATE_INLINE areg broadcast(const int8_t* a) {
    int32_t four;
    std::memcpy(&four, a, 4);
    return _mm512_set1_epi32(four);
  }
  static DPGATE_INLINE ireg dot(ireg acc, const wsplit& w, const areg& a) { return _mm512_dpbusd_epi32(acc, w, a); }
};
#endif

// ---------------------------------------------------------------------------------------------
// One register tile: MR rows x NV vectors of L columns (starting at col0), all of k.
template <class I, bool kNibbles, bool kOffsets, bool kBias, int MR, int NV>
inline void int_tile(const IntLinearArgs& g, int64_t row0, int64_t col0) {
  using V = typename I::V;
  using reg = typename V::reg;
  using ireg = typename I::ireg;
  constexpr int L = I::L;
  constexpr int64_t kStep = kNibbles ? 8 : 4;   // k per chunk of 64 bytes
  constexpr int64_t kChunk = 4 * kPanelWidth;  // bytes per chunk of a panel
  constexpr bool kNarrow = kNibbles && I::kNarrowNibbles;  // int16 sums: G is 16 or 32 (int_dot_part)
  constexpr bool kSigned = !kNibbles && kBias && I::kSignedBytes;  // kBias: bias 128 (int_dot_part)
  const int64_t K = g.K, G = g.group, groups = K / G;
  const uint8_t* codes[NV];
  const float* scales[NV];
  const float* offsets[NV];
  for (int j = 0; j < NV; ++j) {
    const int64_t c = col0 + int64_t(j) * L, panel = c / kPanelWidth, within = c % kPanelWidth;
    codes[j] = g.q + panel * (K / kStep) * kChunk + within * 4;
    scales[j] = g.scales + panel * groups * kPanelWidth + within;
    offsets[j] = kOffsets ? g.offsets + panel * groups * kPanelWidth + within : nullptr;
  }
  const int8_t* rows[MR];
  const float* row_scales[MR];
  const int32_t* row_sums[MR];
  for (int i = 0; i < MR; ++i) {
    rows[i] = g.codes + (row0 + i) * K;
    row_scales[i] = g.act_scales + (row0 + i) * (K / kActGroup);
    row_sums[i] = g.act_sums + (row0 + i) * (K / 16);
  }

  reg acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) acc[i][j] = V::zero();
  const int64_t sixteens = G / 16;  // activation sums per weight group
  for (int64_t group = 0; group < groups; ++group) {
    ireg isum[MR][NV];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NV; ++j) isum[i][j] = I::zero();
    if constexpr (kNarrow) {
      typename I::nreg narrow[MR][NV];
      for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NV; ++j) narrow[i][j] = I::nzero();
      for (int64_t k = group * G; k < (group + 1) * G; k += kStep) {
        const int64_t chunk = k / kStep;
#pragma GCC unroll 16
        for (int j = 0; j < NV; ++j) {
          const typename I::wreg w = I::load(codes[j] + chunk * kChunk);
          const typename I::wreg low = I::low_nibbles(w), high = I::high_nibbles(w);
#pragma GCC unroll 16
          for (int i = 0; i < MR; ++i) {
            narrow[i][j] = I::nibble_dot(narrow[i][j], low, I::broadcast_bytes(rows[i] + k));
            narrow[i][j] = I::nibble_dot(narrow[i][j], high, I::broadcast_bytes(rows[i] + k + 4));
          }
        }
      }
      for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NV; ++j) isum[i][j] = I::widen(narrow[i][j]);
    }
    for (int64_t k = group * G; !kNarrow && k < (group + 1) * G; k += kStep) {
      const int64_t chunk = k / kStep;
#pragma GCC unroll 16
      for (int j = 0; j < NV; ++j) {
        const typename I::wreg w = I::load(codes[j] + chunk * kChunk);
        if constexpr (kNibbles) {
          const typename I::wsplit low = I::split(I::low_nibbles(w)), high = I::split(I::high_nibbles(w));
#pragma GCC unroll 16
          for (int i = 0; i < MR; ++i) {
            isum[i][j] = I::dot(isum[i][j], low, I::broadcast(rows[i] + k));
            isum[i][j] = I::dot(isum[i][j], high, I::broadcast(rows[i] + k + 4));
          }
        } else if constexpr (kSigned) {
          const typename I::sbytes split = I::signed_split(w);
#pragma GCC unroll 16
          for (int i = 0; i < MR; ++i)
            isum[i][j] = I::signed_dot(isum[i][j], split, I::broadcast_bytes(rows[i] + k));
        } else {
          const typename I::wsplit split = I::split(w);
#pragma GCC unroll 16
          for (int i = 0; i < MR; ++i) isum[i][j] = I::dot(isum[i][j], split, I::broadcast(rows[i] + k));
        }
      }
    }
    // The fixed float32 chain (see the top of this file).
    const int64_t act_group = group * G / kActGroup;
    int32_t sums[MR];
    for (int i = 0; i < MR; ++i) {
      sums[i] = 0;
      for (int64_t s = 0; s < sixteens; ++s) sums[i] += row_sums[i][group * sixteens + s];
    }
#pragma GCC unroll 16
    for (int j = 0; j < NV; ++j) {
      const reg d = V::load(scales[j] + group * kPanelWidth);
      const reg m = kOffsets ? V::load(offsets[j] + group * kPanelWidth) : V::zero();
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        ireg exact = isum[i][j];
        if constexpr (kBias && !kSigned) exact = I::sub(exact, g.bias * sums[i]);
        reg t;
        if constexpr (kOffsets) t = V::fma(d, I::to_float(exact), V::mul(m, V::set1(float(sums[i]))));
        else t = V::mul(d, I::to_float(exact));
        acc[i][j] = V::fma(V::set1(row_scales[i][act_group]), t, acc[i][j]);
      }
    }
  }

  store_tile<V, MR, NV>(output_of(g), acc, row0, col0);
}

// Rows row_begin..row_end of one column tile: full tiles of MR rows, then one smaller tile.
template <class I, bool kNibbles, bool kOffsets, bool kBias, int MR, int NV>
inline void int_rows(const IntLinearArgs& g, int64_t row_begin, int64_t row_end, int64_t col0) {
  int64_t row = row_begin;
  for (; row + MR <= row_end; row += MR) int_tile<I, kNibbles, kOffsets, kBias, MR, NV>(g, row, col0);
  if constexpr (MR > 1) {
    const int64_t rest = row_end - row;
    if (rest > 0) {
      [&]<int... R>(std::integer_sequence<int, R...>) {
        ((rest == R + 1 ? int_tile<I, kNibbles, kOffsets, kBias, R + 1, NV>(g, row, col0) : void()), ...);
      }(std::make_integer_sequence<int, MR - 1>{});
    }
  }
}

template <class I, bool kNibbles, bool kOffsets, bool kBias, int MR, int NV>
inline void int_columns(const IntLinearArgs& g, int64_t tile_begin, int64_t tile_end) {
  // Activation codes are one byte each.
  walk_column_tiles<I::L, NV>(g.M, g.N, rows_in_cache<MR>(256 * 1024, g.K), tile_begin, tile_end,
                              [&](auto nv, int64_t row0, int64_t row1, int64_t col0) {
                                int_rows<I, kNibbles, kOffsets, kBias, MR, decltype(nv)::value>(g, row0, row1, col0);
                              });
}

// The weight kinds the GGUF formats served here need: nibbles with offsets (Q4_0, Q4_1, Q4_K)
// and signed bytes without (Q5_0, Q8_0, Q6_K); the other two combinations are served as well.
template <class I, int MR, int NV>
inline void int_dispatch(const IntLinearArgs& g, int64_t tile_begin, int64_t tile_end) {
  const bool offsets = g.offsets != nullptr, bias = g.bias != 0;
  if (g.nibbles && offsets) return int_columns<I, true, true, false, MR, NV>(g, tile_begin, tile_end);
  if (g.nibbles) return int_columns<I, true, false, false, MR, NV>(g, tile_begin, tile_end);
  if (offsets && bias) return int_columns<I, false, true, true, MR, NV>(g, tile_begin, tile_end);
  if (offsets) return int_columns<I, false, true, false, MR, NV>(g, tile_begin, tile_end);
  if (bias) return int_columns<I, false, false, true, MR, NV>(g, tile_begin, tile_end);
  return int_columns<I, false, false, false, MR, NV>(g, tile_begin, tile_end);
}

}  // namespace dpgate
