// A linear layer's weights as the kernels read them, checked once when they are packed.
//
// A layer's output columns may come in row parts of different formats (a GGUF stores q, k and v
// of one fused projection as separate tensors, possibly of different quantization types). Each
// part writes its own columns of the one output, at its column offset: every output element is
// computed from its own part alone, so splitting the weight by rows changes no bit, and no
// concatenation is needed afterwards.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>

#include <optional>
#include <string>
#include <vector>

#include "dispatch.h"
#include "kernels.h"

namespace dpgate {

// kPacked: linear.h over float32 activations; kQuantized: quant_linear.h over float32
// activations; kIntDot: int_linear.h over activations quantized to int8.
enum class PartKind { kPacked, kQuantized, kIntDot };

struct LinearPart {
  PartKind kind;
  at::Tensor data;                  // packed panels [P, K, 16] (f32/bf16/int8), or codes (quant_linear.h, int_linear.h)
  std::optional<at::Tensor> scales;  // int8 panels: [P * 16]; quantized and int-dot: [P, K / group, 16]
  std::optional<at::Tensor> offsets;  // quantized and int-dot only, may be absent
  int64_t group;                     // quantized and int-dot only
  int64_t out_features;
  bool nibbles = false;  // int-dot only: codes in nibbles [P, K / 8, 64], else bytes [P, K / 4, 64]
  int32_t bias = 0;      // int-dot only: u = q + bias
};

// Checks a packed weight (linear.h's layout) and returns it as a part; fails naming the rule.
LinearPart packed_part(const at::Tensor& panels, const std::optional<at::Tensor>& scales, int64_t out_features);
// Checks block-quantized weights (quant_linear.h's layout) and returns them as a part.
LinearPart quantized_part(const at::Tensor& codes, const at::Tensor& scales, const std::optional<at::Tensor>& offsets,
                          int64_t group, int64_t out_features);
// Checks integer-dot weights (int_linear.h's layout) and returns them as a part.
LinearPart int_dot_part(const at::Tensor& codes, const at::Tensor& scales, const std::optional<at::Tensor>& offsets,
                        int64_t group, bool nibbles, int64_t bias, int64_t out_features);
int64_t part_in_features(const LinearPart& part);

// y = a @ W.T through the parts in order, each into its own columns of `out` (of out_type, row
// stride ldo) for a float32 [M, K] (row stride lda). Integer-dot parts share one quantization of
// `a` (a buffer of the calling thread).
void run_parts_into(Isa isa, const std::vector<LinearPart>& parts, const float* a, int64_t lda, int64_t M, void* out,
                    DType out_type, int64_t ldo);

// x [..., K] float32 or bfloat16 -> [..., N] in x's dtype through the parts in order.
at::Tensor run_parts(Isa isa, const std::vector<LinearPart>& parts, int64_t in_features, int64_t out_features,
                     const at::Tensor& x);

// torch.classes.dpgate.LinearWeights: the parts of one layer, built once at load.
class LinearWeights : public torch::CustomClassHolder {
 public:
  explicit LinearWeights(int64_t in_features) : in_features_(in_features) {}

  void add_packed(const at::Tensor& panels, const std::optional<at::Tensor>& scales, int64_t out_features);
  void add_quantized(const at::Tensor& codes, const at::Tensor& scales, const std::optional<at::Tensor>& offsets,
                     int64_t group, int64_t out_features);
  void add_int_dot(const at::Tensor& codes, const at::Tensor& scales, const std::optional<at::Tensor>& offsets,
                   int64_t group, bool nibbles, int64_t bias, int64_t out_features);
  at::Tensor forward(const at::Tensor& x, const std::string& isa) const;

  // a float32 [M, in_features] (row stride lda) -> out [M, out_features] of out_type (row stride ldo).
  void run(Isa isa, const float* a, int64_t lda, int64_t M, void* out, DType out_type, int64_t ldo) const;
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

 private:
  void add(LinearPart part);
  std::vector<LinearPart> parts_;
  int64_t in_features_;
  int64_t out_features_ = 0;
};

}  // namespace dpgate
