// torch operators over the batch-invariant kernels (torch.ops.dpgate.*).
//
// This file checks tensors and hands them to dispatch.cpp, which runs the instruction set the
// caller named (engines/kernels decides which, once) on torch's intra-op threads.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <sched.h>
#include <string>
#include <tuple>
#include <vector>

#include "dispatch.h"
#include "kernels.h"
#include "linear_weights.h"

namespace dpgate {
namespace {

std::vector<std::string> supported_isas() {
  std::vector<std::string> names{"scalar"};
  if (cpu_has("avx2")) names.emplace_back("avx2");
  if (cpu_has("avx512")) names.emplace_back("avx512");
  if (cpu_has("avx512_vnni")) names.emplace_back("avx512_vnni");
  return names;
}

// "" when `isa`'s integer kernels gave the scalar reference's bits on this CPU (dispatch.h).
std::string isa_self_check(const std::string& isa_name, bool inject_fault) {
  Isa isa = Isa::kScalar;
  if (isa_name == "avx512_vnni") {
    TORCH_CHECK(cpu_has("avx512_vnni"), "dpgate kernels: this CPU lacks AVX512-VNNI");
    isa = Isa::kAvx512Vnni;
  } else {
    isa = parse_isa(isa_name);
  }
  return int_self_check(isa, inject_fault);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& scales,
                  int64_t out_features, const std::string& isa_name) {
  const LinearPart part = packed_part(packed, scales, out_features);
  return run_parts(parse_isa(isa_name), {part}, part_in_features(part), out_features, x);
}

// Block-quantized weights (quant_linear.h): codes uint8 nibble pairs [P, K / 2, 16] or int8 [P, K, 16];
// scales and offsets float32 [P, K / group, 16] (offsets optional).
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                        const std::optional<at::Tensor>& offsets, int64_t group, int64_t out_features,
                        const std::string& isa_name) {
  const LinearPart part = quantized_part(codes, scales, offsets, group, out_features);
  return run_parts(parse_isa(isa_name), {part}, part_in_features(part), out_features, x);
}

// Integer dot products (int_linear.h): codes uint8 [P, K / 4 or K / 8 (nibbles), 64], scales and
// offsets float32 [P, K / group, 16] (offsets optional), u = q + bias.
at::Tensor int_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                      const std::optional<at::Tensor>& offsets, int64_t group, bool nibbles, int64_t bias,
                      int64_t out_features, const std::string& isa_name) {
  const LinearPart part = int_dot_part(codes, scales, offsets, group, nibbles, bias, out_features);
  return run_parts(parse_isa(isa_name), {part}, part_in_features(part), out_features, x);
}

// The integer kernels' activation quantization alone (int_linear.h), for tests: x float32
// [M, K], K a multiple of 32 -> codes int8 [M, K], scales float32 [M, K / 32], sums int32 [M, K / 16].
std::tuple<at::Tensor, at::Tensor, at::Tensor> int_quantize(const at::Tensor& x, const std::string& isa_name) {
  const Isa isa = parse_isa(isa_name);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.size(1) % kActGroup == 0,
              "dpgate int_quantize: x must be float32 [M, K] with K a multiple of ", kActGroup);
  const at::Tensor a = x.contiguous();
  const int64_t M = a.size(0), K = a.size(1);
  at::Tensor codes = at::empty({M, K}, a.options().dtype(at::kChar));
  at::Tensor scales = at::empty({M, K / kActGroup}, a.options());
  at::Tensor sums = at::empty({M, K / 16}, a.options().dtype(at::kInt));
  launch_int_quantize(isa, {a.data_ptr<float>(), K, codes.data_ptr<int8_t>(), scales.data_ptr<float>(),
                            sums.data_ptr<int32_t>(), M, K});
  return {codes, scales, sums};
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
  launch_attention(isa, args);
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
  launch_dcp_combine(isa, args);
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
  launch_rms_norm(isa, args, rows);
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
  launch_act_and_mul(isa, args, rows);
  return out;
}

// For each byte value, the eight lanes it keeps: all ones where its bit is set, else zero.
struct ByteLanes {
  uint32_t lanes[256][8];
  constexpr ByteLanes() : lanes() {
    for (int byte = 0; byte < 256; ++byte) {
      for (int b = 0; b < 8; ++b) lanes[byte][b] = (byte >> b) & 1 ? 0xFFFFFFFFu : 0u;
    }
  }
};
constexpr ByteLanes kByteLanes;

// Eight logits of one mask byte: kept lanes keep their bits, the others become -inf (as bits).
inline void mask_eight(const float* src, float* dst, uint32_t byte) {
  constexpr uint32_t kNegInf = 0xFF800000u;
  const uint32_t* keep = kByteLanes.lanes[byte];
  uint32_t in[8], out[8];
  std::memcpy(in, src, sizeof(in));
  for (int b = 0; b < 8; ++b) out[b] = (in[b] & keep[b]) | (kNegInf & ~keep[b]);
  std::memcpy(dst, out, sizeof(out));
}

// Grammar masks (engines/grammar/bitmask.py): out[j, t] = logits[rows[j], t] where bit t % 32 of
// bitmask[j, t / 32] is set, else -inf, for t < vocab_size. One pass that copies and masks: a word
// of all ones is a plain copy, a zero word a fill, mixed words go eight lanes at a time by bit
// operations (a table per mask byte, so no branch per token). Exact (a kept logit keeps its bits),
// and each row from its own row alone.
void mask_rows(const at::Tensor& logits, const at::Tensor& rows, const at::Tensor& bitmask, const at::Tensor& out,
               int64_t vocab_size) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.stride(1) == 1,
              "dpgate mask_rows: logits must be float32 [batch, vocab] with contiguous rows");
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong && rows.is_contiguous(),
              "dpgate mask_rows: rows must be int64 [R]");
  const int64_t R = rows.size(0), words = (vocab_size + 31) / 32;
  TORCH_CHECK(0 < vocab_size && vocab_size <= logits.size(1), "dpgate mask_rows: vocab_size out of range");
  TORCH_CHECK(bitmask.dim() == 2 && bitmask.scalar_type() == at::kInt && bitmask.is_contiguous() &&
                  bitmask.size(0) >= R && bitmask.size(1) >= words,
              "dpgate mask_rows: bitmask must be int32 [>= R, >= ceil(vocab / 32)], contiguous");
  TORCH_CHECK(out.dim() == 2 && out.scalar_type() == at::kFloat && out.is_contiguous() && out.size(0) >= R &&
                  out.size(1) >= vocab_size,
              "dpgate mask_rows: out must be float32 [>= R, >= vocab], contiguous");
  const int64_t* row_ids = rows.data_ptr<int64_t>();
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < R; ++j) {
    TORCH_CHECK(0 <= row_ids[j] && row_ids[j] < logits.size(0), "dpgate mask_rows: a row index is out of range");
    const float* src = logits.data_ptr<float>() + row_ids[j] * logits.stride(0);
    float* dst = out.data_ptr<float>() + j * out.stride(0);
    const uint32_t* bits = reinterpret_cast<const uint32_t*>(bitmask.data_ptr<int32_t>()) + j * bitmask.stride(0);
    for (int64_t w = 0; w < words; ++w) {
      const int64_t begin = 32 * w, n = std::min<int64_t>(32, vocab_size - begin);
      const uint32_t word = bits[w];
      if (n == 32 && word == 0xFFFFFFFFu) {
        std::memcpy(dst + begin, src + begin, sizeof(float) * 32);
      } else if (word == 0) {
        std::fill(dst + begin, dst + begin + n, kMasked);
      } else if (n == 32) {
        for (int k = 0; k < 4; ++k) mask_eight(src + begin + 8 * k, dst + begin + 8 * k, (word >> (8 * k)) & 0xFFu);
      } else {  // the vocabulary's last, partial word
        for (int64_t b = 0; b < n; ++b) dst[begin + b] = (word >> b) & 1u ? src[begin + b] : kMasked;
      }
    }
  }
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
      "int_linear(Tensor x, Tensor codes, Tensor scales, Tensor? offsets, int group, bool nibbles, int bias, "
      "int out_features, str isa) -> Tensor",
      &dpgate::int_linear);
  m.def("isa_self_check(str isa, bool inject_fault) -> str", &dpgate::isa_self_check);
  m.def("int_quantize(Tensor x, str isa) -> (Tensor, Tensor, Tensor)", &dpgate::int_quantize);
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
  m.def("mask_rows(Tensor logits, Tensor rows, Tensor bitmask, Tensor(a!) out, int vocab_size) -> ()",
        &dpgate::mask_rows);
}
