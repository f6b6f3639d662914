// The decode-context-parallel combine: C ranks each attended a query over the keys they hold and
// returned a normalized output o_n and its natural-log LSE lse_n. For each (query, head):
//   M = max_n lse_n (0 if every lse_n is -inf);  w_n = exp(lse_n - M);  S = sum_n w_n
//   out = sum_n (w_n / S) o_n, skipping n with w_n == 0;  lse = M + log S
// in rank order n = 0..C-1, the sum over n as one FMA chain per element. A rank whose lse is -inf
// (it holds none of the query's keys) has w_n == 0 exactly, and its o_n is never read: a sender
// that has no keys for a row sends no payload for it, and whatever its slot holds stays unread.
#pragma once

#include <cmath>
#include <limits>

#include "kernels.h"
#include "vec.h"

namespace dpgate {

// One lane of the vector exponential, so every instruction set gives the same weights.
inline float exp_one(float x) { return exp<Scalar8>(Scalar8::set1(x)).v[0]; }

template <class V>
inline void dcp_combine_rows(const CombineArgs& g, int64_t row_begin, int64_t row_end) {
  using reg = typename V::reg;
  constexpr int L = V::L;
  constexpr int kMaxRanks = 64;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t row = row_begin; row < row_end; ++row) {  // row = t * heads + h
    const int64_t t = row / g.heads, h = row % g.heads;
    float weights[kMaxRanks];
    float m = neg_inf;
    for (int64_t n = 0; n < g.C; ++n) {
      const float lse = g.lses[(n * g.slot_tokens + t) * g.slot_heads + g.head_offset + h];
      weights[n] = lse;
      m = lse > m ? lse : m;
    }
    if (m == neg_inf) m = 0.0f;
    float total = 0.0f;
    for (int64_t n = 0; n < g.C; ++n) {
      weights[n] = weights[n] == neg_inf ? 0.0f : exp_one(weights[n] - m);
      total += weights[n];
    }
    float* out = g.out + row * g.D;
    for (int64_t d = 0; d < g.D; d += L) V::store(out + d, V::zero());
    if (total > 0.0f) {
      for (int64_t n = 0; n < g.C; ++n) {
        if (weights[n] == 0.0f) continue;  // an empty shard: its payload is never read
        const reg w = V::set1(weights[n] / total);
        const float* o = g.outs + ((n * g.slot_tokens + t) * g.slot_heads + g.head_offset + h) * g.D;
        for (int64_t d = 0; d < g.D; d += L) V::store(out + d, V::fma(w, V::load(o + d), V::load(out + d)));
      }
    }
    g.lse[row] = total > 0.0f ? m + std::log(total) : neg_inf;
  }
}

}  // namespace dpgate
