"""Load checkpoint weights into `LlamaForCausalLM` or `Gemma3ForCausalLM`, from a GGUF file or a
safetensors directory.

All paths produce the runner's own parameter names (fused `qkv_proj` and `gate_up_proj`).
A Llama GGUF stores q/k rows permuted for llama.cpp's interleaved rotary layout; they are permuted
back so one rotary implementation serves both sources. A Gemma 3 GGUF keeps the checkpoint's row
order but stores every RMSNorm weight plus one; one is subtracted to match the model (and Hugging
Face checkpoints). The model is built on the meta device and the loaded tensors are assigned, so
no time is spent on a random initialisation.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torch import nn

from engines.kernels.gguf_blocks import SUPPORTED, GroupQuantized, concatenate, decode
from engines.model.config import ModelConfig
from engines.model.gguf_reader import GGUFFile
from engines.model.llama import LlamaForCausalLM

_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm.weight",
    "ffn_norm": "post_attention_layernorm.weight",
    "attn_output": "self_attn.o_proj.weight",
    "ffn_down": "mlp.down_proj.weight",
}
_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_GEMMA3_GGUF_NORMS = {
    "attn_norm": "input_layernorm.weight",
    "post_attention_norm": "post_attention_layernorm.weight",
    "ffn_norm": "pre_feedforward_layernorm.weight",
    "post_ffw_norm": "post_feedforward_layernorm.weight",
    "attn_q_norm": "self_attn.q_norm.weight",
    "attn_k_norm": "self_attn.k_norm.weight",
}
_GEMMA3_HF_NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
    "self_attn.q_norm",
    "self_attn.k_norm",
)


def unpermute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head permutation of q/k projection rows (interleaved -> rotate-half)."""
    rows = weight.shape[0]
    half_dim = rows // num_heads // 2
    return weight.reshape(num_heads, half_dim, 2, -1).swapaxes(1, 2).reshape(weight.shape)


def gguf_state_dict(gguf: GGUFFile, config: ModelConfig) -> dict[str, torch.Tensor]:
    """All runner parameters, float32, from a Llama GGUF (dequantized with the `gguf` package)."""
    arrays = _dequantize_all(gguf)

    def take(name: str) -> torch.Tensor:
        return torch.from_numpy(arrays.pop(name))

    state = {"embed_tokens.weight": take("token_embd.weight"), "norm.weight": take("output_norm.weight")}
    if not config.tie_word_embeddings:
        state["lm_head.weight"] = take("output.weight")
    for i in range(config.num_layers):
        prefix = f"layers.{i}."
        for gguf_name, name in _GGUF_LAYER_NAMES.items():
            state[prefix + name] = take(f"blk.{i}.{gguf_name}.weight")
        q = unpermute_rotary_rows(arrays.pop(f"blk.{i}.attn_q.weight"), config.num_heads)
        k = unpermute_rotary_rows(arrays.pop(f"blk.{i}.attn_k.weight"), config.num_kv_heads)
        v = arrays.pop(f"blk.{i}.attn_v.weight")
        state[prefix + "self_attn.qkv_proj.weight"] = torch.from_numpy(np.concatenate([q, k, v]))
        gate_up = [take(f"blk.{i}.ffn_gate.weight"), take(f"blk.{i}.ffn_up.weight")]
        state[prefix + "mlp.gate_up_proj.weight"] = torch.cat(gate_up)
    return state


def _dequantize_all(gguf: GGUFFile) -> dict[str, np.ndarray]:
    with ThreadPoolExecutor(max_workers=2) as pool:  # numpy dequantization releases the GIL
        return dict(zip(gguf.tensors, pool.map(gguf.tensor, gguf.tensors), strict=True))


def gemma3_gguf_state_dict(gguf: GGUFFile, config: ModelConfig) -> dict[str, torch.Tensor]:
    """All runner parameters, float32, from a Gemma 3 GGUF: no q/k row permutation, norms minus one."""
    arrays = _dequantize_all(gguf)

    def take(name: str) -> torch.Tensor:
        return torch.from_numpy(arrays.pop(name))

    state = {"embed_tokens.weight": take("token_embd.weight"), "norm.weight": take("output_norm.weight") - 1}
    if not config.tie_word_embeddings:
        state["lm_head.weight"] = take("output.weight")
    for i in range(config.num_layers):
        prefix = f"layers.{i}."
        for gguf_name, name in _GEMMA3_GGUF_NORMS.items():
            state[prefix + name] = take(f"blk.{i}.{gguf_name}.weight") - 1
        qkv = [take(f"blk.{i}.attn_{p}.weight") for p in "qkv"]
        state[prefix + "self_attn.qkv_proj.weight"] = torch.cat(qkv)
        state[prefix + "self_attn.o_proj.weight"] = take(f"blk.{i}.attn_output.weight")
        state[prefix + "mlp.gate_up_proj.weight"] = torch.cat(
            [take(f"blk.{i}.ffn_gate.weight"), take(f"blk.{i}.ffn_up.weight")]
        )
        state[prefix + "mlp.down_proj.weight"] = take(f"blk.{i}.ffn_down.weight")
    return state


def _hf_tensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory} has no *.safetensors files")
    raw: dict[str, torch.Tensor] = {}
    for file in files:
        raw.update(load_file(file))
    return raw


def _hf_embeddings_and_head(raw: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Take the embeddings, final norm and (untied) lm_head out of a Hugging Face checkpoint."""
    state = {"embed_tokens.weight": raw.pop("model.embed_tokens.weight"), "norm.weight": raw.pop("model.norm.weight")}
    if "lm_head.weight" in raw and not config.tie_word_embeddings:
        state["lm_head.weight"] = raw.pop("lm_head.weight")
    return state


def hf_state_dict(directory: Path, config: ModelConfig) -> dict[str, torch.Tensor]:
    """All runner parameters from a Hugging Face Llama directory's *.safetensors files."""
    raw = _hf_tensors(directory)
    state = _hf_embeddings_and_head(raw, config)
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in raw.items():
        match = _HF_LAYER.fullmatch(name)
        if match:
            layers.setdefault(int(match[1]), {})[match[2]] = tensor
    for i in range(config.num_layers):
        layer, prefix = layers[i], f"layers.{i}."
        state[prefix + "input_layernorm.weight"] = layer["input_layernorm.weight"]
        state[prefix + "post_attention_layernorm.weight"] = layer["post_attention_layernorm.weight"]
        qkv = [layer[f"self_attn.{p}_proj.weight"] for p in "qkv"]
        state[prefix + "self_attn.qkv_proj.weight"] = torch.cat(qkv)
        state[prefix + "self_attn.o_proj.weight"] = layer["self_attn.o_proj.weight"]
        state[prefix + "mlp.gate_up_proj.weight"] = torch.cat(
            [layer["mlp.gate_proj.weight"], layer["mlp.up_proj.weight"]]
        )
        state[prefix + "mlp.down_proj.weight"] = layer["mlp.down_proj.weight"]
    return state


def gemma3_hf_state_dict(directory: Path, config: ModelConfig) -> dict[str, torch.Tensor]:
    """All runner parameters from a Hugging Face Gemma 3 text directory (model_type gemma3_text)."""
    raw = _hf_tensors(directory)
    state = _hf_embeddings_and_head(raw, config)
    for i in range(config.num_layers):
        source, prefix = f"model.layers.{i}.", f"layers.{i}."
        for name in _GEMMA3_HF_NORMS:
            state[f"{prefix}{name}.weight"] = raw.pop(f"{source}{name}.weight")
        qkv = [raw.pop(f"{source}self_attn.{p}_proj.weight") for p in "qkv"]
        state[prefix + "self_attn.qkv_proj.weight"] = torch.cat(qkv)
        state[prefix + "self_attn.o_proj.weight"] = raw.pop(f"{source}self_attn.o_proj.weight")
        gate_up = [raw.pop(f"{source}mlp.gate_proj.weight"), raw.pop(f"{source}mlp.up_proj.weight")]
        state[prefix + "mlp.gate_up_proj.weight"] = torch.cat(gate_up)
        state[prefix + "mlp.down_proj.weight"] = raw.pop(f"{source}mlp.down_proj.weight")
    return state


def build_model(
    config: ModelConfig,
    load_state: Callable[[], dict[str, torch.Tensor]],
    dtype: torch.dtype,
    model_class: type[nn.Module] = LlamaForCausalLM,
    reshape: Callable[[nn.Module], None] | None = None,
) -> nn.Module:
    """Build the model without initialising it, then assign the checkpoint's tensors in `dtype`;
    `reshape` changes layers of the meta model first (a tensor-parallel rank's shapes)."""
    with torch.device("meta"):
        model = model_class(config)
    if reshape is not None:
        reshape(model)
    state = {name: tensor.to(dtype) for name, tensor in load_state().items()}
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    model.load_state_dict(state, strict=False, assign=True)
    missing = [name for name, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ValueError(f"checkpoint lacks weights for: {', '.join(missing[:5])}")
    return model.eval()


def gguf_quantized_weights(gguf: GGUFFile, config: ModelConfig) -> tuple[dict[str, list[GroupQuantized]], list[str]]:
    """The linear layers' weights as the GGUF ships them, by runner parameter name, for
    `--quantization gguf`: each a list of row parts in order (a fused qkv or gate_up whose parts
    are quantized differently keeps one part per format). Also one reason per weight left out
    (a format without a kernel), which then falls back to int8. The rows are permuted and
    concatenated exactly as `gguf_state_dict` does to the dequantized weights."""
    rotary = config.architecture == "llama"  # a Llama GGUF stores q/k rows in llama.cpp's order

    def read(name: str, permute_heads: int = 0) -> GroupQuantized:
        info = gguf.tensors[name]
        if info.qtype not in SUPPORTED or len(info.shape) != 2:
            raise ValueError(f"{name} is {info.qtype.name}")
        weight = decode(gguf.raw(name), info.qtype, info.shape)
        if permute_heads:
            order = unpermute_rotary_rows(np.arange(info.shape[0])[:, None], permute_heads)[:, 0]
            weight = weight.rows(order)
        return weight

    sources = {"lm_head.weight": ["token_embd.weight" if config.tie_word_embeddings else "output.weight"]}
    for i in range(config.num_layers):
        blk, prefix = f"blk.{i}.", f"layers.{i}."
        sources[prefix + "self_attn.qkv_proj.weight"] = [f"{blk}attn_{p}.weight" for p in "qkv"]
        sources[prefix + "self_attn.o_proj.weight"] = [blk + "attn_output.weight"]
        sources[prefix + "mlp.gate_up_proj.weight"] = [blk + "ffn_gate.weight", blk + "ffn_up.weight"]
        sources[prefix + "mlp.down_proj.weight"] = [blk + "ffn_down.weight"]
    heads = {"attn_q": config.num_heads, "attn_k": config.num_kv_heads}
    weights: dict[str, list[GroupQuantized]] = {}
    left_out = []
    for name, parts in sources.items():
        try:
            read_parts = [read(p, heads.get(p.split(".")[-2], 0) if rotary else 0) for p in parts]
        except ValueError as error:
            left_out.append(f"{name}: {error}, which has no kernel")
            continue
        weights[name] = merge_alike(read_parts)
    return weights, left_out


def merge_alike(parts: list[GroupQuantized]) -> list[GroupQuantized]:
    """Concatenate neighbouring parts of the same format (fewer kernel calls, same bits)."""
    merged = [parts[0]]
    for part in parts[1:]:
        if part.kind == merged[-1].kind:
            merged[-1] = concatenate([merged[-1], part])
        else:
            merged.append(part)
    return merged
