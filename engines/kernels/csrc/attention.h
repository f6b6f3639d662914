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
// A chain may be cut into key ranges [i0, n): `resume` carries on from the sums in out (float32
// stores and loads are exact, so the pieces make the one chain).
template <class W, class KV, int HB, int VW>
inline void weigh_values(const float* e, int64_t padded, const KV* values, const int64_t* slots, int64_t i0,
                         int64_t n, bool resume, int64_t D, int64_t d0, int64_t h0, float* out,
                         const RowsAhead<KV>& ahead) {
  using reg = typename W::reg;
  constexpr int L = W::L;
  const int64_t ahead_rows = rows_ahead<KV>(D);
  reg acc[HB][VW];
  for (int h = 0; h < HB; ++h)
    for (int c = 0; c < VW; ++c) acc[h][c] = resume ? W::load(out + (h0 + h) * D + d0 + c * L) : W::zero();
  for (int64_t i = i0; i < n; ++i) {
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
                                   int64_t i0, int64_t n, bool resume, int64_t D, int64_t d0, int64_t group,
                                   float* out, const RowsAhead<KV>& ahead) {
  static_assert(HB >= 1 && HB <= 3, "passes of one to three heads");
  const RowsAhead<KV> none;
  int64_t h0 = 0;
  for (; h0 + HB <= group; h0 += HB)
    weigh_values<W, KV, HB, VW>(e, padded, values, slots, i0, n, resume, D, d0, h0, out, h0 == 0 ? ahead : none);
  const RowsAhead<KV>& rest = h0 == 0 ? ahead : none;
  if constexpr (HB == 3)
    if (group - h0 == 2) weigh_values<W, KV, 2, VW>(e, padded, values, slots, i0, n, resume, D, d0, h0, out, rest);
  if constexpr (HB >= 2)
    if (group - h0 == 1) weigh_values<W, KV, 1, VW>(e, padded, values, slots, i0, n, resume, D, d0, h0, out, rest);
}

// Columns d0 .. d0 + width * W::L for 1 <= width <= VW.
template <class W, class KV, int HB, int VW>
inline void weigh_columns(int64_t width, const float* e, int64_t padded, const KV* values, const int64_t* slots,
                          int64_t i0, int64_t n, bool resume, int64_t D, int64_t d0, int64_t group, float* out,
                          const RowsAhead<KV>& ahead) {
  if (width == VW)
    return weigh_values_all_heads<W, KV, HB, VW>(e, padded, values, slots, i0, n, resume, D, d0, group, out,
                                                 ahead);
  if constexpr (VW > 1)
    weigh_columns<W, KV, HB, VW - 1>(width, e, padded, values, slots, i0, n, resume, D, d0, group, out, ahead);
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

// Values in column passes of VV vectors of W, then narrower ones for what is left, over keys
// i0 .. n - 1 (resuming the sums in out unless i0 is the first); the first pass brings `ahead` in.
template <class Tiles, class KV>
inline void weigh_all_columns(const float* e, int64_t padded, const KV* values, const int64_t* slots, int64_t i0,
                              int64_t n, bool resume, int64_t D, int64_t group, float* out,
                              const RowsAhead<KV>& ahead) {
  using V = typename Tiles::V;
  using W = typename Tiles::W;
  constexpr int VH = Tiles::value_heads, VV = Tiles::value_vectors;
  constexpr int64_t pass = VV * W::L;
  int64_t d0 = 0;
  for (; d0 + pass <= D; d0 += pass)
    weigh_values_all_heads<W, KV, VH, VV>(e, padded, values, slots, i0, n, resume, D, d0, group, out,
                                          d0 == 0 ? ahead : RowsAhead<KV>{});
  if (D - d0 >= W::L) {
    const int64_t width = (D - d0) / W::L;
    weigh_columns<W, KV, VH, VV>(width, e, padded, values, slots, i0, n, resume, D, d0, group, out,
                                 d0 == 0 ? ahead : RowsAhead<KV>{});
    d0 += width * W::L;
  }
  if constexpr (W::L > V::L)
    for (; d0 < D; d0 += V::L)
      weigh_values_all_heads<V, KV, VH, 1>(e, padded, values, slots, i0, n, resume, D, d0, group, out,
                                           d0 == 0 ? ahead : RowsAhead<KV>{});
}

// The slots of query t's keys (local_key_slots); returns how many.
inline int64_t query_key_slots(const AttentionArgs& g, int64_t t, std::vector<int64_t>& slots) {
  return local_key_slots(g, g.block_tables + int64_t(g.token_seq[t]) * g.table_stride, first_key_position(g, t),
                         g.positions[t], slots);
}

// How many of positions lo..pos this rank holds: local_key_slots' count without the slots.
inline int64_t local_key_count(const AttentionArgs& g, int64_t lo, int64_t pos) {
  const int64_t I = g.interleave, C = g.dcp_size, cycle = I * C;
  auto below = [&](int64_t x) {  // positions 0..x-1 held here
    return x / cycle * I + std::clamp<int64_t>(x % cycle - g.dcp_rank * I, 0, I);
  };
  return below(pos + 1) - below(lo);
}

template <class KV>
inline const KV* kv_head_rows(const void* cache, const AttentionArgs& g, int64_t kv_head) {
  return static_cast<const KV*>(cache) + kv_head * g.num_slots * g.D;
}

// Query t's heads of kv head `kv_head`, as float32 rows [group, D].
template <class Q>
inline void load_query_rows(const AttentionArgs& g, int64_t t, int64_t kv_head, int64_t group, float* q) {
  const Q* q_in = static_cast<const Q*>(g.q) + (t * g.H + kv_head * group) * g.D;
  for (int64_t i = 0; i < group * g.D; ++i) {
    if constexpr (std::is_same_v<Q, float>) q[i] = q_in[i];
    else q[i] = bf16_to_float(q_in[i]);
  }
}

// Scores of query rows 0..rows-1 for the eight keys at `key` (positions first..first+7), SH rows a pass.
template <class Tiles, class KV>
inline void score_rows(const float* q, int64_t rows, const KV* const* key, int64_t D, float* scores, int64_t padded,
                       int64_t first) {
  constexpr int SH = Tiles::score_heads, SK = Tiles::score_keys;
  using V = typename Tiles::V;
  int64_t h0 = 0;
  for (; h0 + SH <= rows; h0 += SH) score_keys<V, KV, SH, SK>(q, key, D, h0, scores, padded, first);
  if constexpr (SH == 3)
    if (rows - h0 == 2) score_keys<V, KV, 2, SK>(q, key, D, h0, scores, padded, first);
  if constexpr (SH >= 2)
    if (rows - h0 == 1) score_keys<V, KV, 1, SK>(q, key, D, h0, scores, padded, first);
}

// s[0..7] = score * scale for the lanes up to the query's last key (n keys, this group's first at
// `first`), -inf past it.
template <class V>
DPGATE_INLINE void scale_and_mask(float* s, int64_t n, int64_t first, typename V::reg lane_offsets,
                                  typename V::reg scale) {
  // remaining[l] = n - 1 - (first + l): negative for lanes past the query.
  const typename V::reg remaining = V::sub(V::set1(float(n - 1 - first)), lane_offsets);
  V::store(s, V::replace_below(remaining, 0.0f, -std::numeric_limits<float>::infinity(), V::mul(V::load(s), scale)));
}

template <class V>
DPGATE_INLINE typename V::reg lane_offsets() {
  float offsets[V::L];
  for (int l = 0; l < V::L; ++l) offsets[l] = float(l);
  return V::load(offsets);
}

// One row's softmax numerators in place (e_j = exp(score_j - m)) over its padded keys; returns their
// sum s and sets max to m.
template <class V>
inline float softmax_row(float* e, int64_t padded, float& max) {
  using reg = typename V::reg;
  constexpr int L = V::L;
  reg running = V::set1(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < padded; i += L) running = V::max(running, V::load(e + i));
  max = V::hmax(running);
  const reg m = V::set1(max);
  reg total = V::zero();
  for (int64_t i = 0; i < padded; i += L) {
    const reg w = exp<V>(V::sub(V::load(e + i), m));
    V::store(e + i, w);
    total = V::add(total, w);
  }
  return V::hsum(total);
}

// result rows = out rows / their sums, for `rows` rows of D.
template <class V, class Q>
inline void divide_rows(const float* out, const float* sums, int64_t rows, int64_t D, Q* result) {
  for (int64_t h = 0; h < rows; ++h) {
    const typename V::reg sum = V::set1(sums[h]);
    for (int64_t i = h * D; i < (h + 1) * D; i += V::L) V::store(result + i, V::div(V::load(out + i), sum));
  }
}

// Query t's heads of kv head `kv_head` over its n keys at `slots`; `next_keys` are brought into L2
// on the way (the next item's, so its scores do not start by waiting on memory). The first
// keys_in_l2 keys were brought in that way by the item before; the rest are, farther ahead.
template <class Tiles, class Q, class KV>
inline void attention_query(const AttentionArgs& g, int64_t t, int64_t kv_head, const int64_t* slots, int64_t n,
                            std::vector<float>& scratch, const RowsAhead<KV>& next_keys, int64_t keys_in_l2) {
  using V = typename Tiles::V;
  constexpr int L = V::L;
  const int64_t D = g.D, group = g.H / g.KVH;
  const int64_t padded = (n + L - 1) / L * L;
  Q* result = static_cast<Q*>(g.out) + (t * g.H + kv_head * group) * D;
  if (n == 0) {  // an empty shard: LSE -inf and zeros, which the combine skips
    for (int64_t i = 0; i < group * D; ++i) result[i] = Q(0);
    if (g.lse != nullptr)
      for (int64_t h = 0; h < group; ++h) g.lse[t * g.H + kv_head * group + h] = -std::numeric_limits<float>::infinity();
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
  load_query_rows<Q>(g, t, kv_head, group, q);

  // Scores, eight keys at a time: hsum(...) * scale; lanes past the query's position become -inf
  // (whatever key they read: the last one stands in, so no lane reads outside the cache).
  const typename V::reg offsets = lane_offsets<V>(), scale = V::set1(g.scale);
  for (int64_t first = 0; first < padded; first += L) {
    const int64_t last = std::min(n, first + L);
    for (int64_t i = first + ahead_rows; i < std::min(n, last + ahead_rows); ++i)
      prefetch_row<3>(keys + slots[i] * D, D);
    for (int64_t i = std::max(keys_in_l2, first + 4 * ahead_rows); i < std::min(n, last + 4 * ahead_rows); ++i)
      prefetch_row<2>(keys + slots[i] * D, D);
    for (int64_t i = first; i < last; ++i) prefetch_row<2>(values + slots[i] * D, D);
    const KV* key[L];
    for (int l = 0; l < L; ++l) key[l] = keys + slots[std::min(first + l, n - 1)] * D;
    score_rows<Tiles, KV>(q, group, key, D, scores, padded, first);
    for (int64_t h = 0; h < group; ++h) scale_and_mask<V>(scores + h * padded + first, n, first, offsets, scale);
  }
  for (int64_t i = 0; i < std::min(n, ahead_rows); ++i) prefetch_row<3>(values + slots[i] * D, D);

  for (int64_t h = 0; h < group; ++h) {
    float max;
    sums[h] = softmax_row<V>(scores + h * padded, padded, max);
    if (g.lse != nullptr) g.lse[t * g.H + kv_head * group + h] = max + std::log(sums[h]);
  }
  weigh_all_columns<Tiles, KV>(scores, padded, values, slots, 0, n, false, D, group, out, next_keys);
  divide_rows<V, Q>(out, sums, group, D, result);
}

// Keys read per block of the tile's value pass: a block's value rows stay in L1 (16 KB of them)
// while every query of the tile weighs them.
template <class KV>
constexpr int64_t tile_key_block(int64_t D) {
  return std::max<int64_t>(8, 16384 / (D * int64_t(sizeof(KV))));
}

// Queries t0 .. t0 + qn - 1 (one tile: one sequence, consecutive positions, the same first key, so
// each one's keys are the first n_i of the last one's) and kv head `kv_head`, computed together:
// every key is read once for all of them while its scores are taken (eight at a time, for every
// query's heads), and every value row once per block of keys that all the queries weigh. Each
// query's every chain is attention_query's: the same scores, the same softmax over its own padded
// keys, the value sums over its own keys 0..n_i-1 in order (cut at the blocks and resumed), so a
// query's output does not depend on its tile. `slots` is scratch for the last query's keys.
template <class Tiles, class Q, class KV>
inline void attention_tile(const AttentionArgs& g, int64_t t0, int64_t qn, int64_t kv_head,
                           std::vector<int64_t>& slots, std::vector<float>& scratch) {
  using V = typename Tiles::V;
  constexpr int L = V::L;
  const int64_t D = g.D, group = g.H / g.KVH, rows = qn * group;
  const int64_t num = query_key_slots(g, t0 + qn - 1, slots);
  const int64_t lo = first_key_position(g, t0);
  int64_t n[kQueryTile];
  for (int64_t i = 0; i < qn; ++i) n[i] = local_key_count(g, lo, g.positions[t0 + i]);
  if (n[0] == 0) {  // a query with no keys here (decode context parallelism): one at a time
    for (int64_t i = 0; i < qn; ++i)
      attention_query<Tiles, Q, KV>(g, t0 + i, kv_head, slots.data(), n[i], scratch, RowsAhead<KV>{}, 0);
    return;
  }
  const KV* keys = kv_head_rows<KV>(g.key_cache, g, kv_head);
  const KV* values = kv_head_rows<KV>(g.value_cache, g, kv_head);
  const int64_t padded = (num + L - 1) / L * L, ahead_rows = rows_ahead<KV>(D);
  scratch.resize(rows * (2 * D + padded + 1));
  float* q = scratch.data();             // [rows, D]: query i's heads at rows i * group ..
  float* scores = q + rows * D;          // [rows, padded]
  float* sums = scores + rows * padded;  // [rows]
  float* out = sums + rows;              // [rows, D]
  for (int64_t i = 0; i < qn; ++i) load_query_rows<Q>(g, t0 + i, kv_head, group, q + i * group * D);

  const typename V::reg offsets = lane_offsets<V>(), scale = V::set1(g.scale);
  for (int64_t first = 0; first < padded; first += L) {
    const int64_t last = std::min(num, first + L);
    for (int64_t i = first + ahead_rows; i < std::min(num, last + ahead_rows); ++i)
      prefetch_row<3>(keys + slots[i] * D, D);
    const KV* key[L];
    for (int l = 0; l < L; ++l) key[l] = keys + slots[std::min(first + l, num - 1)] * D;
    // Only the queries that see a key of this group (n_i > first) score it.
    int64_t i_first = 0;
    while (n[i_first] <= first) ++i_first;
    score_rows<Tiles, KV>(q + i_first * group * D, rows - i_first * group, key, D,
                          scores + i_first * group * padded, padded, first);
    for (int64_t i = i_first; i < qn; ++i)
      for (int64_t h = 0; h < group; ++h)
        scale_and_mask<V>(scores + (i * group + h) * padded + first, n[i], first, offsets, scale);
  }
  for (int64_t i = 0; i < qn; ++i) {
    const int64_t own_padded = (n[i] + L - 1) / L * L;
    for (int64_t h = 0; h < group; ++h) {
      const int64_t r = i * group + h;
      float max;
      sums[r] = softmax_row<V>(scores + r * padded, own_padded, max);
      if (g.lse != nullptr) g.lse[(t0 + i) * g.H + kv_head * group + h] = max + std::log(sums[r]);
    }
  }
  const int64_t block = tile_key_block<KV>(D);
  for (int64_t k0 = 0; k0 < num; k0 += block)
    for (int64_t i = 0; i < qn; ++i)
      if (n[i] > k0)
        weigh_all_columns<Tiles, KV>(scores + i * group * padded, padded, values, slots.data(), k0,
                                     std::min(n[i], k0 + block), k0 > 0, D, group, out + i * group * D,
                                     RowsAhead<KV>{});
  for (int64_t i = 0; i < qn; ++i)
    divide_rows<V, Q>(out + i * group * D, sums + i * group, group, D,
                      static_cast<Q*>(g.out) + ((t0 + i) * g.H + kv_head * group) * D);
}

// Per thread and reused across calls, so a warm call allocates nothing.
struct AttentionScratch {
  std::vector<float> floats;
  std::vector<int64_t> slots, next_slots;
};

// Items are (query tile, kv head) pairs, item = tile * KVH + kv_head (AttentionArgs::tile_starts);
// this call takes item_begin, item_begin + item_step, ... below item_end (a strided share balances
// long and short queries). A tile of one query (a decode) brings the next such item's keys in.
template <class Tiles, class Q, class KV>
inline void attention_items(const AttentionArgs& g, int64_t item_begin, int64_t item_end, int64_t item_step) {
  thread_local AttentionScratch scratch;
  auto single_query = [&](int64_t item) {  // the item's query when its tile holds one, else -1
    const int64_t tile = item / g.KVH, t = g.tile_starts[tile];
    return g.tile_starts[tile + 1] - t == 1 ? t : -1;
  };
  int64_t n = -1, keys_in_l2 = 0;  // n >= 0: scratch.slots holds this item's keys
  for (int64_t item = item_begin; item < item_end; item += item_step) {
    const int64_t kv_head = item % g.KVH, t = single_query(item);
    if (t < 0) {
      const int64_t tile = item / g.KVH, t0 = g.tile_starts[tile];
      attention_tile<Tiles, Q, KV>(g, t0, g.tile_starts[tile + 1] - t0, kv_head, scratch.slots, scratch.floats);
      n = -1;
      continue;
    }
    if (n < 0) {
      n = query_key_slots(g, t, scratch.slots);
      keys_in_l2 = 0;
      for (int64_t i = 0; i < std::min(n, 4 * rows_ahead<KV>(g.D)); ++i)
        prefetch_row<2>(kv_head_rows<KV>(g.key_cache, g, kv_head) + scratch.slots[i] * g.D, g.D);
    }
    const int64_t next = item + item_step, next_t = next < item_end ? single_query(next) : -1;
    RowsAhead<KV> next_keys;
    int64_t next_n = -1;
    if (next_t >= 0) {
      next_n = query_key_slots(g, next_t, scratch.next_slots);
      next_keys = {kv_head_rows<KV>(g.key_cache, g, next % g.KVH), scratch.next_slots.data(), next_n};
    }
    attention_query<Tiles, Q, KV>(g, t, kv_head, scratch.slots.data(), n, scratch.floats, next_keys, keys_in_l2);
    std::swap(scratch.slots, scratch.next_slots);
    keys_in_l2 = next_n >= 0 ? std::min(n, next_n) : 0;  // the value pass brought that many of the next keys in
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
