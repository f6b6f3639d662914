// torch operators over the batch-invariant kernels (torch.ops.dpgate.*).
//
// This file checks tensors, picks the instruction set the caller named (engines/kernels
// decides which, once), and splits the work over torch's intra-op threads. How the work is
// split never changes a result: each kernel computes an output element from its own row alone.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sched.h>
#include <string>
#include <tuple>
#include <vector>

#include "kernels.h"

namespace dpgate {
namespace {

enum class Isa { kScalar, kAvx2, kAvx512 };

bool cpu_has(const char* feature) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (std::string(feature) == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (std::string(feature) == "avx512")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
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

std::vector<std::string> supported_isas() {
  std::vector<std::string> names{"scalar"};
  if (cpu_has("avx2")) names.emplace_back("avx2");
  if (cpu_has("avx512")) names.emplace_back("avx512");
  return names;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& scales,
                  int64_t out_features, const std::string& isa_name) {
  const Isa isa = parse_isa(isa_name);
  const DType out_type = activation_dtype(x, "linear input");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kPanelWidth && packed.is_contiguous(),
              "dpgate linear: weights must be packed [ceil(N/16), K, 16] and contiguous");
  const int64_t K = packed.size(1), N = out_features;
  TORCH_CHECK(x.size(-1) == K, "dpgate linear: input has ", x.size(-1), " features, weights ", K);
  TORCH_CHECK(N > 0 && N <= packed.size(0) * kPanelWidth, "dpgate linear: out_features out of range");
  const DType weight_type = dtype_of(packed, "weights");
  if (weight_type == DType::kInt8) {
    TORCH_CHECK(scales.has_value() && scales->scalar_type() == at::kFloat && scales->is_contiguous() &&
                    scales->numel() == packed.size(0) * kPanelWidth,
                "dpgate linear: int8 weights need float32 scales padded to ceil(N/16)*16");
  }
  const at::Tensor a = x.reshape({-1, K}).to(at::kFloat).contiguous();
  const int64_t M = a.size(0);
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = N;
  at::Tensor out = at::empty(out_shape, x.options());
  if (M == 0) return out;

  LinearArgs args{a.data_ptr<float>(), K, packed.data_ptr(), weight_type,
                  weight_type == DType::kInt8 ? scales->data_ptr<float>() : nullptr,
                  out.data_ptr(), out_type, N, M, N, K};
  LinearPlan plan{};
  switch (isa) {
    case Isa::kScalar: plan = scalar::linear_plan(M); break;
#if defined(__x86_64__)
    case Isa::kAvx2: plan = avx2::linear_plan(M); break;
    case Isa::kAvx512: plan = avx512::linear_plan(M); break;
#else
    default: TORCH_CHECK(false, "dpgate kernels: x86 instruction sets on a non-x86 build");
#endif
  }
  const int64_t num_vectors = (N + plan.lanes - 1) / plan.lanes;
  const int64_t num_tiles = (num_vectors + plan.vectors - 1) / plan.vectors;
  at::parallel_for(0, num_tiles, 1, [&](int64_t begin, int64_t end) {
    switch (isa) {
      case Isa::kScalar: return scalar::linear(args, plan, begin, end);
#if defined(__x86_64__)
      case Isa::kAvx2: return avx2::linear(args, plan, begin, end);
      case Isa::kAvx512: return avx512::linear(args, plan, begin, end);
#else
      default: return;
#endif
    }
  });
  return out;
}

// Block-quantized weights (quant_linear.h): codes uint8 nibble pairs [P, K / 2, 16] or int8 [P, K, 16];
// scales and offsets float32 [P, K / group, 16] (offsets optional).
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                        const std::optional<at::Tensor>& offsets, int64_t group, int64_t out_features,
                        const std::string& isa_name) {
  const Isa isa = parse_isa(isa_name);
  const DType out_type = activation_dtype(x, "quant_linear input");
  const bool nibbles = codes.scalar_type() == at::kByte;
  TORCH_CHECK(codes.dim() == 3 && codes.is_contiguous() && (nibbles || codes.scalar_type() == at::kChar) &&
                  codes.size(2) == kPanelWidth,
              "dpgate quant_linear: codes must be uint8 nibble pairs [P, K / 2, 16] or int8 [P, K, 16], contiguous");
  const int64_t P = codes.size(0), K = codes.size(1) * (nibbles ? 2 : 1), N = out_features;
  TORCH_CHECK(group > 0 && group % 2 == 0 && K % group == 0,
              "dpgate quant_linear: the group size must be even and divide K");
  TORCH_CHECK(x.size(-1) == K, "dpgate quant_linear: input has ", x.size(-1), " features, weights ", K);
  TORCH_CHECK(N > 0 && N <= P * kPanelWidth, "dpgate quant_linear: out_features out of range");
  auto check_scales = [&](const at::Tensor& t, const char* what) {
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.dim() == 3 && t.size(0) == P &&
                    t.size(1) == K / group && t.size(2) == kPanelWidth,
                "dpgate quant_linear: ", what, " must be float32 [P, K / group, 16], contiguous");
  };
  check_scales(scales, "scales");
  if (offsets.has_value()) check_scales(*offsets, "offsets");
  const at::Tensor a = x.reshape({-1, K}).to(at::kFloat).contiguous();
  const int64_t M = a.size(0);
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = N;
  at::Tensor out = at::empty(out_shape, x.options());
  if (M == 0) return out;
  QuantLinearArgs args{a.data_ptr<float>(), K, static_cast<const uint8_t*>(codes.data_ptr()), nibbles, group,
                       scales.data_ptr<float>(), offsets.has_value() ? offsets->data_ptr<float>() : nullptr,
                       out.data_ptr(), out_type, N, M, N, K, M >= kQuantGemmRows};
  // The GEMM-shaped path uses linear_plan's float32 tiles (for M >= 8 each covers whole panels).
  LinearPlan plan{};
  switch (isa) {
    case Isa::kScalar: plan = args.gemm ? scalar::linear_plan(M) : scalar::quant_linear_plan(M); break;
#if defined(__x86_64__)
    case Isa::kAvx2: plan = args.gemm ? avx2::linear_plan(M) : avx2::quant_linear_plan(M); break;
    case Isa::kAvx512: plan = args.gemm ? avx512::linear_plan(M) : avx512::quant_linear_plan(M); break;
#else
    default: TORCH_CHECK(false, "dpgate kernels: x86 instruction sets on a non-x86 build");
#endif
  }
  const int64_t num_vectors = (N + plan.lanes - 1) / plan.lanes;
  const int64_t num_tiles = (num_vectors + plan.vectors - 1) / plan.vectors;
  at::parallel_for(0, num_tiles, 1, [&](int64_t begin, int64_t end) {
    switch (isa) {
      case Isa::kScalar: return scalar::quant_linear(args, plan, begin, end);
#if defined(__x86_64__)
      case Isa::kAvx2: return avx2::quant_linear(args, plan, begin, end);
      case Isa::kAvx512: return avx512::quant_linear(args, plan, begin, end);
#else
      default: return;
#endif
    }
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> attention(const at::Tensor& q, const at::Tensor& key_cache,
                                             const at::Tensor& value_cache, const at::Tensor& block_tables,
                                             const at::Tensor& token_seq, const at::Tensor& positions,
                                             int64_t block_size, double scale, int64_t window,
                                             const std::string& isa_name, int64_t dcp_size, int64_t dcp_rank,
                                             int64_t interleave, bool with_lse) {
  const Isa isa = parse_isa(isa_name);
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous(), "dpgate attention: q must be [T, H, D] and contiguous");
  TORCH_CHECK(key_cache.dim() == 3 && key_cache.is_contiguous() && value_cache.sizes() == key_cache.sizes() &&
                  value_cache.is_contiguous() && value_cache.scalar_type() == key_cache.scalar_type(),
              "dpgate attention: caches must be [KVH, slots, D], contiguous and alike");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), KVH = key_cache.size(0);
  TORCH_CHECK(key_cache.size(2) == D && D % 8 == 0, "dpgate attention: head size must match and be a multiple of 8");
  TORCH_CHECK(KVH > 0 && H % KVH == 0, "dpgate attention: heads must be a multiple of kv heads");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.scalar_type() == at::kInt && block_tables.is_contiguous(),
              "dpgate attention: block_tables must be int32 [seqs, blocks]");
  TORCH_CHECK(token_seq.scalar_type() == at::kInt && token_seq.numel() == T && token_seq.is_contiguous(),
              "dpgate attention: token_seq must be int32 [T]");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.numel() == T && positions.is_contiguous(),
              "dpgate attention: positions must be int64 [T]");
  TORCH_CHECK(block_size > 0, "dpgate attention: block_size must be positive");
  TORCH_CHECK(dcp_size >= 1 && 0 <= dcp_rank && dcp_rank < dcp_size && interleave >= 1 &&
                  block_size % interleave == 0,
              "dpgate attention: need 0 <= dcp_rank < dcp_size and an interleave dividing block_size");
  at::Tensor out = at::empty_like(q);
  at::Tensor lse = at::empty({with_lse ? T : 0, H}, q.options().dtype(at::kFloat));
  if (T == 0) return {out, lse};
  AttentionArgs args{q.data_ptr(), out.data_ptr(), activation_dtype(q, "q"),
                     key_cache.data_ptr(), value_cache.data_ptr(), activation_dtype(key_cache, "cache"),
                     block_tables.data_ptr<int32_t>(), block_tables.size(1), token_seq.data_ptr<int32_t>(),
                     positions.data_ptr<int64_t>(), T, H, KVH, D, key_cache.size(1), block_size, window,
                     static_cast<float>(scale), dcp_size, dcp_rank, interleave,
                     with_lse ? lse.data_ptr<float>() : nullptr};
  const int64_t items = T * KVH;
  const int64_t shares = std::min<int64_t>(items, at::get_num_threads());
  at::parallel_for(0, shares, 1, [&](int64_t begin, int64_t end) {
    for (int64_t share = begin; share < end; ++share) {
      if (isa == Isa::kScalar) scalar::attention(args, share, items, shares);
#if defined(__x86_64__)
      else if (isa == Isa::kAvx512) avx512::attention(args, share, items, shares);
      else avx2::attention(args, share, items, shares);
#endif
    }
  });
  return {out, lse};
}

// outs [C, slot_tokens, slot_heads, D], lses [C, slot_tokens, slot_heads] (float32, contiguous):
// combine rows 0..T-1 of heads head_offset .. head_offset + heads. Returns (out [T, heads, D], lse).
std::tuple<at::Tensor, at::Tensor> dcp_combine(const at::Tensor& outs, const at::Tensor& lses, int64_t T,
                                               int64_t head_offset, int64_t heads, const std::string& isa_name) {
  const Isa isa = parse_isa(isa_name);
  TORCH_CHECK(outs.dim() == 4 && outs.scalar_type() == at::kFloat && outs.is_contiguous() && lses.dim() == 3 &&
                  lses.scalar_type() == at::kFloat && lses.is_contiguous() &&
                  lses.sizes() == outs.sizes().slice(0, 3),
              "dpgate dcp_combine: outs [C, tokens, heads, D] and lses [C, tokens, heads], float32, contiguous");
  const int64_t C = outs.size(0), D = outs.size(3);
  TORCH_CHECK(C >= 1 && C <= 64 && D % 8 == 0, "dpgate dcp_combine: 1..64 ranks and a head size multiple of 8");
  TORCH_CHECK(0 <= T && T <= outs.size(1) && 0 <= head_offset && heads >= 0 && head_offset + heads <= outs.size(2),
              "dpgate dcp_combine: rows or heads out of range");
  at::Tensor out = at::empty({T, heads, D}, outs.options());
  at::Tensor lse = at::empty({T, heads}, outs.options());
  CombineArgs args{outs.data_ptr<float>(), lses.data_ptr<float>(), C, outs.size(1), outs.size(2), D,
                   T, head_offset, heads, out.data_ptr<float>(), lse.data_ptr<float>()};
  at::parallel_for(0, T * heads, 16, [&](int64_t begin, int64_t end) {
    if (isa == Isa::kScalar) scalar::dcp_combine(args, begin, end);
#if defined(__x86_64__)
    else avx2::dcp_combine(args, begin, end);
#endif
  });
  return {out, lse};
}

// Cross-process signals in shared memory (engines/parallel/dcp_exchange.py): a release store of
// an epoch, and an acquire wait for it, so data written before the store is seen after the wait.
void signal_store(const at::Tensor& flags, int64_t index, int64_t value) {
  TORCH_CHECK(flags.scalar_type() == at::kLong && flags.is_contiguous() && 0 <= index && index < flags.numel(),
              "dpgate signal_store: flags must be int64 and index in range");
  std::atomic_ref<int64_t>(flags.data_ptr<int64_t>()[index]).store(value, std::memory_order_release);
}

// Waits until flags[index] == value; false after timeout_s. Spins briefly, then yields the CPU,
// so a waiting rank does not starve a computing one on a shared core.
bool signal_wait(const at::Tensor& flags, int64_t index, int64_t value, double timeout_s) {
  TORCH_CHECK(flags.scalar_type() == at::kLong && flags.is_contiguous() && 0 <= index && index < flags.numel(),
              "dpgate signal_wait: flags must be int64 and index in range");
  std::atomic_ref<int64_t> flag(flags.data_ptr<int64_t>()[index]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (int64_t spins = 0;; ++spins) {
    if (flag.load(std::memory_order_acquire) == value) return true;
    if (spins < 2000) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
      continue;
    }
    if ((spins & 63) == 0 && std::chrono::steady_clock::now() > deadline) return false;
    sched_yield();
  }
}

// Waits for flags[first + k * stride] == value for k in 0..count-1; returns the first k that did
// not arrive within timeout_s, or -1 when all did.
int64_t signal_wait_all(const at::Tensor& flags, int64_t first, int64_t stride, int64_t count, int64_t value,
                        double timeout_s) {
  for (int64_t k = 0; k < count; ++k) {
    if (!signal_wait(flags, first + k * stride, value, timeout_s)) return k;
  }
  return -1;
}

// The DCP sender's half (engines/parallel/dcp_exchange.py): every row's LSE into lse_slot, and
// the output rows that have keys (a finite LSE in every head) into out_slot; rows without keys
// send no payload, so their slot rows keep whatever they held.
void dcp_publish(const at::Tensor& out, const at::Tensor& lse, const at::Tensor& out_slot, const at::Tensor& lse_slot) {
  TORCH_CHECK(out.scalar_type() == at::kFloat && lse.scalar_type() == at::kFloat && out.is_contiguous() &&
                  lse.is_contiguous() && out_slot.is_contiguous() && lse_slot.is_contiguous() && out.dim() == 3 &&
                  lse.dim() == 2 && out.size(0) == lse.size(0) && out.size(1) == lse.size(1) &&
                  out_slot.size(0) >= out.size(0) && out_slot.size(1) == out.size(1) && out_slot.size(2) == out.size(2),
              "dpgate dcp_publish: out [T, H, D] and lse [T, H] float32 into slots of at least T rows");
  const int64_t T = out.size(0), H = out.size(1), D = out.size(2);
  const float* src_out = out.data_ptr<float>();
  const float* src_lse = lse.data_ptr<float>();
  float* dst_out = out_slot.data_ptr<float>();
  float* dst_lse = lse_slot.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    bool has_keys = true;
    for (int64_t h = 0; h < H; ++h) {
      dst_lse[t * H + h] = src_lse[t * H + h];
      has_keys = has_keys && std::isfinite(src_lse[t * H + h]);
    }
    if (has_keys) std::memcpy(dst_out + t * H * D, src_out + t * H * D, sizeof(float) * H * D);
  }
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, const std::string& isa_name) {
  const Isa isa = parse_isa(isa_name);
  const int64_t N = x.size(-1);
  TORCH_CHECK(N % 8 == 0, "dpgate rms_norm: the normalized size must be a multiple of 8");
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.is_contiguous() && weight.numel() == N,
              "dpgate rms_norm: weight must be float32 [N]");
  const at::Tensor input = x.contiguous();
  at::Tensor out = at::empty_like(input);
  const int64_t rows = input.numel() / N;
  NormArgs args{input.data_ptr(), out.data_ptr(), activation_dtype(x, "rms_norm input"), weight.data_ptr<float>(),
                N, static_cast<float>(eps)};
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    if (isa == Isa::kScalar) scalar::rms_norm(args, begin, end);
#if defined(__x86_64__)
    else avx2::rms_norm(args, begin, end);
#endif
  });
  return out;
}

at::Tensor act_and_mul(const at::Tensor& x, const std::string& activation, const std::string& isa_name) {
  const Isa isa = parse_isa(isa_name);
  TORCH_CHECK(activation == "silu" || activation == "gelu_tanh", "dpgate act_and_mul: unknown activation ",
              activation);
  const int64_t I = x.size(-1) / 2;
  TORCH_CHECK(x.size(-1) == 2 * I && I % 8 == 0, "dpgate act_and_mul: the last size must be 2 * I, I % 8 == 0");
  const at::Tensor input = x.contiguous();
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = I;
  at::Tensor out = at::empty(shape, x.options());
  const int64_t rows = input.numel() / (2 * I);
  ActArgs args{input.data_ptr(), out.data_ptr(), activation_dtype(x, "act_and_mul input"), I,
               activation == "silu" ? Activation::kSilu : Activation::kGeluTanh};
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    if (isa == Isa::kScalar) scalar::act_and_mul(args, begin, end);
#if defined(__x86_64__)
    else avx2::act_and_mul(args, begin, end);
#endif
  });
  return out;
}

}  // namespace
}  // namespace dpgate

TORCH_LIBRARY(dpgate, m) {
  m.def("supported_isas() -> str[]", &dpgate::supported_isas);
  m.def("linear(Tensor x, Tensor packed, Tensor? scales, int out_features, str isa) -> Tensor", &dpgate::linear);
  m.def(
      "quant_linear(Tensor x, Tensor codes, Tensor scales, Tensor? offsets, int group, int out_features, "
      "str isa) -> Tensor",
      &dpgate::quant_linear);
  m.def(
      "attention(Tensor q, Tensor key_cache, Tensor value_cache, Tensor block_tables, Tensor token_seq, "
      "Tensor positions, int block_size, float scale, int window, str isa, int dcp_size, int dcp_rank, "
      "int interleave, bool with_lse) -> (Tensor, Tensor)",
      &dpgate::attention);
  m.def("signal_store(Tensor flags, int index, int value) -> ()", &dpgate::signal_store);
  m.def("signal_wait(Tensor flags, int index, int value, float timeout_s) -> bool", &dpgate::signal_wait);
  m.def("signal_wait_all(Tensor flags, int first, int stride, int count, int value, float timeout_s) -> int",
        &dpgate::signal_wait_all);
  m.def("dcp_publish(Tensor out, Tensor lse, Tensor out_slot, Tensor lse_slot) -> ()", &dpgate::dcp_publish);
  m.def("dcp_combine(Tensor outs, Tensor lses, int T, int head_offset, int heads, str isa) -> (Tensor, Tensor)",
        &dpgate::dcp_combine);
  m.def("rms_norm(Tensor x, Tensor weight, float eps, str isa) -> Tensor", &dpgate::rms_norm);
  m.def("act_and_mul(Tensor x, str activation, str isa) -> Tensor", &dpgate::act_and_mul);
}
