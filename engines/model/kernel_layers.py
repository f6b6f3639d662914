"""Put a loaded model on the batch-invariant kernels: its linear layers, norms and MLP activations.

`use_invariant_kernels` swaps modules in place, the way quantization does: every bias-free
nn.Linear (the tied lm_head included) becomes a `KernelLinear` over packed int8 (one scale per
output row, symmetric max-abs / 127), unquantized weights, or (`--quantization gguf`) the GGUF's
own quantized blocks (engines/kernels/gguf_blocks.py), which `--quantization int-dot` multiplies
by activations quantized to int8 with exact integer sums (csrc/int_linear.h; qkv_proj and
down_proj keep float32 activations over int8 weights, see FLOAT_ACTIVATION_LAYERS), every RMSNorm
a `KernelRMSNorm`,
and every gated MLP computes activation(gate) * up in one kernel. Attention goes through the
kernel when the runner's AttentionMetadata names an instruction set (engines/kv/attention.py).
The model's own code is unchanged: the layers keep their names and call signatures.
"""

from __future__ import annotations

import torch
from torch import nn

from engines import kernels
from engines.kernels.gguf_blocks import GroupQuantized
from engines.model.gemma3 import GemmaRMSNorm
from engines.model.llama import LlamaMLP, RMSNorm
from engines.model.quantization import quantize_rows_int8

# Under --quantization int-dot, the linear layers that keep float32 activations, over int8 weights
# (one scale per output row, as --quantization int8 serves them): their inputs have outliers that
# an 8-bit grid per 32 values loses. down_proj's (the gated activations) cost +0.09% of SmolLM2's
# perplexity; qkv_proj's (the normed residual stream, whose attention-sink channels are large)
# cost +0.13% and flipped SmolLM2's greedy answer to "What is the capital of France?" in Chat.
# int8 weights rather than the GGUF's blocks in float32 arithmetic, because that path is the
# slowest at batch 1 (docs/engine.md, "Integer dot products", gives the figures for each choice).
FLOAT_ACTIVATION_LAYERS = frozenset({"qkv_proj", "down_proj"})


class KernelLinear(nn.Module):
    """y = x @ W.T through `kernels.linear`; W packed once: int8 with per-row scales, as loaded,
    or as the GGUF's blocks (`shipped`: row parts in order, one per format; each output column
    is computed from its own part alone, so splitting W by rows changes no bit). With `int_dot`
    the GGUF's blocks are multiplied by int8 activations (kernels.IntDotWeight)."""

    def __init__(
        self,
        linear: nn.Linear,
        quantization: str,
        isa: str,
        shipped: list[GroupQuantized] | None = None,
        int_dot: bool = False,
    ):
        super().__init__()
        if linear.bias is not None:
            raise ValueError("KernelLinear supports linear layers without bias only")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        if shipped is not None:
            if sum(p.shape[0] for p in shipped) != self.out_features or {p.shape[1] for p in shipped} != {
                self.in_features
            }:
                raise ValueError(f"GGUF weights {[p.shape for p in shipped]} do not fit a {self.out_features}x"
                                 f"{self.in_features} linear layer")  # fmt: skip
            pack = kernels.pack_int_dot if int_dot else kernels.pack_quantized
            self.parts = [pack(p) for p in shipped]
        elif quantization in ("int8", "gguf", "int-dot"):  # gguf without shipped blocks: the int8 fallback
            self.parts = [kernels.pack_weight(*quantize_rows_int8(linear.weight))]
        else:
            weight = linear.weight.detach()
            self.parts = [kernels.pack_weight(weight if weight.dtype == torch.bfloat16 else weight.float())]
        if shipped is not None:
            self.storage = "gguf/int-dot" if int_dot else "gguf"
        else:
            self.storage = "none" if quantization == "none" else "int8"
        self.isa = isa
        self.weights = kernels.linear_weights(self.parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.parts) == 1:  # an operator call costs a few microseconds less than a class method's
            return kernels.linear(x, self.parts[0], self.isa)
        return self.weights.forward(x, self.isa)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, weights={self.storage}, "
                f"isa={self.isa}")  # fmt: skip


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


def use_invariant_kernels(
    model: nn.Module,
    quantization: str,
    isa: str,
    shipped: dict[str, list[GroupQuantized]] | None = None,
    prefix: str = "",
) -> nn.Module:
    """Swap the model's linear layers, norms and MLP activations for the kernels', in place.
    With quantization "gguf" or "int-dot", `shipped` holds the GGUF's blocks by parameter name; a
    linear layer missing from it is served on int8 (the loader logs why)."""
    for name, child in list(model.named_children()):
        path = prefix + name
        if isinstance(child, nn.Linear) and child.bias is None:
            blocks = (shipped or {}).get(path + ".weight") if quantization in ("gguf", "int-dot") else None
            int_dot = quantization == "int-dot" and name not in FLOAT_ACTIVATION_LAYERS
            if quantization == "int-dot" and not int_dot:
                blocks = None  # float32 activations over int8 weights (FLOAT_ACTIVATION_LAYERS)
            setattr(model, name, KernelLinear(child, quantization, isa, blocks, int_dot))
        elif isinstance(child, RMSNorm):
            setattr(model, name, KernelRMSNorm(child, isa))
        else:
            if isinstance(child, LlamaMLP):
                child.use_kernel(isa)
            use_invariant_kernels(child, quantization, isa, shipped, path + ".")
    return model
