// The reference kernels: the same templates on plain C++ lanes (Scalar8), compiled for the
// baseline CPU with -ffp-contract=off, so every operation is the one written. Every other
// instruction set must give these bits; they also serve CPUs that have neither AVX2 nor FMA.
#include "attention.h"
#include "dcp.h"
#include "int_linear.h"
#include "linear.h"
#include "norm.h"
#include "quant_linear.h"

namespace dpgate::scalar {

LinearPlan linear_plan(int64_t M, int64_t, int64_t) { return M >= 4 ? LinearPlan{4, 2, 8} : LinearPlan{1, 2, 8}; }

void linear(const LinearArgs& args, const LinearPlan& plan, int64_t tile_begin, int64_t tile_end) {
  if (plan.rows == 4) return linear_dispatch<Scalar8, 4, 2>(args, tile_begin, tile_end);
  return linear_dispatch<Scalar8, 1, 2>(args, tile_begin, tile_end);
}

LinearPlan quant_linear_plan(int64_t M, int64_t, int64_t) { return M >= 4 ? LinearPlan{4, 2, 8} : LinearPlan{1, 2, 8}; }

void quant_linear(const QuantLinearArgs& args, const LinearPlan& plan, int64_t tile_begin, int64_t tile_end) {
  if (args.gemm) return quant_gemm_dispatch<Scalar8, 4, 2>(args, tile_begin, tile_end);  // linear_plan(M >= 4)
  if (plan.rows == 4) return quant_dispatch<Scalar8, 4, 2>(args, tile_begin, tile_end);
  return quant_dispatch<Scalar8, 1, 2>(args, tile_begin, tile_end);
}

void int_quantize(const IntActs& args, int64_t row_begin, int64_t row_end) {
  int_quantize_rows<IntScalar8>(args, row_begin, row_end);
}

LinearPlan int_linear_plan(int64_t M, int64_t, int64_t) { return M >= 4 ? LinearPlan{4, 2, 8} : LinearPlan{1, 2, 8}; }

void int_linear(const IntLinearArgs& args, const LinearPlan& plan, int64_t tile_begin, int64_t tile_end) {
  if (plan.rows == 4) return int_dispatch<IntScalar8, 4, 2>(args, tile_begin, tile_end);
  return int_dispatch<IntScalar8, 1, 2>(args, tile_begin, tile_end);
}

void attention(const AttentionArgs& args, int64_t item_begin, int64_t item_end, int64_t item_step) {
  attention_dispatch<AttentionTiles<Scalar8, Scalar8, 2, 4, 3, 3>>(args, item_begin, item_end, item_step);
}

void rms_norm(const NormArgs& args, int64_t row_begin, int64_t row_end) {
  rms_norm_dispatch<Scalar8>(args, row_begin, row_end);
}

void act_and_mul(const ActArgs& args, int64_t row_begin, int64_t row_end) {
  act_and_mul_dispatch<Scalar8>(args, row_begin, row_end);
}

void dcp_combine(const CombineArgs& args, int64_t row_begin, int64_t row_end) {
  dcp_combine_rows<Scalar8>(args, row_begin, row_end);
}

}  // namespace dpgate::scalar
