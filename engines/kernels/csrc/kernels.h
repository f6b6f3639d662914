// The batch-invariant kernels' interface: plain structs of pointers and sizes, no torch.
//
// Each instruction set's translation unit (isa_scalar.cpp, isa_avx2.cpp, isa_avx512.cpp, and
// isa_avx512_vnni.cpp for the integer kernels) implements these functions in its own namespace;
// ops.cpp checks tensors, splits the work over torch's threads and calls the set the caller chose.
// A row's result never depends on how the work was split or on the other rows: see the rule
// stated in each kernel's header.
#pragma once

#include <algorithm>
#include <cstdint>

namespace dpgate {

enum class DType : int { kFloat32 = 0, kBFloat16 = 1, kInt8 = 2 };

// The instruction sets (dispatch.h parses their names). kAvx512Vnni runs AVX-512's kernels, and
// the integer kernels with vpdpbusd.
enum class Isa { kScalar, kAvx2, kAvx512, kAvx512Vnni };

// Weights are packed in panels of 16 output columns: packed[n / 16][k][n % 16], zero padded.
constexpr int64_t kPanelWidth = 16;
// Queries of one sequence computed together by attention (at most this many a tile).
constexpr int64_t kQueryTile = 8;

struct LinearArgs {
  const float* a;         // [M, K] float32 activations, row stride lda
  int64_t lda;
  const void* weight;     // packed [ceil(N / 16), K, 16] of weight_type
  DType weight_type;      // kInt8, kBFloat16 or kFloat32
  const float* scales;    // [ceil(N / 16) * 16] per output column, int8 weights only
  void* out;              // [M, N] of out_type, row stride ldo
  DType out_type;         // kFloat32 or kBFloat16
  int64_t ldo;
  int64_t M, N, K;
};

// Block-quantized weights (quant_linear.h): w = D * q + M per group of `group` weights along k.
struct QuantLinearArgs {
  const float* a;  // [M, K] float32 activations, row stride lda
  int64_t lda;
  const uint8_t* q;       // nibbles [ceil(N / 16), K / 2, 16] or int8 bytes [ceil(N / 16), K, 16]
  bool nibbles;
  int64_t group;          // weights per scale along k (16 or 32); divides K
  const float* scales;    // D: [ceil(N / 16), K / group, 16]
  const float* offsets;   // M: like scales, or nullptr for M = 0
  void* out;              // [M, N] of out_type, row stride ldo
  DType out_type;
  int64_t ldo;
  int64_t M, N, K;
  bool gemm;  // dequantize each column tile once and use linear_plan's float32 tiles (many rows)
};

// Row counts from which quant_linear takes the GEMM-shaped path.
constexpr int64_t kQuantGemmRows = 8;

// Integer dot products (int_linear.h): activations quantized per row and per group of
// kActGroup values along k to int8 codes with a float32 scale, multiplied by a GGUF's weight
// codes with exact int32 sums per weight group.
constexpr int64_t kActGroup = 32;

struct IntActs {
  const float* a;  // [M, K] float32 activations, row stride lda
  int64_t lda;
  int8_t* codes;   // [M, K]: round(x * 127 / amax), in -127..127
  float* scales;   // [M, K / kActGroup]: amax / 127 per group (0 for a group of zeros)
  int32_t* sums;   // [M, K / 16]: the sum of the codes of each 16 values
  int64_t M, K;
};

struct IntLinearArgs {
  const int8_t* codes;      // IntActs' codes, scales and sums, M rows
  const float* act_scales;
  const int32_t* act_sums;
  // Unsigned weight codes u = q + bias in chunks of four along k per column: bytes
  // [P, K / 4, 16, 4] (byte b of column j in chunk c is k = 4c + b), or nibbles [P, K / 8, 16, 4]
  // (the low nibble of byte b is k = 8c + b, the high one k = 8c + 4 + b).
  const uint8_t* q;
  bool nibbles;
  int32_t bias;           // 0 (nibbles 0..15) or 128 (signed bytes stored as q + 128)
  int64_t group;          // weights per scale along k (16 or 32)
  const float* scales;    // D: [P, K / group, 16]
  const float* offsets;   // M: like scales, or nullptr for M = 0
  void* out;              // [M, N] of out_type, row stride ldo
  DType out_type;
  int64_t ldo;
  int64_t M, N, K;
};

// How the output is cut into tiles: `rows` x `vectors` registers of `lanes` columns.
struct LinearPlan {
  int rows;
  int vectors;
  int lanes;
};

// For single-row plans: the widest tile width of `candidates` (widest first) that cuts N columns
// into whole tiles the threads share evenly, else one that at least shares them evenly, else the
// widest. A 576-column o_proj in tiles of 8 vectors of 16 is 4.5 tiles: one thread does 3, the
// other 2, and the half tile runs one vector at a time. Widths never change a result (linear.h).
template <int N_CANDIDATES>
inline int balanced_vectors(const int (&candidates)[N_CANDIDATES], int64_t N, int lanes, int64_t threads) {
  const int64_t vectors = (N + lanes - 1) / lanes;
  for (int nv : candidates)
    if (vectors % nv == 0 && (vectors / nv) % threads == 0) return nv;
  for (int nv : candidates)
    if (((vectors + nv - 1) / nv) % threads == 0) return nv;
  return candidates[0];
}

struct AttentionArgs {
  const void* q;            // [T, H, D] of act_type, contiguous
  void* out;                // [T, H, D] of act_type, contiguous
  DType act_type;
  const void* key_cache;    // [KVH, slots, D] of cache_type, contiguous
  const void* value_cache;  // [KVH, slots, D] of cache_type, contiguous
  DType cache_type;
  const int32_t* block_tables;  // [num_seqs, table_stride]
  int64_t table_stride;
  const int32_t* token_seq;     // [T]: the row of block_tables each query belongs to
  const int64_t* positions;     // [T]: each query's position; it sees keys at positions <= it
  int64_t T, H, KVH, D, num_slots, block_size;
  int64_t window;               // > 0: a query at p sees only keys at p - window < key <= p
  float scale;
  // Decode context parallelism: this rank holds positions p with (p / interleave) % dcp_size ==
  // dcp_rank; block tables then count logical blocks of block_size * dcp_size positions.
  int64_t dcp_size, dcp_rank, interleave;
  float* lse;  // [T, H] natural-log LSE of each query's scores, or nullptr
  // Set by launch_attention: queries tile_starts[i] .. tile_starts[i + 1] - 1 form tile i, a run of
  // one sequence's queries at consecutive positions from the same first key, which attention.h
  // computes together so that each key and value read serves all of them.
  const int64_t* tile_starts = nullptr;
  int64_t num_tiles = 0;
};

// The first key position query t sees (its sliding window's start, or 0).
inline int64_t first_key_position(const AttentionArgs& g, int64_t t) {
  return g.window > 0 ? std::max<int64_t>(0, g.positions[t] - g.window + 1) : 0;
}

// Combines C ranks' partial attention (dcp.h): out = sum_n w_n o_n, w_n = exp(lse_n - M) / S.
struct CombineArgs {
  const float* outs;  // [C, slot_tokens, slot_heads, D]: each rank's partial outputs
  const float* lses;  // [C, slot_tokens, slot_heads]
  int64_t C, slot_tokens, slot_heads, D;
  int64_t T, head_offset, heads;  // combine rows 0..T-1, heads head_offset .. + heads
  float* out;                     // [T, heads, D]
  float* lse;                     // [T, heads]
};

struct NormArgs {
  const void* x;        // [rows, N] of type, contiguous
  void* out;            // [rows, N] of type
  DType type;
  const float* weight;  // [N], the effective scale (Gemma's 1 + w already added)
  int64_t N;
  float eps;
};

enum class Activation : int { kSilu = 0, kGeluTanh = 1 };

struct ActArgs {
  const void* x;  // [rows, 2 * I] of type: gate then up
  void* out;      // [rows, I] of type
  DType type;
  int64_t I;
  Activation activation;
};

// One namespace per instruction set; every function handles the half-open range it is given.
#define DPGATE_DECLARE_KERNELS(ns)                                                    \
  namespace ns {                                                                      \
  LinearPlan linear_plan(int64_t M, int64_t N, int64_t threads);                      \
  void linear(const LinearArgs& args, const LinearPlan& plan, int64_t tile_begin,     \
              int64_t tile_end);                                                      \
  LinearPlan quant_linear_plan(int64_t M, int64_t N, int64_t threads);                \
  void quant_linear(const QuantLinearArgs& args, const LinearPlan& plan,              \
                    int64_t tile_begin, int64_t tile_end);                            \
  void attention(const AttentionArgs& args, int64_t item_begin, int64_t item_end,     \
                 int64_t item_step);                                                  \
  void rms_norm(const NormArgs& args, int64_t row_begin, int64_t row_end);            \
  void act_and_mul(const ActArgs& args, int64_t row_begin, int64_t row_end);          \
  void dcp_combine(const CombineArgs& args, int64_t row_begin, int64_t row_end);      \
  }

// The integer kernels, in every instruction set's namespace (avx512_vnni has only these).
#define DPGATE_DECLARE_INT_KERNELS(ns)                                                          \
  namespace ns {                                                                                \
  void int_quantize(const IntActs& args, int64_t row_begin, int64_t row_end);                   \
  LinearPlan int_linear_plan(int64_t M, int64_t N, int64_t threads);                            \
  void int_linear(const IntLinearArgs& args, const LinearPlan& plan, int64_t tile_begin,        \
                  int64_t tile_end);                                                            \
  }

DPGATE_DECLARE_KERNELS(scalar)
DPGATE_DECLARE_INT_KERNELS(scalar)
#if defined(__x86_64__)
DPGATE_DECLARE_KERNELS(avx2)
DPGATE_DECLARE_INT_KERNELS(avx2)
DPGATE_DECLARE_INT_KERNELS(avx512)
DPGATE_DECLARE_INT_KERNELS(avx512_vnni)
namespace avx512 {
LinearPlan linear_plan(int64_t M, int64_t N, int64_t threads);
void linear(const LinearArgs& args, const LinearPlan& plan, int64_t tile_begin, int64_t tile_end);
LinearPlan quant_linear_plan(int64_t M, int64_t N, int64_t threads);
void quant_linear(const QuantLinearArgs& args, const LinearPlan& plan, int64_t tile_begin, int64_t tile_end);
void attention(const AttentionArgs& args, int64_t item_begin, int64_t item_end, int64_t item_step);
}
#endif

}  // namespace dpgate
