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
//
// How the work is scheduled is free, and chosen for speed: each instruction set cuts it into
// register tiles of its own (AttentionTiles; AVX-512 holds the value sums in sixteen lanes, which
// a per-column chain does not see), and the kernel is mostly waiting on memory (a decode reads
// every cached key and value once, from 4 KB blocks scattered over the cache), so it prefetches:
// keys a little ahead of the scores (and farther ahead into L2 where they are not there yet),
// each key's value row into L2 while its score is computed, and the next item's keys into L2
// while this item's values are summed.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "vec.h"

namespace dpgate {

// Rows about this many bytes ahead of the key (or value) being read are brought into L1 (a
// quarter of its 32 KB). The cache's blocks are scattered (a kv head's block of 16 float32 rows of
// 64 is one 4 KB page) and the hardware prefetchers stop at page boundaries, so without this each
// new block's first loads would wait on memory.
constexpr int64_t kPrefetchBytes = 8192;

template <class KV>
constexpr int64_t rows_ahead(int64_t D) {
  return std::max<int64_t>(1, kPrefetchBytes / (D * int64_t(sizeof(KV))));
}

// Every cache line of a row of D elements, into L1 (Level 3) or L2 (Level 2).
template <int Level, class KV>
DPGATE_INLINE void prefetch_row(const KV* row, int64_t D) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < D * int64_t(sizeof(KV)); b += 64) __builtin_prefetch(bytes + b, 0, Level);
}

// Rows base + slots[i] * D, i < n, to bring in ahead of their use (none by default).
template <class KV>
struct RowsAhead {
  const KV* base = nullptr;
  const int64_t* slots = nullptr;
  int64_t n = 0;
};

// Scores of heads h0..h0+HB-1 for keys first..first+7: SK keys per pass (HB x SK accumulators),
// each score hsum(eight-lane fma chain over d) written to scores[h * padded + first + l].
template <class V, class KV, int HB, int SK>
inline void score_keys(const float* q, const KV* const* key, int64_t D, int64_t h0, float* scores, int64_t padded,
                       int64_t first) {
  using reg = typename V::reg;
  constexpr int L = V::L;
  static_assert(SK == 4 || SK == 8, "a pass scores four or eight keys");
  for (int half = 0; half < L; half += SK) {
    reg acc[HB][SK];
    for (int h = 0; h < HB; ++h)
      for (int l = 0; l < SK; ++l) acc[h][l] = V::zero();
    for (int64_t d = 0; d < D; d += L) {
      reg qv[HB];
#pragma GCC unroll 4
      for (int h = 0; h < HB; ++h) qv[h] = V::load(q + (h0 + h) * D + d);
#pragma GCC unroll 8
      for (int l = 0; l < SK; ++l) {
        const reg k = V::load(key[half + l] + d);
#pragma GCC unroll 4
        for (int h = 0; h < HB; ++h) acc[h][l] = V::fma(qv[h], k, acc[h][l]);
      }
    }
#pragma GCC unroll 4
    for (int h = 0; h < HB; ++h) {
      float* out = scores + (h0 + h) * padded + first + half;
      if constexpr (SK == 4) V::hsum4(acc[h], out);
      else V::store(out, V::hsum8(acc[h]));
    }
  }
}

// acc[h][d0 .. d0 + VW * W::L) = fma chain over the keys of e[h][i] * v_i[d], for heads
// h0..h0+HB-1, written to out (the division by the sum follows, in attention_query). W may be
// wider than eight lanes: each column's chain is its own, so the lane count does not touch it.
// Row i of `ahead` is brought into L2 beside value row i.
template <class W, class KV, int HB, int VW>
inline void weigh_values(const float* e, int64_t padded, const KV* values, const int64_t* slots, int64_t n,
                         int64_t D, int64_t d0, int64_t h0, float* out, const RowsAhead<KV>& ahead) {
  using reg = typename W::reg;
  constexpr int L = W::L;
  const int64_t ahead_rows = rows_ahead<KV>(D);
  reg acc[HB][VW];
  for (int h = 0; h < HB; ++h)
    for (int c = 0; c < VW; ++c) acc[h][c] = W::zero();
  for (int64_t i = 0; i < n; ++i) {
    // The first column pass brings whole rows in; later passes find them in cache.
    if (d0 == 0 && i + ahead_rows < n) prefetch_row<3>(values + slots[i + ahead_rows] * D, D);
    if (i < ahead.n) prefetch_row<2>(ahead.base + ahead.slots[i] * D, D);
    const KV* v = values + slots[i] * D + d0;
    reg w[HB];
#pragma GCC unroll 4
    for (int h = 0; h < HB; ++h) w[h] = W::set1(e[(h0 + h) * padded + i]);
#pragma GCC unroll 8
    for (int c = 0; c < VW; ++c) {
      const reg x = W::load(v + c * L);
#pragma GCC unroll 4
      for (int h = 0; h < HB; ++h) acc[h][c] = W::fma(w[h], x, acc[h][c]);
    }
  }
#pragma GCC unroll 4
  for (int h = 0; h < HB; ++h)
#pragma GCC unroll 8
    for (int c = 0; c < VW; ++c) W::store(out + (h0 + h) * D + d0 + c * L, acc[h][c]);
}

// Every head of the group, HB (at most 3) at a time, for columns d0 .. d0 + VW * W::L; the
// first pass brings `ahead` in.
template <class W, class KV, int HB, int VW>
inline void weigh_values_all_heads(const float* e, int64_t padded, const KV* values, const int64_t* slots,
                                   int64_t n, int64_t D, int64_t d0, int64_t group, float* out,
                                   const RowsAhead<KV>& ahead) {
  static_assert(HB >= 1 && HB <= 3, "passes of one to three heads");
  const RowsAhead<KV> none;
  int64_t h0 = 0;
  for (; h0 + HB <= group; h0 += HB)
    weigh_values<W, KV, HB, VW>(e, padded, values, slots, n, D, d0, h0, out, h0 == 0 ? ahead : none);
  const RowsAhead<KV>& rest = h0 == 0 ? ahead : none;
  if constexpr (HB == 3)
    if (group - h0 == 2) weigh_values<W, KV, 2, VW>(e, padded, values, slots, n, D, d0, h0, out, rest);
  if constexpr (HB >= 2)
    if (group - h0 == 1) weigh_values<W, KV, 1, VW>(e, padded, values, slots, n, D, d0, h0, out, rest);
}

// Columns d0 .. d0 + width * W::L for 1 <= width <= VW.
template <class W, class KV, int HB, int VW>
inline void weigh_columns(int64_t width, const float* e, int64_t padded, const KV* values, const int64_t* slots,
                          int64_t n, int64_t D, int64_t d0, int64_t group, float* out, const RowsAhead<KV>& ahead) {
  if (width == VW)
    return weigh_values_all_heads<W, KV, HB, VW>(e, padded, values, slots, n, D, d0, group, out, ahead);
  if constexpr (VW > 1)
    weigh_columns<W, KV, HB, VW - 1>(width, e, padded, values, slots, n, D, d0, group, out, ahead);
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

// How one instruction set cuts the work into register-sized passes: V (eight lanes) scores, takes
// the softmax and divides; W (eight or sixteen lanes) holds the value accumulators. Passes of
// SH heads x SK keys for the scores and VH heads x VV vectors of W for the values, each pass's
// accumulators in registers. None of this changes a chain, only which registers hold it.
template <class V_, class W_, int SH, int SK, int VH, int VV>
struct AttentionTiles {
  using V = V_;
  using W = W_;
  static constexpr int score_heads = SH, score_keys = SK, value_heads = VH, value_vectors = VV;
  static_assert(V_::L == 8, "attention's summation order is defined on eight lanes");
  static_assert(W_::L % 8 == 0 && SH >= 1 && SH <= 3 && VH >= 1 && VH <= 3 && VV >= 1, "unsupported tiles");
};

// The slots of item = t * KVH + kv_head's keys (local_key_slots for query t); returns how many.
inline int64_t item_key_slots(const AttentionArgs& g, int64_t item, std::vector<int64_t>& slots) {
  const int64_t t = item / g.KVH, pos = g.positions[t];
  const int64_t lo = g.window > 0 ? std::max<int64_t>(0, pos - g.window + 1) : 0;
  return local_key_slots(g, g.block_tables + int64_t(g.token_seq[t]) * g.table_stride, lo, pos, slots);
}

template <class KV>
inline const KV* kv_head_rows(const void* cache, const AttentionArgs& g, int64_t kv_head) {
  return static_cast<const KV*>(cache) + kv_head * g.num_slots * g.D;
}

// Query t's heads of kv head `kv_head` over its n keys at `slots`; `next_keys` are brought into L2
// on the way (the next item's, so its scores do not start by waiting on memory). The first
// keys_in_l2 keys were brought in that way by the item before; the rest are, farther ahead.
template <class Tiles, class Q, class KV>
inline void attention_query(const AttentionArgs& g, int64_t t, int64_t kv_head, const int64_t* slots, int64_t n,
                            std::vector<float>& scratch, const RowsAhead<KV>& next_keys, int64_t keys_in_l2) {
  using V = typename Tiles::V;
  using W = typename Tiles::W;
  using reg = typename V::reg;
  constexpr int L = V::L, SH = Tiles::score_heads, SK = Tiles::score_keys;
  constexpr int VH = Tiles::value_heads, VV = Tiles::value_vectors;
  const int64_t D = g.D, group = g.H / g.KVH;
  const int64_t padded = (n + L - 1) / L * L;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  Q* result = static_cast<Q*>(g.out) + (t * g.H + kv_head * group) * D;
  if (n == 0) {  // an empty shard: LSE -inf and zeros, which the combine skips
    for (int64_t i = 0; i < group * D; ++i) result[i] = Q(0);
    if (g.lse != nullptr)
      for (int64_t h = 0; h < group; ++h) g.lse[t * g.H + kv_head * group + h] = neg_inf;
    return;
  }
  const KV* keys = kv_head_rows<KV>(g.key_cache, g, kv_head);
  const KV* values = kv_head_rows<KV>(g.value_cache, g, kv_head);
  const int64_t ahead_rows = rows_ahead<KV>(D);
  for (int64_t i = 0; i < std::min(n, ahead_rows); ++i) prefetch_row<3>(keys + slots[i] * D, D);
  scratch.resize(group * (2 * D + padded + 1));
  float* q = scratch.data();              // [group, D] float32
  float* scores = q + group * D;          // [group, padded]: scores, then their exponentials
  float* sums = scores + group * padded;  // [group]
  float* out = sums + group;              // [group, D] float32: the value sums, undivided
  const Q* q_in = static_cast<const Q*>(g.q) + (t * g.H + kv_head * group) * D;
  for (int64_t i = 0; i < group * D; ++i) {
    if constexpr (std::is_same_v<Q, float>) q[i] = q_in[i];
    else q[i] = bf16_to_float(q_in[i]);
  }

  // Scores, eight keys at a time: hsum(...) * scale; lanes past the query's position become -inf
  // (whatever key they read: the last one stands in, so no lane reads outside the cache).
  reg lane_offsets;
  {
    float offsets[L];
    for (int l = 0; l < L; ++l) offsets[l] = float(l);
    lane_offsets = V::load(offsets);
  }
  const reg scale = V::set1(g.scale);
  for (int64_t first = 0; first < padded; first += L) {
    const int64_t last = std::min(n, first + L);
    for (int64_t i = first + ahead_rows; i < std::min(n, last + ahead_rows); ++i)
      prefetch_row<3>(keys + slots[i] * D, D);
    for (int64_t i = std::max(keys_in_l2, first + 4 * ahead_rows); i < std::min(n, last + 4 * ahead_rows); ++i)
      prefetch_row<2>(keys + slots[i] * D, D);
    for (int64_t i = first; i < last; ++i) prefetch_row<2>(values + slots[i] * D, D);
    const KV* key[L];
    for (int l = 0; l < L; ++l) key[l] = keys + slots[std::min(first + l, n - 1)] * D;
    int64_t h0 = 0;
    for (; h0 + SH <= group; h0 += SH) score_keys<V, KV, SH, SK>(q, key, D, h0, scores, padded, first);
    if constexpr (SH == 3)
      if (group - h0 == 2) score_keys<V, KV, 2, SK>(q, key, D, h0, scores, padded, first);
    if constexpr (SH >= 2)
      if (group - h0 == 1) score_keys<V, KV, 1, SK>(q, key, D, h0, scores, padded, first);
    // remaining[l] = n - 1 - (first + l): negative for lanes past the query.
    const reg remaining = V::sub(V::set1(float(n - 1 - first)), lane_offsets);
    for (int64_t h = 0; h < group; ++h) {
      float* s = scores + h * padded + first;
      V::store(s, V::replace_below(remaining, 0.0f, neg_inf, V::mul(V::load(s), scale)));
    }
  }
  for (int64_t i = 0; i < std::min(n, ahead_rows); ++i) prefetch_row<3>(values + slots[i] * D, D);

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

  // Values in column passes of VV vectors of W, then narrower ones for what is left; the first
  // pass brings the next item's keys in.
  constexpr int64_t pass = VV * W::L;
  int64_t d0 = 0;
  for (; d0 + pass <= D; d0 += pass)
    weigh_values_all_heads<W, KV, VH, VV>(scores, padded, values, slots, n, D, d0, group, out,
                                          d0 == 0 ? next_keys : RowsAhead<KV>{});
  if (D - d0 >= W::L) {
    const int64_t width = (D - d0) / W::L;
    weigh_columns<W, KV, VH, VV>(width, scores, padded, values, slots, n, D, d0, group, out,
                                 d0 == 0 ? next_keys : RowsAhead<KV>{});
    d0 += width * W::L;
  }
  if constexpr (W::L > L)
    for (; d0 < D; d0 += L)
      weigh_values_all_heads<V, KV, VH, 1>(scores, padded, values, slots, n, D, d0, group, out,
                                           d0 == 0 ? next_keys : RowsAhead<KV>{});
  for (int64_t h = 0; h < group; ++h) {
    const reg sum = V::set1(sums[h]);
    for (int64_t i = h * D; i < (h + 1) * D; i += L) V::store(result + i, V::div(V::load(out + i), sum));
  }
}

// Per thread and reused across calls, so a warm call allocates nothing.
struct AttentionScratch {
  std::vector<float> floats;
  std::vector<int64_t> slots, next_slots;
};

// Items are (query, kv head) pairs, item = t * KVH + kv_head; this call takes item_begin,
// item_begin + item_step, ... below item_end (a strided share balances long and short queries).
template <class Tiles, class Q, class KV>
inline void attention_items(const AttentionArgs& g, int64_t item_begin, int64_t item_end, int64_t item_step) {
  thread_local AttentionScratch scratch;
  if (item_begin >= item_end) return;
  int64_t n = item_key_slots(g, item_begin, scratch.slots), keys_in_l2 = 0;
  for (int64_t i = 0; i < std::min(n, 4 * rows_ahead<KV>(g.D)); ++i)
    prefetch_row<2>(kv_head_rows<KV>(g.key_cache, g, item_begin % g.KVH) + scratch.slots[i] * g.D, g.D);
  for (int64_t item = item_begin; item < item_end; item += item_step) {
    const int64_t next = item + item_step;
    RowsAhead<KV> next_keys;
    int64_t next_n = 0;
    if (next < item_end) {
      next_n = item_key_slots(g, next, scratch.next_slots);
      next_keys = {kv_head_rows<KV>(g.key_cache, g, next % g.KVH), scratch.next_slots.data(), next_n};
    }
    attention_query<Tiles, Q, KV>(g, item / g.KVH, item % g.KVH, scratch.slots.data(), n, scratch.floats,
                                  next_keys, keys_in_l2);
    std::swap(scratch.slots, scratch.next_slots);
    keys_in_l2 = std::min(n, next_n);  // the value pass brought that many of the next keys in
    n = next_n;
  }
}

template <class Tiles>
inline void attention_dispatch(const AttentionArgs& g, int64_t item_begin, int64_t item_end, int64_t item_step) {
  const bool q32 = g.act_type == DType::kFloat32, kv32 = g.cache_type == DType::kFloat32;
  if (q32 && kv32) return attention_items<Tiles, float, float>(g, item_begin, item_end, item_step);
  if (q32) return attention_items<Tiles, float, bf16_t>(g, item_begin, item_end, item_step);
  if (kv32) return attention_items<Tiles, bf16_t, float>(g, item_begin, item_end, item_step);
  return attention_items<Tiles, bf16_t, bf16_t>(g, item_begin, item_end, item_step);
}

}  // namespace dpgate
