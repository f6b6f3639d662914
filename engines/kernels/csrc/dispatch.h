// Launching a kernel: pick the instruction set's implementation and split the work over torch's
// intra-op threads. Shared by the single-kernel operators (ops.cpp) and the fused decoder layer
// (decoder_layer.cpp), so both run exactly the same code for the same arguments.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "kernels.h"

namespace dpgate {

enum class Isa { kScalar, kAvx2, kAvx512 };

// "scalar", "avx2" or "avx512"; fails (a torch error naming the set) if this CPU lacks it.
Isa parse_isa(const std::string& name);
bool cpu_has(const char* feature);

// The kernels' element type of a tensor (float32, bfloat16 or int8); fails naming `what`.
DType dtype_of(const at::Tensor& t, const char* what);
// Like dtype_of, for activations: float32 or bfloat16 only.
DType activation_dtype(const at::Tensor& t, const char* what);

// Each runs the whole operation (every tile, row or item of `args`) on torch's thread pool.
void launch_linear(Isa isa, const LinearArgs& args);
void launch_quant_linear(Isa isa, const QuantLinearArgs& args);
void launch_attention(Isa isa, const AttentionArgs& args);
void launch_rms_norm(Isa isa, const NormArgs& args, int64_t rows);
void launch_act_and_mul(Isa isa, const ActArgs& args, int64_t rows);
void launch_dcp_combine(Isa isa, const CombineArgs& args);

}  // namespace dpgate
