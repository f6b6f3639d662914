"""Weight-only int8 quantization: one grid for both kernel paths, and torch's path over it.

Decoding a few sequences reads every weight once per step, so its speed is bounded by memory
bandwidth: int8 weights read a quarter of float32's bytes. Every linear layer is quantized the
same way, symmetric per output row (max-abs / 127). The checkpoints served here are 4-bit GGUF
files, so 8 bits per row add rounding an order of magnitude below the checkpoint's own step.

The served default multiplies by this grid with dpgate's batch-invariant kernel
(engines/model/kernel_layers.py). `Int8Linear` here is the `--no-batch-invariant` path on torch's
kernels: `torch._weight_int8pack_mm` reads int8 directly but only wins for a few bfloat16 rows
(faster up to 4 rows, 1.4x slower at 16, 3x at 256; with float32 activations it is slower than
a float32 matmul at any size), so each layer also keeps the grid dequantized into the compute
dtype for larger batches. Which of the two runs depends on the row count, so in this path a
row's result depends on its batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# bfloat16 row counts up to this use torch's int8 kernel; larger ones the dequantized weights.
INT8_KERNEL_MAX_ROWS = 4


def quantize_rows_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 weights [N, K] and float32 scales [N], one per output row (max-abs / 127)."""
    weight = weight.detach().float()
    scales = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    quantized = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return quantized, scales


class Int8Linear(nn.Module):
    """y = x @ (weight_int8 * scales[:, None]).T on torch's kernels, computed in the activation dtype."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        if linear.bias is not None:
            raise ValueError("Int8Linear supports linear layers without bias only")
        quantized, scales = quantize_rows_int8(linear.weight)
        dtype = linear.weight.dtype
        self.register_buffer("weight_int8", quantized)
        self.register_buffer("scales", scales.to(dtype))
        self.register_buffer("weight", (quantized.float() * scales[:, None]).to(dtype))
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if x.dtype == torch.float32 or rows.shape[0] > INT8_KERNEL_MAX_ROWS:
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
