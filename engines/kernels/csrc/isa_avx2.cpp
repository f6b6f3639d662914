// The kernels on AVX2 + FMA: eight float32 lanes per register. Compiled with -mavx2 -mfma.
#include "attention.h"
#include "dcp.h"
#include "int_linear.h"
#include "linear.h"
#include "norm.h"
#include "quant_linear.h"

#if !defined(__AVX2__) || !defined(__FMA__)
#error "isa_avx2.cpp must be compiled with -mavx2 -mfma"
#endif

namespace dpgate::avx2 {

// Register tiles (rows x vectors of 8 columns) by row count: 16 registers hold the
// accumulators, one weight vector per column vector and one broadcast activation.
// Single rows also in narrower tiles, so the threads share a layer's columns evenly.
#define DPGATE_AVX2_TILES(X) X(1, 6) X(1, 4) X(1, 3) X(2, 4) X(3, 3) X(4, 3) X(5, 2) X(6, 2)

LinearPlan linear_plan(int64_t M, int64_t N, int64_t threads) {
  constexpr LinearPlan plans[] = {{1, 6, 8}, {2, 4, 8}, {3, 3, 8}, {4, 3, 8}, {5, 2, 8}, {6, 2, 8}};
  LinearPlan plan = plans[std::min<int64_t>(std::max<int64_t>(M, 1), 6) - 1];
  if (plan.rows == 1) plan.vectors = balanced_vectors({6, 4, 3}, N, plan.lanes, threads);
  return plan;
}

void linear(const LinearArgs& args, const LinearPlan& plan, int64_t tile_begin, int64_t tile_end) {
#define DPGATE_CALL(MR, NV) \
  if (plan.rows == MR && plan.vectors == NV) return linear_dispatch<Avx2, MR, NV>(args, tile_begin, tile_end);
  DPGATE_AVX2_TILES(DPGATE_CALL)
#undef DPGATE_CALL
}

// Quantized weights need registers for the group's scales and offsets beside the accumulators.
#define DPGATE_AVX2_QUANT_TILES(X) X(1, 4) X(1, 3) X(1, 2) X(2, 4) X(3, 2) X(4, 2) X(5, 2) X(6, 2)

LinearPlan quant_linear_plan(int64_t M, int64_t N, int64_t threads) {
  constexpr LinearPlan plans[] = {{1, 4, 8}, {2, 4, 8}, {3, 2, 8}, {4, 2, 8}, {5, 2, 8}, {6, 2, 8}};
  LinearPlan plan = plans[std::min<int64_t>(std::max<int64_t>(M, 1), 6) - 1];
  if (plan.rows == 1) plan.vectors = balanced_vectors({4, 3, 2}, N, plan.lanes, threads);
  return plan;
}

void quant_linear(const QuantLinearArgs& args, const LinearPlan& plan, int64_t tile_begin, int64_t tile_end) {
  if (args.gemm) return quant_gemm_dispatch<Avx2, 6, 2>(args, tile_begin, tile_end);  // linear_plan(M >= 6)
#define DPGATE_CALL(MR, NV) \
  if (plan.rows == MR && plan.vectors == NV) return quant_dispatch<Avx2, MR, NV>(args, tile_begin, tile_end);
  DPGATE_AVX2_QUANT_TILES(DPGATE_CALL)
#undef DPGATE_CALL
}

void int_quantize(const IntActs& args, int64_t row_begin, int64_t row_end) {
  int_quantize_rows<IntAvx2>(args, row_begin, row_end);
}

// Integer tiles hold float and integer accumulators, and two registers per weight vector; up to
// 4 x 2 measured fastest (bench/quant_kernels.py: 3 x 3, 4 x 3, 6 x 2 alike, 4 x 1 12% slower).
#define DPGATE_AVX2_INT_TILES(X) X(1, 4) X(1, 3) X(1, 2) X(2, 2) X(3, 2) X(4, 2)

LinearPlan int_linear_plan(int64_t M, int64_t N, int64_t threads) {
  if (M >= 2) return {std::min<int64_t>(M, 4), 2, 8};
  return {1, balanced_vectors({4, 3, 2}, N, 8, threads), 8};
}

void int_linear(const IntLinearArgs& args, const LinearPlan& plan, int64_t tile_begin, int64_t tile_end) {
#define DPGATE_CALL(MR, NV) \
  if (plan.rows == MR && plan.vectors == NV) return int_dispatch<IntAvx2, MR, NV>(args, tile_begin, tile_end);
  DPGATE_AVX2_INT_TILES(DPGATE_CALL)
#undef DPGATE_CALL
}

// 16 registers: scores 2 heads x 4 keys, values 3 heads x 3 vectors.
void attention(const AttentionArgs& args, int64_t item_begin, int64_t item_end, int64_t item_step) {
  attention_dispatch<AttentionTiles<Avx2, Avx2, 2, 4, 3, 3>>(args, item_begin, item_end, item_step);
}

void rms_norm(const NormArgs& args, int64_t row_begin, int64_t row_end) {
  rms_norm_dispatch<Avx2>(args, row_begin, row_end);
}

void act_and_mul(const ActArgs& args, int64_t row_begin, int64_t row_end) {
  act_and_mul_dispatch<Avx2>(args, row_begin, row_end);
}

void dcp_combine(const CombineArgs& args, int64_t row_begin, int64_t row_end) {
  dcp_combine_rows<Avx2>(args, row_begin, row_end);
}

}  // namespace dpgate::avx2
