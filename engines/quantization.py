"""Weight-only int8 quantization of a model's linear layers, for faster decoding on CPU.

Decoding a few sequences reads every weight once per step, so its speed is bounded by memory
bandwidth: int8 weights halve the bytes of bfloat16 ones, and `torch._weight_int8pack_mm`
multiplies by them without materialising a dequantized copy. That kernel only wins for a few
rows, though (measured here: faster up to 4 rows, 1.4x slower at 16, 3x at 256), so each layer
also keeps its int8 weights dequantized into the compute dtype and uses an ordinary matmul for
larger batches and prefill chunks. Both paths multiply by the same int8 grid, one scale per
output row (symmetric, max-abs / 127). The checkpoints served here are 4-bit GGUF files, so 8
bits per row add rounding an order of magnitude below the checkpoint's own quantization step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Row counts up to this use the int8 kernel; larger ones the dequantized weights.
INT8_KERNEL_MAX_ROWS = 4


class Int8Linear(nn.Module):
    """y = x @ (weight_int8 * scales[:, None]).T, computed in the activation dtype."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        if linear.bias is not None:
            raise ValueError("Int8Linear supports linear layers without bias only")
        weight = linear.weight.detach().float()
        scales = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
        quantized = torch.round(weight / scales[:, None]).clamp(-127, 127)
        self.register_buffer("weight_int8", quantized.to(torch.int8))
        self.register_buffer("scales", scales.to(linear.weight.dtype))
        self.register_buffer("weight", (quantized * scales[:, None]).to(linear.weight.dtype))
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] > INT8_KERNEL_MAX_ROWS:
            return F.linear(x, self.weight)
        return torch._weight_int8pack_mm(rows, self.weight_int8, self.scales).reshape(*x.shape[:-1], self.out_features)


def quantize_int8_weight_only(model: nn.Module) -> nn.Module:
    """Replace every bias-free nn.Linear (the tied lm_head included) with an Int8Linear, in place."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear) and child.bias is None:
            setattr(model, name, Int8Linear(child))
        else:
            quantize_int8_weight_only(child)
    return model
