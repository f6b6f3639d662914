// y = x @ W.T over block-quantized weights (the GGUF's own grid), batch invariant by construction.
//
// Every GGUF format served here dequantizes, in the gguf package's reference code, to
//     w = D * q + M   (float32, D and M one pair per group of G = 32 or 16 weights along k)
// with q a small integer (a nibble 0..15, or a signed byte) and D * q exact in float32 (an fp16
// or fp16-times-6-bit scale times a <= 8-bit integer needs at most 23 significant bits). The sum
// with M is the reference's only rounding, so fma(D, q, M) rounds exactly as it does (and
// D * q alone, without M, is exact). The kernel computes that w in registers and then follows
// linear.h's rule unchanged: every output element is one fma chain over k = 0..K-1 from 0,
//     acc = 0; for k: acc = fma(x[m][k], w[n][k], acc); y[m][n] = acc
// so its result equals the float32 kernel's over the dequantized weights bit for bit, and a row
// never depends on the other rows. A weight is dequantized once per register tile and reused by
// all of the tile's rows. With many rows (prefill, wide decode steps; QuantLinearArgs::gemm) a
// column tile's panels are instead dequantized once into a float32 buffer, which linear.h's float32
// tiles then multiply by every row: the GEMM-shaped path. Both paths compute the same w with the
// same exactly rounded operation and the same chains, so which one runs changes no bit.
//
// Layouts (panels of 16 output columns, zero padded; P = ceil(N / 16)):
//   nibbles [P, K / 2, 16] uint8: byte j of panel p at k / 2 holds column 16p+j's codes at the
//           even k (low nibble) and k + 1 (high), so one load feeds two steps of the chain
//   bytes   [P, K, 16] int8
//   scales, offsets [P, K / G, 16] float32 (offsets may be absent: M = 0)
#pragma once

#include <vector>

#include "linear.h"

namespace dpgate {

template <class V, bool kNibbles, bool kOffsets, int MR, int NV>
inline void quant_tile(const QuantLinearArgs& g, int64_t row0, int64_t col0) {
  using reg = typename V::reg;
  constexpr int L = V::L;
  const int64_t K = g.K, G = g.group, groups = g.K / g.group;
  const uint8_t* codes[NV];
  const float* scales[NV];
  const float* offsets[NV];
  for (int j = 0; j < NV; ++j) {
    const int64_t c = col0 + int64_t(j) * L, panel = c / kPanelWidth, within = c % kPanelWidth;
    codes[j] = g.q + panel * K * kPanelWidth / (kNibbles ? 2 : 1) + within;
    scales[j] = g.scales + panel * groups * kPanelWidth + within;
    offsets[j] = kOffsets ? g.offsets + panel * groups * kPanelWidth + within : nullptr;
  }
  const float* rows[MR];
  for (int i = 0; i < MR; ++i) rows[i] = g.a + (row0 + i) * g.lda;

  reg acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) acc[i][j] = V::zero();
  auto dequantize = [](reg d, reg q, reg m) {
    if constexpr (kOffsets) return V::fma(d, q, m);
    else return V::mul(d, q);
  };
  for (int64_t group = 0; group < groups; ++group) {
    reg d[NV], m[NV];
#pragma GCC unroll 16
    for (int j = 0; j < NV; ++j) {
      d[j] = V::load(scales[j] + group * kPanelWidth);
      m[j] = kOffsets ? V::load(offsets[j] + group * kPanelWidth) : V::zero();
    }
    if constexpr (kNibbles) {
      // One byte holds a column's codes at k (low nibble) and k + 1 (high): two steps per load.
      for (int64_t k = group * G; k < (group + 1) * G; k += 2) {
#pragma GCC unroll 16
        for (int j = 0; j < NV; ++j) {
          reg q0, q1;
          V::load_nibble_pair(codes[j] + k / 2 * kPanelWidth, q0, q1);
          const reg w0 = dequantize(d[j], q0, m[j]), w1 = dequantize(d[j], q1, m[j]);
#pragma GCC unroll 16
          for (int i = 0; i < MR; ++i) acc[i][j] = V::fma(V::set1(rows[i][k]), w0, acc[i][j]);
#pragma GCC unroll 16
          for (int i = 0; i < MR; ++i) acc[i][j] = V::fma(V::set1(rows[i][k + 1]), w1, acc[i][j]);
        }
      }
    } else {
      for (int64_t k = group * G; k < (group + 1) * G; ++k) {
#pragma GCC unroll 16
        for (int j = 0; j < NV; ++j) {
          const reg w = dequantize(d[j], V::load(reinterpret_cast<const int8_t*>(codes[j] + k * kPanelWidth)), m[j]);
#pragma GCC unroll 16
          for (int i = 0; i < MR; ++i) acc[i][j] = V::fma(V::set1(rows[i][k]), w, acc[i][j]);
        }
      }
    }
  }

  store_tile<V, MR, NV>(output_of(g), acc, row0, col0);
}

// Rows row_begin..row_end of one column tile: full tiles of MR rows, then one smaller tile.
template <class V, bool kNibbles, bool kOffsets, int MR, int NV>
inline void quant_rows(const QuantLinearArgs& g, int64_t row_begin, int64_t row_end, int64_t col0) {
  int64_t row = row_begin;
  for (; row + MR <= row_end; row += MR) quant_tile<V, kNibbles, kOffsets, MR, NV>(g, row, col0);
  if constexpr (MR > 1) {
    const int64_t rest = row_end - row;
    if (rest > 0) {
      [&]<int... R>(std::integer_sequence<int, R...>) {
        ((rest == R + 1 ? quant_tile<V, kNibbles, kOffsets, R + 1, NV>(g, row, col0) : void()), ...);
      }(std::make_integer_sequence<int, MR - 1>{});
    }
  }
}

template <class V, bool kNibbles, bool kOffsets, int MR, int NV>
inline void quant_columns(const QuantLinearArgs& g, int64_t tile_begin, int64_t tile_end) {
  walk_column_tiles<V::L, NV>(g.M, g.N, rows_in_cache<MR>(192 * 1024, g.K * 4), tile_begin, tile_end,
                              [&](auto nv, int64_t row0, int64_t row1, int64_t col0) {
                                quant_rows<V, kNibbles, kOffsets, MR, decltype(nv)::value>(g, row0, row1, col0);
                              });
}

// Panels panel0 .. panel0 + count - 1 dequantized into buffer [count, K, 16] float32: linear.h's
// float32 panel layout.
template <class V, bool kNibbles, bool kOffsets>
inline void dequantize_panels(const QuantLinearArgs& g, int64_t panel0, int64_t count, float* buffer) {
  constexpr int L = V::L;
  const int64_t K = g.K, G = g.group, groups = g.K / g.group;
  for (int64_t p = 0; p < count; ++p) {
    const uint8_t* codes = g.q + (panel0 + p) * K * kPanelWidth / (kNibbles ? 2 : 1);
    const float* scales = g.scales + (panel0 + p) * groups * kPanelWidth;
    const float* offsets = kOffsets ? g.offsets + (panel0 + p) * groups * kPanelWidth : nullptr;
    float* out = buffer + p * K * kPanelWidth;
    for (int v = 0; v < kPanelWidth / L; ++v) {
      for (int64_t group = 0; group < groups; ++group) {
        const typename V::reg d = V::load(scales + group * kPanelWidth + v * L);
        const typename V::reg m = kOffsets ? V::load(offsets + group * kPanelWidth + v * L) : V::zero();
        auto dequantize = [&](typename V::reg q) { return kOffsets ? V::fma(d, q, m) : V::mul(d, q); };
        for (int64_t k = group * G; k < (group + 1) * G; k += kNibbles ? 2 : 1) {
          if constexpr (kNibbles) {
            typename V::reg q0, q1;
            V::load_nibble_pair(codes + k / 2 * kPanelWidth + v * L, q0, q1);
            V::store(out + k * kPanelWidth + v * L, dequantize(q0));
            V::store(out + (k + 1) * kPanelWidth + v * L, dequantize(q1));
          } else {
            const auto* bytes = reinterpret_cast<const int8_t*>(codes + k * kPanelWidth + v * L);
            V::store(out + k * kPanelWidth + v * L, dequantize(V::load(bytes)));
          }
        }
      }
    }
  }
}

// The GEMM-shaped path: per column tile of linear.h's float32 plan (MR x NV, starting at a panel),
// dequantize its panels once, then linear.h's tiles over all rows.
template <class V, bool kNibbles, bool kOffsets, int MR, int NV>
inline void quant_gemm_columns(const QuantLinearArgs& g, int64_t tile_begin, int64_t tile_end) {
  constexpr int L = V::L;
  static_assert((NV * L) % kPanelWidth == 0, "a GEMM column tile must cover whole panels");
  const int64_t num_vectors = (g.N + L - 1) / L, num_panels = (g.N + kPanelWidth - 1) / kPanelWidth;
  thread_local std::vector<float> buffer;
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const int64_t first = tile * NV, col0 = first * L, panel0 = col0 / kPanelWidth;
    const int64_t count = std::min<int64_t>(NV, num_vectors - first);
    const int64_t panels = std::min<int64_t>(num_panels - panel0, NV * L / kPanelWidth);
    buffer.resize(size_t(panels * g.K * kPanelWidth));
    dequantize_panels<V, kNibbles, kOffsets>(g, panel0, panels, buffer.data());
    void* out = g.out_type == DType::kFloat32 ? static_cast<void*>(static_cast<float*>(g.out) + col0)
                                              : static_cast<void*>(static_cast<bf16_t*>(g.out) + col0);
    const LinearArgs args{g.a, g.lda, buffer.data(), DType::kFloat32, nullptr, out, g.out_type, g.ldo,
                          g.M, g.N - col0, g.K};
    if (count == NV) {
      linear_rows<V, float, MR, NV>(args, buffer.data(), 0, g.M, 0);
    } else {
      for (int64_t v = 0; v < count; ++v) linear_rows<V, float, MR, 1>(args, buffer.data(), 0, g.M, v * L);
    }
  }
}

template <class V, int MR, int NV>
inline void quant_gemm_dispatch(const QuantLinearArgs& g, int64_t tile_begin, int64_t tile_end) {
  const bool offsets = g.offsets != nullptr;
  if (g.nibbles && offsets) return quant_gemm_columns<V, true, true, MR, NV>(g, tile_begin, tile_end);
  if (g.nibbles) return quant_gemm_columns<V, true, false, MR, NV>(g, tile_begin, tile_end);
  if (offsets) return quant_gemm_columns<V, false, true, MR, NV>(g, tile_begin, tile_end);
  return quant_gemm_columns<V, false, false, MR, NV>(g, tile_begin, tile_end);
}

template <class V, int MR, int NV>
inline void quant_dispatch(const QuantLinearArgs& g, int64_t tile_begin, int64_t tile_end) {
  const bool offsets = g.offsets != nullptr;
  if (g.nibbles && offsets) return quant_columns<V, true, true, MR, NV>(g, tile_begin, tile_end);
  if (g.nibbles) return quant_columns<V, true, false, MR, NV>(g, tile_begin, tile_end);
  if (offsets) return quant_columns<V, false, true, MR, NV>(g, tile_begin, tile_end);
  return quant_columns<V, false, false, MR, NV>(g, tile_begin, tile_end);
}

}  // namespace dpgate
