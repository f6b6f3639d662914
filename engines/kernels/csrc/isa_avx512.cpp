// The matrix multiply on AVX-512: sixteen float32 lanes per register. Compiled with -mavx512f
// (and -mavx512bw, -mavx512vl for the conversions). Its results equal the AVX2 and scalar
// kernels' bit for bit: an output element's chain over k does not depend on the lane count.
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

}  // namespace dpgate::avx512
