// Launching a kernel: pick the instruction set's implementation and split the work over torch's
// intra-op threads. Shared by the single-kernel operators (ops.cpp) and the fused decoder layer
// (decoder_layer.cpp), so both run exactly the same code for the same arguments.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "kernels.h"

namespace dpgate {


// "scalar", "avx2", "avx512" or "avx512_vnni"; fails (a torch error naming the set) if this CPU
// lacks it, or (avx512_vnni) if the set failed its self-check.
Isa parse_isa(const std::string& name);
bool cpu_has(const char* feature);

// Runs the integer kernels of `isa` on a fixed problem on this thread and compares their bits
// with the scalar reference's; "" when they agree, else why not (also an illegal instruction,
// caught). `inject_fault` changes one weight code for `isa`'s run only: the tests' way to see a
// failing check. avx512_vnni is served only after this passed (parse_isa runs it once).
std::string int_self_check(Isa isa, bool inject_fault);

// The kernels' element type of a tensor (float32, bfloat16 or int8); fails naming `what`.
DType dtype_of(const at::Tensor& t, const char* what);
// Like dtype_of, for activations: float32 or bfloat16 only.
DType activation_dtype(const at::Tensor& t, const char* what);

// Each runs the whole operation (every tile, row or item of `args`) on torch's thread pool.
void launch_linear(Isa isa, const LinearArgs& args);
void launch_quant_linear(Isa isa, const QuantLinearArgs& args);
void launch_int_quantize(Isa isa, const IntActs& args);
void launch_int_linear(Isa isa, const IntLinearArgs& args);
void launch_attention(Isa isa, const AttentionArgs& args);
void launch_rms_norm(Isa isa, const NormArgs& args, int64_t rows);
void launch_act_and_mul(Isa isa, const ActArgs& args, int64_t rows);
void launch_dcp_combine(Isa isa, const CombineArgs& args);

}  // namespace dpgate
