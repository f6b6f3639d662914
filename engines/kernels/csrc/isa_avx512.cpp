// The matrix multiply and attention on AVX-512: sixteen float32 lanes per register. Compiled with
// -mavx512f (and -mavx512bw, -mavx512vl for the conversions). Their results equal the AVX2 and
// scalar kernels' bit for bit: an output element's chain over k (over the keys, for attention's
// values) does not depend on the lane count, and attention's scores and softmax stay on eight
// lanes, where AVX-512VL gives them 32 registers instead of AVX2's 16.
#include "attention.h"
#include "int_linear.h"
#include "linear.h"
#include "quant_linear.h"

#if !defined(__AVX512F__) || !defined(__AVX512BW__)
#error "isa_avx512.cpp must be compiled with -mavx512f -mavx512bw"
#endif

namespace dpgate::avx512 {

// 32 registers: up to 24 accumulators, the weight vectors and one broadcast activation.
// Single rows also in narrower tiles, so the threads share a layer's columns evenly.
#define DPGATE_AVX512_TILES(X) X(1, 8) X(1, 6) X(1, 4) X(2, 8) X(3, 6) X(4, 5) X(5, 4) X(6, 4) X(8, 3)

LinearPlan linear_plan(int64_t M, int64_t N, int64_t threads) {
  constexpr LinearPlan plans[] = {{1, 8, 16}, {2, 8, 16}, {3, 6, 16}, {4, 5, 16},
                                  {5, 4, 16}, {6, 4, 16}, {6, 4, 16}, {8, 3, 16}};
  LinearPlan plan = plans[std::min<int64_t>(std::max<int64_t>(M, 1), 8) - 1];
  if (plan.rows == 1) plan.vectors = balanced_vectors({8, 6, 4}, N, plan.lanes, threads);
  return plan;
}

void linear(const LinearArgs& args, const LinearPlan& plan, int64_t tile_begin, int64_t tile_end) {
#define DPGATE_CALL(MR, NV) \
  if (plan.rows == MR && plan.vectors == NV) return linear_dispatch<Avx512, MR, NV>(args, tile_begin, tile_end);
  DPGATE_AVX512_TILES(DPGATE_CALL)
#undef DPGATE_CALL
}

#define DPGATE_AVX512_QUANT_TILES(X) X(1, 4) X(1, 3) X(1, 2) X(2, 4) X(3, 4) X(4, 4) X(5, 3) X(6, 3) X(8, 2)

LinearPlan quant_linear_plan(int64_t M, int64_t N, int64_t threads) {
  constexpr LinearPlan plans[] = {{1, 4, 16}, {2, 4, 16}, {3, 4, 16}, {4, 4, 16},
                                  {5, 3, 16}, {6, 3, 16}, {6, 3, 16}, {8, 2, 16}};
  LinearPlan plan = plans[std::min<int64_t>(std::max<int64_t>(M, 1), 8) - 1];
  if (plan.rows == 1) plan.vectors = balanced_vectors({4, 3, 2}, N, plan.lanes, threads);
  return plan;
}

void quant_linear(const QuantLinearArgs& args, const LinearPlan& plan, int64_t tile_begin, int64_t tile_end) {
  if (args.gemm) return quant_gemm_dispatch<Avx512, 8, 3>(args, tile_begin, tile_end);  // linear_plan(M >= 8)
#define DPGATE_CALL(MR, NV) \
  if (plan.rows == MR && plan.vectors == NV) return quant_dispatch<Avx512, MR, NV>(args, tile_begin, tile_end);
  DPGATE_AVX512_QUANT_TILES(DPGATE_CALL)
#undef DPGATE_CALL
}

void int_quantize(const IntActs& args, int64_t row_begin, int64_t row_end) {
  int_quantize_rows<IntAvx512>(args, row_begin, row_end);
}

#define DPGATE_AVX512_INT_TILES(X) X(1, 4) X(1, 3) X(1, 2) X(2, 4) X(4, 2)

LinearPlan int_linear_plan(int64_t M, int64_t N, int64_t threads) {
  if (M >= 4) return {4, 2, 16};
  if (M >= 2) return {2, 4, 16};
  return {1, balanced_vectors({4, 3, 2}, N, 16, threads), 16};
}

void int_linear(const IntLinearArgs& args, const LinearPlan& plan, int64_t tile_begin, int64_t tile_end) {
#define DPGATE_CALL(MR, NV) \
  if (plan.rows == MR && plan.vectors == NV) return int_dispatch<IntAvx512, MR, NV>(args, tile_begin, tile_end);
  DPGATE_AVX512_INT_TILES(DPGATE_CALL)
#undef DPGATE_CALL
}

// 32 registers: scores 3 heads x 8 keys of eight lanes (24 accumulators, 3 query vectors, a key);
// values 3 heads x 4 vectors of sixteen lanes, so a row of 64 is read in one pass.
void attention(const AttentionArgs& args, int64_t item_begin, int64_t item_end, int64_t item_step) {
  attention_dispatch<AttentionTiles<Avx2, Avx512, 3, 8, 3, 4>>(args, item_begin, item_end, item_step);
}

}  // namespace dpgate::avx512
