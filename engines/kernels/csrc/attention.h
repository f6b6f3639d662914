// Paged attention, one query at a time, batch invariant by construction.
//
// The rule: a query at position p of a sequence attends to that sequence's keys at positions
// lo..p (lo = 0, or p - window + 1 with a sliding window), read through its block table, and the
// computation is a function of those keys and the query alone:
//   score_j = hsum(lanes of the fma chain over d in groups of eight) * scale
//   m = max_j score_j;  e_j = exp(score_j - m);  s = sum_j e_j (eight lanes, then hsum)
//   out[d] = (fma chain over j = lo..p of e_j * v_j[d]) / s
// Nothing depends on the other queries of the step, on how many tokens the step or the query's
// own chunk holds, or on padding: a token gets the same attention output in a prefill chunk of
// any length and in a decode. Keys are visited in position order, eight per group from lo, and
// lanes past p hold -inf (so exp gives exact zeros).
#pragma once

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "vec.h"

namespace dpgate {

template <class V, class Q, class KV>
inline void attention_query(const AttentionArgs& g, int64_t t, int64_t kv_head, std::vector<float>& scratch,
                            std::vector<int64_t>& slots, const KV* zero_key) {
  using reg = typename V::reg;
  constexpr int L = V::L;
  static_assert(L == 8, "attention's summation order is defined on eight lanes");
  const int64_t D = g.D, group = g.H / g.KVH;
  const int64_t pos = g.positions[t];
  const int64_t lo = g.window > 0 ? std::max<int64_t>(0, pos - g.window + 1) : 0;
  const int64_t n = pos - lo + 1;
  const int64_t padded = (n + L - 1) / L * L;
  const int32_t* table = g.block_tables + int64_t(g.token_seq[t]) * g.table_stride;

  slots.resize(n);
  {  // slot of each visible key, walking the block table (one division per query, not per key)
    int64_t block = lo / g.block_size, offset = lo % g.block_size;
    for (int64_t i = 0; i < n; ++i) {
      slots[i] = int64_t(table[block]) * g.block_size + offset;
      if (++offset == g.block_size) offset = 0, ++block;
    }
  }
  scratch.resize(group * (D + padded));
  float* q = scratch.data();                // [group, D] float32
  float* scores = q + group * D;            // [group, padded]
  const Q* q_in = static_cast<const Q*>(g.q) + (t * g.H + kv_head * group) * D;
  for (int64_t i = 0; i < group * D; ++i) {
    if constexpr (std::is_same_v<Q, float>) q[i] = q_in[i];
    else q[i] = bf16_to_float(q_in[i]);
  }
  const KV* keys = static_cast<const KV*>(g.key_cache) + kv_head * g.num_slots * D;
  const KV* values = static_cast<const KV*>(g.value_cache) + kv_head * g.num_slots * D;

  // Scores, eight keys at a time; lanes past the query's position become -inf.
  reg lane_offsets;
  {
    float offsets[L];
    for (int l = 0; l < L; ++l) offsets[l] = float(l);
    lane_offsets = V::load(offsets);
  }
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t first = 0; first < padded; first += L) {
    const KV* key[L];
    for (int l = 0; l < L; ++l) key[l] = first + l < n ? keys + slots[first + l] * D : zero_key;
    // remaining[l] = n - 1 - (first + l): negative for lanes past the query.
    const reg remaining = V::sub(V::set1(float(n - 1 - first)), lane_offsets);
    for (int64_t h = 0; h < group; ++h) {
      reg acc[L];
      for (int l = 0; l < L; ++l) acc[l] = V::zero();
      for (int64_t d = 0; d < D; d += L) {
        const reg qv = V::load(q + h * D + d);
#pragma GCC unroll 8
        for (int l = 0; l < L; ++l) acc[l] = V::fma(qv, V::load(key[l] + d), acc[l]);
      }
      reg s = V::mul(V::hsum8(acc), V::set1(g.scale));
      V::store(scores + h * padded + first, V::replace_below(remaining, 0.0f, neg_inf, s));
    }
  }

  for (int64_t h = 0; h < group; ++h) {
    float* e = scores + h * padded;
    reg running = V::set1(neg_inf);
    for (int64_t i = 0; i < padded; i += L) running = V::max(running, V::load(e + i));
    const reg m = V::set1(V::hmax(running));
    reg total = V::zero();
    for (int64_t i = 0; i < padded; i += L) {
      const reg w = exp<V>(V::sub(V::load(e + i), m));
      V::store(e + i, w);
      total = V::add(total, w);
    }
    const reg sum = V::set1(V::hsum(total));

    Q* out = static_cast<Q*>(g.out) + (t * g.H + kv_head * group + h) * D;
    for (int64_t d0 = 0; d0 < D; d0 += 8 * L) {
      const int64_t width = std::min<int64_t>(8 * L, D - d0) / L;  // vectors in this pass
      reg acc[8];
      for (int c = 0; c < 8; ++c) acc[c] = V::zero();
      for (int64_t i = 0; i < n; ++i) {
        const reg w = V::set1(e[i]);
        const KV* v = values + slots[i] * D + d0;
        if (width == 8) {
#pragma GCC unroll 8
          for (int c = 0; c < 8; ++c) acc[c] = V::fma(w, V::load(v + c * L), acc[c]);
        } else {
          for (int c = 0; c < width; ++c) acc[c] = V::fma(w, V::load(v + c * L), acc[c]);
        }
      }
      for (int c = 0; c < width; ++c) V::store(out + d0 + c * L, V::div(acc[c], sum));
    }
  }
}

// Items are (query, kv head) pairs, item = t * KVH + kv_head; this call takes item_begin,
// item_begin + item_step, ... below item_end (a strided share balances long and short queries).
template <class V, class Q, class KV>
inline void attention_items(const AttentionArgs& g, int64_t item_begin, int64_t item_end, int64_t item_step) {
  std::vector<float> scratch;
  std::vector<int64_t> slots;
  std::vector<KV> zero_key(g.D, KV(0));
  for (int64_t item = item_begin; item < item_end; item += item_step) {
    attention_query<V, Q, KV>(g, item / g.KVH, item % g.KVH, scratch, slots, zero_key.data());
  }
}

template <class V>
inline void attention_dispatch(const AttentionArgs& g, int64_t item_begin, int64_t item_end, int64_t item_step) {
  const bool q32 = g.act_type == DType::kFloat32, kv32 = g.cache_type == DType::kFloat32;
  if (q32 && kv32) return attention_items<V, float, float>(g, item_begin, item_end, item_step);
  if (q32) return attention_items<V, float, bf16_t>(g, item_begin, item_end, item_step);
  if (kv32) return attention_items<V, bf16_t, float>(g, item_begin, item_end, item_step);
  return attention_items<V, bf16_t, bf16_t>(g, item_begin, item_end, item_step);
}

}  // namespace dpgate
