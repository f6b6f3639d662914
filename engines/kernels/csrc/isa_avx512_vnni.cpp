// The integer kernels on AVX512-VNNI: vpdpbusd multiplies 64 unsigned weight bytes by signed
// activation bytes and adds each four into an int32 lane, exactly. Compiled with -mavx512vnni
// (and AVX-512's other flags). The sums are the same integers the widening AVX2 / AVX-512 paths
// and the scalar reference form, and the float32 chain after them is int_linear.h's, so the
// results equal theirs bit for bit. Every other kernel runs AVX-512's code (dispatch.cpp); this
// set is used only after its start-up self-check passed (dispatch.cpp, int_self_check).
#include "int_linear.h"

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VNNI__)
#error "isa_avx512_vnni.cpp must be compiled with -mavx512f -mavx512bw -mavx512vnni"
#endif

namespace dpgate::avx512_vnni {

void int_quantize(const IntActs& args, int64_t row_begin, int64_t row_end) {
  int_quantize_rows<IntAvx512Vnni>(args, row_begin, row_end);
}

// One register per weight vector and per broadcast activation: wider row tiles than the
// widening path's.
#define DPGATE_VNNI_INT_TILES(X) X(1, 4) X(1, 3) X(1, 2) X(2, 4) X(4, 3)

LinearPlan int_linear_plan(int64_t M, int64_t N, int64_t threads) {
  if (M >= 4) return {4, 3, 16};
  if (M >= 2) return {2, 4, 16};
  return {1, balanced_vectors({4, 3, 2}, N, 16, threads), 16};
}

void int_linear(const IntLinearArgs& args, const LinearPlan& plan, int64_t tile_begin, int64_t tile_end) {
#define DPGATE_CALL(MR, NV) \
  if (plan.rows == MR && plan.vectors == NV) return int_dispatch<IntAvx512Vnni, MR, NV>(args, tile_begin, tile_end);
  DPGATE_VNNI_INT_TILES(DPGATE_CALL)
#undef DPGATE_CALL
}

}  // namespace dpgate::avx512_vnni
