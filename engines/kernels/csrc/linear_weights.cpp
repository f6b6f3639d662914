// Linear weights in row parts (linear_weights.h): checked when packed, run through dispatch.cpp.
#include "linear_weights.h"

#include <ATen/ops/empty.h>

#include <algorithm>

namespace dpgate {

LinearPart packed_part(const at::Tensor& panels, const std::optional<at::Tensor>& scales, int64_t out_features) {
  TORCH_CHECK(panels.dim() == 3 && panels.size(2) == kPanelWidth && panels.is_contiguous(),
              "dpgate linear: weights must be packed [ceil(N/16), K, 16] and contiguous");
  TORCH_CHECK(out_features > 0 && out_features <= panels.size(0) * kPanelWidth,
              "dpgate linear: out_features out of range");
  if (dtype_of(panels, "weights") == DType::kInt8) {
    TORCH_CHECK(scales.has_value() && scales->scalar_type() == at::kFloat && scales->is_contiguous() &&
                    scales->numel() == panels.size(0) * kPanelWidth,
                "dpgate linear: int8 weights need float32 scales padded to ceil(N/16)*16");
  }
  return {PartKind::kPacked, panels, scales, std::nullopt, 0, out_features};
}

LinearPart quantized_part(const at::Tensor& codes, const at::Tensor& scales, const std::optional<at::Tensor>& offsets,
                          int64_t group, int64_t out_features) {
  const bool nibbles = codes.scalar_type() == at::kByte;
  TORCH_CHECK(codes.dim() == 3 && codes.is_contiguous() && (nibbles || codes.scalar_type() == at::kChar) &&
                  codes.size(2) == kPanelWidth,
              "dpgate quant_linear: codes must be uint8 nibble pairs [P, K / 2, 16] or int8 [P, K, 16], contiguous");
  const int64_t P = codes.size(0), K = codes.size(1) * (nibbles ? 2 : 1);
  TORCH_CHECK(group > 0 && group % 2 == 0 && K % group == 0,
              "dpgate quant_linear: the group size must be even and divide K");
  TORCH_CHECK(out_features > 0 && out_features <= P * kPanelWidth, "dpgate quant_linear: out_features out of range");
  auto check_scales = [&](const at::Tensor& t, const char* what) {
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.dim() == 3 && t.size(0) == P &&
                    t.size(1) == K / group && t.size(2) == kPanelWidth,
                "dpgate quant_linear: ", what, " must be float32 [P, K / group, 16], contiguous");
  };
  check_scales(scales, "scales");
  if (offsets.has_value()) check_scales(*offsets, "offsets");
  return {PartKind::kQuantized, codes, scales, offsets, group, out_features};
}

LinearPart int_dot_part(const at::Tensor& codes, const at::Tensor& scales, const std::optional<at::Tensor>& offsets,
                        int64_t group, bool nibbles, int64_t bias, int64_t out_features) {
  TORCH_CHECK(codes.dim() == 3 && codes.is_contiguous() && codes.scalar_type() == at::kByte &&
                  codes.size(2) == 4 * kPanelWidth,
              "dpgate int_linear: codes must be uint8 [P, K / 4 (bytes) or K / 8 (nibbles), 64], contiguous");
  const int64_t P = codes.size(0), K = codes.size(1) * (nibbles ? 8 : 4);
  TORCH_CHECK((group == 16 || group == 32) && K % kActGroup == 0,
              "dpgate int_linear: the group size must be 16 or 32 and K a multiple of ", kActGroup);
  TORCH_CHECK(nibbles ? bias == 0 : (bias == 0 || bias == 128),
              "dpgate int_linear: the code bias must be 0 for nibbles, 0 or 128 for bytes");
  TORCH_CHECK(out_features > 0 && out_features <= P * kPanelWidth, "dpgate int_linear: out_features out of range");
  auto check_scales = [&](const at::Tensor& t, const char* what) {
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.dim() == 3 && t.size(0) == P &&
                    t.size(1) == K / group && t.size(2) == kPanelWidth,
                "dpgate int_linear: ", what, " must be float32 [P, K / group, 16], contiguous");
  };
  check_scales(scales, "scales");
  if (offsets.has_value()) check_scales(*offsets, "offsets");
  LinearPart part{PartKind::kIntDot, codes, scales, offsets, group, out_features};
  part.nibbles = nibbles;
  part.bias = int32_t(bias);
  return part;
}

int64_t part_in_features(const LinearPart& part) {
  switch (part.kind) {
    case PartKind::kPacked: return part.data.size(1);
    case PartKind::kQuantized: return part.data.size(1) * (part.data.scalar_type() == at::kByte ? 2 : 1);
    case PartKind::kIntDot: return part.data.size(1) * (part.nibbles ? 8 : 4);
  }
  return 0;
}

namespace {

// Activations quantized for the integer kernels, one buffer per calling thread, grown to the
// widest call and reused.
struct IntBuffers {
  std::vector<int8_t> codes;
  std::vector<float> scales;
  std::vector<int32_t> sums;
};

IntActs quantize_for_int_dot(Isa isa, const float* a, int64_t lda, int64_t M, int64_t K) {
  thread_local IntBuffers buffers;
  buffers.codes.resize(size_t(M * K));
  buffers.scales.resize(size_t(M * K / kActGroup));
  buffers.sums.resize(size_t(M * K / 16));
  const IntActs acts{a, lda, buffers.codes.data(), buffers.scales.data(), buffers.sums.data(), M, K};
  launch_int_quantize(isa, acts);
  return acts;
}

void run_part(Isa isa, const LinearPart& part, const float* a, int64_t lda, int64_t M, void* out, DType out_type,
              int64_t ldo, int64_t col0, const IntActs* acts) {
  const int64_t K = part_in_features(part), N = part.out_features;
  const size_t element = out_type == DType::kFloat32 ? sizeof(float) : sizeof(uint16_t);  // bfloat16
  void* columns = static_cast<char*>(out) + col0 * element;
  if (part.kind == PartKind::kIntDot) {
    const IntLinearArgs args{acts->codes, acts->scales, acts->sums, static_cast<const uint8_t*>(part.data.data_ptr()),
                             part.nibbles, part.bias, part.group, part.scales->data_ptr<float>(),
                             part.offsets.has_value() ? part.offsets->data_ptr<float>() : nullptr,
                             columns, out_type, ldo, M, N, K};
    launch_int_linear(isa, args);
    return;
  }
  if (part.kind == PartKind::kPacked) {
    const DType weight_type = dtype_of(part.data, "weights");
    const float* scales = weight_type == DType::kInt8 ? part.scales->data_ptr<float>() : nullptr;
    launch_linear(isa, {a, lda, part.data.data_ptr(), weight_type, scales, columns, out_type, ldo, M, N, K});
    return;
  }
  const QuantLinearArgs args{a, lda, static_cast<const uint8_t*>(part.data.data_ptr()),
                             part.data.scalar_type() == at::kByte, part.group, part.scales->data_ptr<float>(),
                             part.offsets.has_value() ? part.offsets->data_ptr<float>() : nullptr,
                             columns, out_type, ldo, M, N, K, M >= kQuantGemmRows};
  launch_quant_linear(isa, args);
}

}  // namespace

void run_parts_into(Isa isa, const std::vector<LinearPart>& parts, const float* a, int64_t lda, int64_t M, void* out,
                    DType out_type, int64_t ldo) {
  if (M == 0 || parts.empty()) return;
  const bool int_dot = std::any_of(parts.begin(), parts.end(), [](const LinearPart& p) {
    return p.kind == PartKind::kIntDot;
  });
  IntActs acts{};
  if (int_dot) acts = quantize_for_int_dot(isa, a, lda, M, part_in_features(parts[0]));
  int64_t col0 = 0;
  for (const LinearPart& part : parts) {
    run_part(isa, part, a, lda, M, out, out_type, ldo, col0, int_dot ? &acts : nullptr);
    col0 += part.out_features;
  }
}

at::Tensor run_parts(Isa isa, const std::vector<LinearPart>& parts, int64_t in_features, int64_t out_features,
                     const at::Tensor& x) {
  const DType out_type = activation_dtype(x, "linear input");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == in_features, "dpgate linear: input has ", x.size(-1), " features, weights ",
              in_features);
  const at::Tensor a = x.reshape({-1, in_features}).to(at::kFloat).contiguous();
  const int64_t M = a.size(0);
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = out_features;
  at::Tensor out = at::empty(out_shape, x.options());
  run_parts_into(isa, parts, a.data_ptr<float>(), in_features, M, out.data_ptr(), out_type, out_features);
  return out;
}

void LinearWeights::add(LinearPart part) {
  TORCH_CHECK(part_in_features(part) == in_features_, "dpgate LinearWeights: a part has ", part_in_features(part),
              " input features, the layer ", in_features_);
  out_features_ += part.out_features;
  parts_.push_back(std::move(part));
}

void LinearWeights::add_packed(const at::Tensor& panels, const std::optional<at::Tensor>& scales,
                               int64_t out_features) {
  add(packed_part(panels, scales, out_features));
}

void LinearWeights::add_quantized(const at::Tensor& codes, const at::Tensor& scales,
                                  const std::optional<at::Tensor>& offsets, int64_t group, int64_t out_features) {
  add(quantized_part(codes, scales, offsets, group, out_features));
}

void LinearWeights::add_int_dot(const at::Tensor& codes, const at::Tensor& scales,
                                const std::optional<at::Tensor>& offsets, int64_t group, bool nibbles, int64_t bias,
                                int64_t out_features) {
  add(int_dot_part(codes, scales, offsets, group, nibbles, bias, out_features));
}

at::Tensor LinearWeights::forward(const at::Tensor& x, const std::string& isa) const {
  TORCH_CHECK(!parts_.empty(), "dpgate LinearWeights: no weights were added");
  return run_parts(parse_isa(isa), parts_, in_features_, out_features_, x);
}

void LinearWeights::run(Isa isa, const float* a, int64_t lda, int64_t M, void* out, DType out_type,
                        int64_t ldo) const {
  run_parts_into(isa, parts_, a, lda, M, out, out_type, ldo);
}

}  // namespace dpgate
