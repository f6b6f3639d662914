// Paged attention, one query at a time, batch invariant by construction.
//
// The rule: a query at position p of a sequence attends to that sequence's keys at positions
// lo..p (lo = 0, or p - window + 1 with a sliding window), read through its block table, and the
// computation is a function of those keys and the query alone:
//   score_j = hsum(lanes of the fma chain over d in groups of eight) * scale
//   m = max_j score_j;  e_j = exp(score_j - m);  s = sum_j e_j (eight lanes, then hsum)
//   out[d] = (fma chain over j = lo..p of e_j * v_j[d]) / s
// (hsum is vec.h's one tree). Heads sharing a kv head are computed together to share key and
// value reads; that changes which registers hold a chain, never the chain.
// With decode context parallelism (C ranks, interleave I) a rank sees only the keys it holds and
// also returns each query's natural-log LSE, m + log(s), for the combine (dcp.h); a rank that
// holds none of a query's keys returns zeros and LSE -inf.
// Nothing depends on the other queries of the step, on how many tokens the step or the query's
// own chunk holds, or on padding: a token gets the same attention output in a prefill chunk of
// any length and in a decode. Keys are visited in position order, eight per group from lo, and
// lanes past p hold -inf (so exp gives exact zeros).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "vec.h"

namespace dpgate {

// Query heads that share a kv head are computed together, so key and value rows are read once
// for several heads; each head's arithmetic is unchanged by that. The pass sizes keep every
// accumulator in one of AVX2's 16 registers: scores 2 heads x 4 keys, values 3 heads x 3 vectors.
constexpr int kScoreHeads = 2;
constexpr int kValueHeads = 3;
constexpr int kValueVectors = 3;

// Scores of heads h0..h0+HB-1 for keys first..first+7: four keys per pass (HB x 4 accumulators),
// each score hsum(eight-lane fma chain over d) written to scores[h * padded + first + l].
template <class V, class KV, int HB>
inline void score_keys(const float* q, const KV* const* key, int64_t D, int64_t h0, float* scores, int64_t padded,
                       int64_t first) {
  using reg = typename V::reg;
  constexpr int L = V::L;
  for (int half = 0; half < L; half += 4) {
    reg acc[HB][4];
    for (int h = 0; h < HB; ++h)
      for (int l = 0; l < 4; ++l) acc[h][l] = V::zero();
    for (int64_t d = 0; d < D; d += L) {
      reg qv[HB];
#pragma GCC unroll 3
      for (int h = 0; h < HB; ++h) qv[h] = V::load(q + (h0 + h) * D + d);
#pragma GCC unroll 4
      for (int l = 0; l < 4; ++l) {
        const reg k = V::load(key[half + l] + d);
#pragma GCC unroll 3
        for (int h = 0; h < HB; ++h) acc[h][l] = V::fma(qv[h], k, acc[h][l]);
      }
    }
#pragma GCC unroll 3
    for (int h = 0; h < HB; ++h) V::hsum4(acc[h], scores + (h0 + h) * padded + first + half);
  }
}

// out[h][d0 .. d0 + width * L) = (fma chain over the keys of e[h][i] * v_i[d]) / sum[h], for
// heads h0..h0+HB-1 and `width` (1..kValueVectors) vectors of L columns.
template <class V, class KV, int HB, int VW>
inline void weigh_values(const float* e, int64_t padded, const float* sums, const KV* values,
                         const int64_t* slots, int64_t n, int64_t D, int64_t d0, int64_t h0, float* out) {
  using reg = typename V::reg;
  constexpr int L = V::L;
  reg acc[HB][VW];
  for (int h = 0; h < HB; ++h)
    for (int c = 0; c < VW; ++c) acc[h][c] = V::zero();
  for (int64_t i = 0; i < n; ++i) {
    const KV* v = values + slots[i] * D + d0;
    reg w[HB];
#pragma GCC unroll 3
    for (int h = 0; h < HB; ++h) w[h] = V::set1(e[(h0 + h) * padded + i]);
#pragma GCC unroll 3
    for (int c = 0; c < VW; ++c) {
      const reg x = V::load(v + c * L);
#pragma GCC unroll 3
      for (int h = 0; h < HB; ++h) acc[h][c] = V::fma(w[h], x, acc[h][c]);
    }
  }
#pragma GCC unroll 3
  for (int h = 0; h < HB; ++h) {
    const reg sum = V::set1(sums[h0 + h]);
#pragma GCC unroll 3
    for (int c = 0; c < VW; ++c) V::store(out + (h0 + h) * D + d0 + c * L, V::div(acc[h][c], sum));
  }
}

// Every head of the group for columns d0 .. d0 + VW * L.
template <class V, class KV, int VW>
inline void weigh_values_all_heads(const float* e, int64_t padded, const float* sums, const KV* values,
                                   const int64_t* slots, int64_t n, int64_t D, int64_t d0, int64_t group,
                                   float* out) {
  int64_t h0 = 0;
  for (; h0 + kValueHeads <= group; h0 += kValueHeads)
    weigh_values<V, KV, kValueHeads, VW>(e, padded, sums, values, slots, n, D, d0, h0, out);
  if (group - h0 == 2) weigh_values<V, KV, 2, VW>(e, padded, sums, values, slots, n, D, d0, h0, out);
  if (group - h0 == 1) weigh_values<V, KV, 1, VW>(e, padded, sums, values, slots, n, D, d0, h0, out);
}

// The cache slots of the keys a query at `pos` sees on this rank, in position order: positions
// lo..pos, and with decode context parallelism only those this rank holds. Position p lives on
// DCP rank (p / I) % C, in the logical block p / (B * C) of the block table, at local offset
// ((p % (B * C)) / (I * C)) * I + p % I of that block's B slots here. Returns how many.
inline int64_t local_key_slots(const AttentionArgs& g, const int32_t* table, int64_t lo, int64_t pos,
                               std::vector<int64_t>& slots) {
  const int64_t B = g.block_size;
  if (g.dcp_size == 1) {  // every key is here: walk the block table, no division per key
    const int64_t n = pos - lo + 1;
    slots.resize(n);
    int64_t block = lo / B, offset = lo % B;
    for (int64_t i = 0; i < n; ++i) {
      slots[i] = int64_t(table[block]) * B + offset;
      if (++offset == B) offset = 0, ++block;
    }
    return n;
  }
  const int64_t C = g.dcp_size, I = g.interleave, logical = B * C;
  slots.clear();
  // Runs of I consecutive positions belong to one rank; this rank holds every C-th run.
  const int64_t first_run = lo / I;
  int64_t run = first_run + ((g.dcp_rank - first_run % C) % C + C) % C;
  for (; run * I <= pos; run += C) {
    const int64_t begin = std::max(lo, run * I), end = std::min(pos + 1, run * I + I);
    for (int64_t p = begin; p < end; ++p) {
      const int64_t o = p % logical;
      slots.push_back(int64_t(table[p / logical]) * B + (o / (I * C)) * I + o % I);
    }
  }
  return int64_t(slots.size());
}

template <class V, class Q, class KV>
inline void attention_query(const AttentionArgs& g, int64_t t, int64_t kv_head, std::vector<float>& scratch,
                            std::vector<int64_t>& slots, const KV* zero_key) {
  using reg = typename V::reg;
  constexpr int L = V::L;
  static_assert(L == 8, "attention's summation order is defined on eight lanes");
  const int64_t D = g.D, group = g.H / g.KVH;
  const int64_t pos = g.positions[t];
  const int64_t lo = g.window > 0 ? std::max<int64_t>(0, pos - g.window + 1) : 0;
  const int32_t* table = g.block_tables + int64_t(g.token_seq[t]) * g.table_stride;
  const int64_t n = local_key_slots(g, table, lo, pos, slots);
  const int64_t padded = (n + L - 1) / L * L;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (n == 0) {  // an empty shard: LSE -inf and zeros, which the combine skips
    Q* result = static_cast<Q*>(g.out) + (t * g.H + kv_head * group) * D;
    for (int64_t i = 0; i < group * D; ++i) result[i] = Q(0);
    if (g.lse != nullptr)
      for (int64_t h = 0; h < group; ++h) g.lse[t * g.H + kv_head * group + h] = neg_inf;
    return;
  }
  scratch.resize(group * (2 * D + padded + 1));
  float* q = scratch.data();              // [group, D] float32
  float* scores = q + group * D;          // [group, padded]: scores, then their exponentials
  float* sums = scores + group * padded;  // [group]
  float* out = sums + group;              // [group, D] float32
  const Q* q_in = static_cast<const Q*>(g.q) + (t * g.H + kv_head * group) * D;
  for (int64_t i = 0; i < group * D; ++i) {
    if constexpr (std::is_same_v<Q, float>) q[i] = q_in[i];
    else q[i] = bf16_to_float(q_in[i]);
  }
  const KV* keys = static_cast<const KV*>(g.key_cache) + kv_head * g.num_slots * D;
  const KV* values = static_cast<const KV*>(g.value_cache) + kv_head * g.num_slots * D;

  // Scores, eight keys at a time: hsum(...) * scale; lanes past the query's position become -inf.
  reg lane_offsets;
  {
    float offsets[L];
    for (int l = 0; l < L; ++l) offsets[l] = float(l);
    lane_offsets = V::load(offsets);
  }
  const reg scale = V::set1(g.scale);
  for (int64_t first = 0; first < padded; first += L) {
    const KV* key[L];
    for (int l = 0; l < L; ++l) key[l] = first + l < n ? keys + slots[first + l] * D : zero_key;
    int64_t h0 = 0;
    for (; h0 + kScoreHeads <= group; h0 += kScoreHeads)
      score_keys<V, KV, kScoreHeads>(q, key, D, h0, scores, padded, first);
    if (group - h0 == 1) score_keys<V, KV, 1>(q, key, D, h0, scores, padded, first);
    // remaining[l] = n - 1 - (first + l): negative for lanes past the query.
    const reg remaining = V::sub(V::set1(float(n - 1 - first)), lane_offsets);
    for (int64_t h = 0; h < group; ++h) {
      float* s = scores + h * padded + first;
      V::store(s, V::replace_below(remaining, 0.0f, neg_inf, V::mul(V::load(s), scale)));
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
    sums[h] = V::hsum(total);
    if (g.lse != nullptr) g.lse[t * g.H + kv_head * group + h] = V::hmax(running) + std::log(sums[h]);
  }

  for (int64_t d0 = 0; d0 < D; d0 += kValueVectors * L) {
    const int64_t width = std::min<int64_t>(kValueVectors * L, D - d0) / L;
    const int64_t* at = slots.data();
    if (width == 3) weigh_values_all_heads<V, KV, 3>(scores, padded, sums, values, at, n, D, d0, group, out);
    if (width == 2) weigh_values_all_heads<V, KV, 2>(scores, padded, sums, values, at, n, D, d0, group, out);
    if (width == 1) weigh_values_all_heads<V, KV, 1>(scores, padded, sums, values, at, n, D, d0, group, out);
  }
  Q* result = static_cast<Q*>(g.out) + (t * g.H + kv_head * group) * D;
  for (int64_t i = 0; i < group * D; i += L) V::store(result + i, V::load(out + i));
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
