// Picks the instruction set's kernel and splits the work over torch's intra-op threads. How the
// work is split never changes a result: each kernel computes an output element from its own row
// (its own query, for attention) alone.
#include "dispatch.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <vector>

namespace dpgate {

bool cpu_has(const char* feature) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (std::string(feature) == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (std::string(feature) == "avx512")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (std::string(feature) == "avx512_vnni") return cpu_has("avx512") && __builtin_cpu_supports("avx512vnni");
#endif
  return false;
}

Isa parse_isa(const std::string& name) {
  if (name == "scalar") return Isa::kScalar;
  if (name == "avx2") {
    TORCH_CHECK(cpu_has("avx2"), "dpgate kernels: this CPU lacks AVX2/FMA");
    return Isa::kAvx2;
  }
  if (name == "avx512") {
    TORCH_CHECK(cpu_has("avx512"), "dpgate kernels: this CPU lacks AVX-512 (F, BW)");
    return Isa::kAvx512;
  }
  if (name == "avx512_vnni") {
    TORCH_CHECK(cpu_has("avx512_vnni"), "dpgate kernels: this CPU lacks AVX512-VNNI");
    static const std::string problem = int_self_check(Isa::kAvx512Vnni, false);  // once a process
    TORCH_CHECK(problem.empty(), "dpgate kernels: avx512_vnni failed its self-check (", problem, ")");
    return Isa::kAvx512Vnni;
  }
  TORCH_CHECK(false, "dpgate kernels: unknown instruction set '", name, "'");
}

DType dtype_of(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kChar: return DType::kInt8;
    default: TORCH_CHECK(false, "dpgate kernels: ", what, " must be float32, bfloat16 or int8, got ", t.scalar_type());
  }
}

DType activation_dtype(const at::Tensor& t, const char* what) {
  const DType type = dtype_of(t, what);
  TORCH_CHECK(type != DType::kInt8, "dpgate kernels: ", what, " must be float32 or bfloat16");
  return type;
}

namespace {

// The tiles a plan cuts N output columns into.
int64_t num_tiles(const LinearPlan& plan, int64_t N) {
  const int64_t num_vectors = (N + plan.lanes - 1) / plan.lanes;
  return (num_vectors + plan.vectors - 1) / plan.vectors;
}

}  // namespace

void launch_linear(Isa isa, const LinearArgs& args) {
  if (args.M == 0) return;
  const int64_t M = args.M, N = args.N, threads = at::get_num_threads();
  LinearPlan plan{};
  switch (isa) {
    case Isa::kScalar: plan = scalar::linear_plan(M, N, threads); break;
#if defined(__x86_64__)
    case Isa::kAvx2: plan = avx2::linear_plan(M, N, threads); break;
    case Isa::kAvx512:
    case Isa::kAvx512Vnni: plan = avx512::linear_plan(M, N, threads); break;
#else
    default: TORCH_CHECK(false, "dpgate kernels: x86 instruction sets on a non-x86 build");
#endif
  }
  at::parallel_for(0, num_tiles(plan, args.N), 1, [&](int64_t begin, int64_t end) {
    switch (isa) {
      case Isa::kScalar: return scalar::linear(args, plan, begin, end);
#if defined(__x86_64__)
      case Isa::kAvx2: return avx2::linear(args, plan, begin, end);
      case Isa::kAvx512:
      case Isa::kAvx512Vnni: return avx512::linear(args, plan, begin, end);
#else
      default: return;
#endif
    }
  });
}

void launch_quant_linear(Isa isa, const QuantLinearArgs& args) {
  if (args.M == 0) return;
  // The GEMM-shaped path uses linear_plan's float32 tiles (for M >= 8 each covers whole panels).
  const int64_t M = args.M, N = args.N, threads = at::get_num_threads();
  LinearPlan plan{};
  switch (isa) {
    case Isa::kScalar:
      plan = args.gemm ? scalar::linear_plan(M, N, threads) : scalar::quant_linear_plan(M, N, threads);
      break;
#if defined(__x86_64__)
    case Isa::kAvx2:
      plan = args.gemm ? avx2::linear_plan(M, N, threads) : avx2::quant_linear_plan(M, N, threads);
      break;
    case Isa::kAvx512:
    case Isa::kAvx512Vnni:
      plan = args.gemm ? avx512::linear_plan(M, N, threads) : avx512::quant_linear_plan(M, N, threads);
      break;
#else
    default: TORCH_CHECK(false, "dpgate kernels: x86 instruction sets on a non-x86 build");
#endif
  }
  at::parallel_for(0, num_tiles(plan, args.N), 1, [&](int64_t begin, int64_t end) {
    switch (isa) {
      case Isa::kScalar: return scalar::quant_linear(args, plan, begin, end);
#if defined(__x86_64__)
      case Isa::kAvx2: return avx2::quant_linear(args, plan, begin, end);
      case Isa::kAvx512:
      case Isa::kAvx512Vnni: return avx512::quant_linear(args, plan, begin, end);
#else
      default: return;
#endif
    }
  });
}

void launch_int_quantize(Isa isa, const IntActs& args) {
  at::parallel_for(0, args.M, 8, [&](int64_t begin, int64_t end) {
    switch (isa) {
      case Isa::kScalar: return scalar::int_quantize(args, begin, end);
#if defined(__x86_64__)
      case Isa::kAvx2: return avx2::int_quantize(args, begin, end);
      case Isa::kAvx512: return avx512::int_quantize(args, begin, end);
      case Isa::kAvx512Vnni: return avx512_vnni::int_quantize(args, begin, end);
#else
      default: return;
#endif
    }
  });
}

void launch_int_linear(Isa isa, const IntLinearArgs& args) {
  if (args.M == 0) return;
  const int64_t M = args.M, N = args.N, threads = at::get_num_threads();
  LinearPlan plan{};
  switch (isa) {
    case Isa::kScalar: plan = scalar::int_linear_plan(M, N, threads); break;
#if defined(__x86_64__)
    case Isa::kAvx2: plan = avx2::int_linear_plan(M, N, threads); break;
    case Isa::kAvx512: plan = avx512::int_linear_plan(M, N, threads); break;
    case Isa::kAvx512Vnni: plan = avx512_vnni::int_linear_plan(M, N, threads); break;
#else
    default: TORCH_CHECK(false, "dpgate kernels: x86 instruction sets on a non-x86 build");
#endif
  }
  at::parallel_for(0, num_tiles(plan, args.N), 1, [&](int64_t begin, int64_t end) {
    switch (isa) {
      case Isa::kScalar: return scalar::int_linear(args, plan, begin, end);
#if defined(__x86_64__)
      case Isa::kAvx2: return avx2::int_linear(args, plan, begin, end);
      case Isa::kAvx512: return avx512::int_linear(args, plan, begin, end);
      case Isa::kAvx512Vnni: return avx512_vnni::int_linear(args, plan, begin, end);
#else
      default: return;
#endif
    }
  });
}

// Tiles of attention.h's query tiles: a new one starts where the sequence changes, a position does
// not follow the one before, the first key moves (a sliding window past its start) or the tile is full.
static std::vector<int64_t> query_tile_starts(const AttentionArgs& g) {
  std::vector<int64_t> starts;
  for (int64_t t = 0; t < g.T; ++t) {
    if (t == 0 || t - starts.back() == kQueryTile || g.token_seq[t] != g.token_seq[t - 1] ||
        g.positions[t] != g.positions[t - 1] + 1 || first_key_position(g, t) != first_key_position(g, t - 1))
      starts.push_back(t);
  }
  starts.push_back(g.T);
  return starts;
}

void launch_attention(Isa isa, const AttentionArgs& query_args) {
  if (query_args.T == 0) return;
  const std::vector<int64_t> starts = query_tile_starts(query_args);
  AttentionArgs args = query_args;
  args.tile_starts = starts.data();
  args.num_tiles = int64_t(starts.size()) - 1;
  const int64_t items = args.num_tiles * args.KVH;
  const int64_t shares = std::min<int64_t>(items, at::get_num_threads());
  at::parallel_for(0, shares, 1, [&](int64_t begin, int64_t end) {
    for (int64_t share = begin; share < end; ++share) {
      if (isa == Isa::kScalar) scalar::attention(args, share, items, shares);
#if defined(__x86_64__)
      else if (isa == Isa::kAvx512 || isa == Isa::kAvx512Vnni) avx512::attention(args, share, items, shares);
      else avx2::attention(args, share, items, shares);
#endif
    }
  });
}

void launch_rms_norm(Isa isa, const NormArgs& args, int64_t rows) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    if (isa == Isa::kScalar) scalar::rms_norm(args, begin, end);
#if defined(__x86_64__)
    else avx2::rms_norm(args, begin, end);
#endif
  });
}

void launch_act_and_mul(Isa isa, const ActArgs& args, int64_t rows) {
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    if (isa == Isa::kScalar) scalar::act_and_mul(args, begin, end);
#if defined(__x86_64__)
    else avx2::act_and_mul(args, begin, end);
#endif
  });
}

void launch_dcp_combine(Isa isa, const CombineArgs& args) {
  at::parallel_for(0, args.T * args.heads, 16, [&](int64_t begin, int64_t end) {
    if (isa == Isa::kScalar) scalar::dcp_combine(args, begin, end);
#if defined(__x86_64__)
    else avx2::dcp_combine(args, begin, end);
#endif
  });
}

}  // namespace dpgate
