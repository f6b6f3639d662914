// y = x @ W.T (times a per-column scale for int8 weights), batch invariant by construction.
//
// The rule: every output element is one chain of fused multiply-adds over k = 0, 1, ..., K-1,
// starting from 0, then multiplied by its column's scale:
//     acc = 0; for k: acc = fma(x[m][k], w[n][k], acc); y[m][n] = acc * scale[n]
// The kernel computes many elements at once (register tiles of rows x columns, the columns in
// vector lanes), but no element's chain is ever split or reordered, so the result of a row does
// not depend on how many rows there are, how the output was tiled, how many lanes a register
// has, or which thread computed it. int8 and bfloat16 weights convert to float32 exactly.
#pragma once

#include <algorithm>
#include <type_traits>
#include <utility>

#include "kernels.h"
#include "vec.h"

namespace dpgate {

// Stores the lanes of y that fall inside the output's `available` columns (all, some or none).
template <class V>
inline void store_output(const LinearArgs& g, typename V::reg y, int64_t offset, int64_t available) {
  constexpr int L = V::L;
  if (available >= L) {
    if (g.out_type == DType::kFloat32) V::store(static_cast<float*>(g.out) + offset, y);
    else V::store(static_cast<bf16_t*>(g.out) + offset, y);
    return;
  }
  float lanes[L];
  V::store(lanes, y);
  for (int64_t l = 0; l < available; ++l) {
    if (g.out_type == DType::kFloat32) static_cast<float*>(g.out)[offset + l] = lanes[l];
    else static_cast<bf16_t*>(g.out)[offset + l] = float_to_bf16(lanes[l]);
  }
}

// An MR x NV tile of float32 accumulators stored at rows row0.., columns col0.. of `out`.
template <class V, int MR, int NV>
inline void store_tile(const LinearArgs& out, const typename V::reg (&acc)[MR][NV], int64_t row0, int64_t col0) {
#pragma GCC unroll 16
  for (int j = 0; j < NV; ++j) {
    const int64_t c = col0 + int64_t(j) * V::L;
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) store_output<V>(out, acc[i][j], (row0 + i) * out.ldo + c, out.N - c);
  }
}

// The output of a kernel whose arguments are not LinearArgs (quant_linear.h, int_linear.h), for store_tile.
template <class Args>
inline LinearArgs output_of(const Args& g) {
  return LinearArgs{nullptr, 0, nullptr, DType::kFloat32, nullptr, g.out, g.out_type, g.ldo, g.M, g.N, g.K};
}

// Rows in blocks of whole MR-row tiles whose activations (`row_bytes` each) fit `cache_bytes`.
template <int MR>
inline int64_t rows_in_cache(int64_t cache_bytes, int64_t row_bytes) {
  return std::max<int64_t>(MR, (cache_bytes / std::max<int64_t>(1, row_bytes)) / MR * MR);
}

// Every kernel's walk over its column tiles tile_begin..tile_end (NV vectors of L columns each),
// the rows in blocks of `row_block` so that a block's activations stay in cache while every tile
// reads them: rows(nv, row0, row1, col0) computes rows row0..row1 of the nv vectors from col0,
// with nv a std::integral_constant (NV for a whole tile, 1 for each vector of the last, short one).
template <int L, int NV, class Rows>
inline void walk_column_tiles(int64_t M, int64_t N, int64_t row_block, int64_t tile_begin, int64_t tile_end,
                              Rows&& rows) {
  const int64_t num_vectors = (N + L - 1) / L;
  for (int64_t row0 = 0; row0 < M; row0 += row_block) {
    const int64_t row1 = std::min(M, row0 + row_block);
    for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
      const int64_t first = tile * NV;
      const int64_t count = std::min<int64_t>(NV, num_vectors - first);
      if (count == NV) {
        rows(std::integral_constant<int, NV>{}, row0, row1, first * L);
      } else {
        for (int64_t v = first; v < first + count; ++v) rows(std::integral_constant<int, 1>{}, row0, row1, v * L);
      }
    }
  }
}

template <class V, class W, int MR, int NV>
inline void linear_tile(const LinearArgs& g, const W* weight, int64_t row0, int64_t col0) {
  using reg = typename V::reg;
  constexpr int L = V::L;
  const int64_t K = g.K;
  const W* columns[NV];
  for (int j = 0; j < NV; ++j) {
    const int64_t c = col0 + int64_t(j) * L;
    columns[j] = weight + (c / kPanelWidth) * K * kPanelWidth + (c % kPanelWidth);
  }
  const float* rows[MR];
  for (int i = 0; i < MR; ++i) rows[i] = g.a + (row0 + i) * g.lda;

  reg acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) acc[i][j] = V::zero();
  for (int64_t k = 0; k < K; ++k) {
    reg w[NV];
#pragma GCC unroll 16
    for (int j = 0; j < NV; ++j) w[j] = V::load(columns[j] + k * kPanelWidth);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const reg x = V::set1(rows[i][k]);
#pragma GCC unroll 16
      for (int j = 0; j < NV; ++j) acc[i][j] = V::fma(x, w[j], acc[i][j]);
    }
  }

  // Every index below is a constant after unrolling, so the accumulators stay in registers.
#pragma GCC unroll 16
  for (int j = 0; j < NV; ++j) {
    const int64_t c = col0 + int64_t(j) * L;
    const reg scale = g.scales != nullptr ? V::load(g.scales + c) : V::set1(1.0f);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const reg y = g.scales != nullptr ? V::mul(acc[i][j], scale) : acc[i][j];
      store_output<V>(g, y, (row0 + i) * g.ldo + c, g.N - c);
    }
  }
}

// Rows row_begin..row_end of one column tile of NV vectors: full tiles of MR rows, then the rest.
template <class V, class W, int MR, int NV>
inline void linear_rows(const LinearArgs& g, const W* weight, int64_t row_begin, int64_t row_end, int64_t col0) {
  int64_t row = row_begin;
  for (; row + MR <= row_end; row += MR) linear_tile<V, W, MR, NV>(g, weight, row, col0);
  if constexpr (MR > 1) {
    const int64_t rest = row_end - row;
    if (rest > 0) {
      // One smaller tile for the remaining rows (same chains, fewer of them).
      [&]<int... R>(std::integer_sequence<int, R...>) {
        ((rest == R + 1 ? linear_tile<V, W, R + 1, NV>(g, weight, row, col0) : void()), ...);
      }(std::make_integer_sequence<int, MR - 1>{});
    }
  }
}

template <class V, class W, int MR, int NV>
inline void linear_columns(const LinearArgs& g, int64_t tile_begin, int64_t tile_end) {
  const W* weight = static_cast<const W*>(g.weight);
  walk_column_tiles<V::L, NV>(g.M, g.N, rows_in_cache<MR>(192 * 1024, g.K * 4), tile_begin, tile_end,
                              [&](auto nv, int64_t row0, int64_t row1, int64_t col0) {
                                linear_rows<V, W, MR, decltype(nv)::value>(g, weight, row0, row1, col0);
                              });
}

template <class V, int MR, int NV>
inline void linear_dispatch(const LinearArgs& g, int64_t tile_begin, int64_t tile_end) {
  switch (g.weight_type) {
    case DType::kInt8: return linear_columns<V, int8_t, MR, NV>(g, tile_begin, tile_end);
    case DType::kBFloat16: return linear_columns<V, bf16_t, MR, NV>(g, tile_begin, tile_end);
    case DType::kFloat32: return linear_columns<V, float, MR, NV>(g, tile_begin, tile_end);
  }
}

}  // namespace dpgate
