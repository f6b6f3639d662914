"""One C++ call per decoder layer where a model runs whole on one rank in float32.

After `use_invariant_kernels`, a decoder layer is some 27 torch operators a step: at batch 1 the
matmuls are small enough that parsing, dispatching and allocating for those operators costs as
much as the math. `fuse_decoder_layers` gives each layer a torch.classes.dpgate.DecoderLayer
(csrc/decoder_layer.cpp) over the same packed weights and norm scales, which runs the same
kernels in the same order on the same float32 values: its output has the Python layer's bits
(tests/engines/model/test_fused_layer.py compares them with torch.equal). The layer's `forward` takes
the fused path when the step's metadata allows it (`fused_step`); tensor-parallel shards,
bfloat16 activations and torch's own kernels keep the module path.
"""

from __future__ import annotations

import torch
from torch import nn

from engines import kernels
from engines.model.gemma3 import Gemma3DecoderLayer
from engines.model.kernel_layers import KernelLinear, KernelRMSNorm
from engines.model.llama import LlamaDecoderLayer

__all__ = ["fuse_decoder_layers", "unfuse_decoder_layers"]


def fuse_decoder_layers(model: nn.Module, isa: str) -> int:
    """Give every decoder layer the C++ layer can run its `fused` twin; returns how many got one."""
    fused = 0
    for layer in model.layers:
        layer.fused = _fused_layer(layer, model.config.hidden_size, isa)
        fused += layer.fused is not None
    return fused


def unfuse_decoder_layers(model: nn.Module) -> None:
    """Back to the module path (benchmarks compare the two)."""
    for layer in model.layers:
        layer.fused = None


def _norms(layer: nn.Module) -> dict[str, nn.Module] | None:
    """The layer's norms by their role in csrc/decoder_layer.cpp, or None for a layer it does not know."""
    attn = layer.self_attn
    if type(layer) is Gemma3DecoderLayer:
        return {
            "input": layer.input_layernorm, "q": attn.q_norm, "k": attn.k_norm,
            "post_attention": layer.post_attention_layernorm, "pre_mlp": layer.pre_feedforward_layernorm,
            "post_mlp": layer.post_feedforward_layernorm,
        }  # fmt: skip
    if type(layer) is LlamaDecoderLayer and not attn.has_qk_norm:
        return {"input": layer.input_layernorm, "pre_mlp": layer.post_attention_layernorm}
    return None


def _fused_layer(layer: nn.Module, hidden_size: int, isa: str) -> torch.ScriptObject | None:
    attn, mlp = layer.self_attn, layer.mlp
    projections = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    norms = _norms(layer)
    if norms is None or mlp.kernel_isa is None or not all(isinstance(p, KernelLinear) for p in projections):
        return None
    if not all(isinstance(n, KernelRMSNorm) for n in norms.values()) or len({n.eps for n in norms.values()}) != 1:
        return None
    if any(p.isa != isa for p in projections) or any(n.isa != isa for n in norms.values()):
        return None
    kernels.load()
    fused = torch.classes.dpgate.DecoderLayer(
        attn.layer_index, hidden_size, attn.num_heads, attn.num_kv_heads, attn.head_dim, mlp.intermediate_size,
        attn.scale, attn.sliding_window or 0, norms["input"].eps, mlp.activation_name, isa,
    )  # fmt: skip

    def scale(role: str) -> torch.Tensor | None:
        return norms[role].weight if role in norms else None

    fused.set_attention(
        attn.qkv_proj.weights, attn.o_proj.weights, scale("input"), scale("q"), scale("k"), scale("post_attention")
    )
    fused.set_mlp(mlp.gate_up_proj.weights, mlp.down_proj.weights, scale("pre_mlp"), scale("post_mlp"))
    return fused
