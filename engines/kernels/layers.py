"""Put a loaded model on the batch-invariant kernels: its linear layers, norms and MLP activations.

`use_invariant_kernels` swaps modules in place, the way quantization does: every bias-free
nn.Linear (the tied lm_head included) becomes a `KernelLinear` over packed int8 (one scale per
output row, symmetric max-abs / 127) or unquantized weights, every RMSNorm a `KernelRMSNorm`,
and every gated MLP computes activation(gate) * up in one kernel. Attention goes through the
kernel when the runner's AttentionMetadata names an instruction set (engines/attention.py).
The model's own code is unchanged: the layers keep their names and call signatures.
"""

from __future__ import annotations

import torch
from torch import nn

from engines import kernels
from engines.models.gemma3 import GemmaRMSNorm
from engines.models.llama import LlamaMLP, RMSNorm
from engines.quantization import quantize_rows_int8


class KernelLinear(nn.Module):
    """y = x @ W.T through `kernels.linear`; W packed once, int8 with per-row scales or as loaded."""

    def __init__(self, linear: nn.Linear, quantization: str, isa: str):
        super().__init__()
        if linear.bias is not None:
            raise ValueError("KernelLinear supports linear layers without bias only")
        if quantization == "int8":
            self.packed = kernels.pack_weight(*quantize_rows_int8(linear.weight))
        else:
            weight = linear.weight.detach()
            self.packed = kernels.pack_weight(weight if weight.dtype == torch.bfloat16 else weight.float())
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.isa = isa

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.linear(x, self.packed, self.isa)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, isa={self.isa}"


class KernelRMSNorm(nn.Module):
    """RMSNorm through `kernels.rms_norm`, with the effective float32 scale (Gemma's 1 + w)."""

    def __init__(self, norm: RMSNorm, isa: str):
        super().__init__()
        weight = norm.weight.detach().float()
        if isinstance(norm, GemmaRMSNorm):
            weight = 1.0 + weight
        self.register_buffer("weight", weight.contiguous())
        self.eps = norm.eps
        self.isa = isa

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.rms_norm(x, self.weight, self.eps, self.isa)


def use_invariant_kernels(model: nn.Module, quantization: str, isa: str) -> nn.Module:
    """Swap the model's linear layers, norms and MLP activations for the kernels', in place."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear) and child.bias is None:
            setattr(model, name, KernelLinear(child, quantization, isa))
        elif isinstance(child, RMSNorm):
            setattr(model, name, KernelRMSNorm(child, isa))
        else:
            if isinstance(child, LlamaMLP):
                child.use_kernel(isa)
            use_invariant_kernels(child, quantization, isa)
    return model
