"""The shape of a model, read once from a GGUF file's metadata or a Hugging Face config.json.

Only what the runner needs is kept; anything the runner cannot honour (an unknown architecture,
an unsupported rope scaling) is refused here with a sentence naming it, so a wrong model fails at
start-up rather than producing wrong tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engines.model.gguf_reader import GGUFFile
from engines.model.source import ModelSource, SourceKind


class UnsupportedModelError(ValueError):
    """The model is valid but uses something this runner does not implement."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Hyper-parameters of a Llama-family or Gemma 3 decoder.

    The fields after `tie_word_embeddings` are Gemma 3's; their defaults leave a Llama unchanged.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    sliding_window: int | None = None  # tokens a sliding-window layer's query sees, itself included
    is_sliding: tuple[bool, ...] = ()  # per layer: True for a sliding-window layer; empty: none slides
    rope_local_theta: float | None = None  # rope base of sliding-window layers; None: rope_theta
    rope_scaling_factor: float = 1.0  # linear rope scaling (positions / factor) of global layers
    query_pre_attn_scalar: float | None = None  # attention scale is its -1/2 power; None: head_dim
    final_logit_softcap: float | None = None  # logits = cap * tanh(logits / cap) when set

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def config_from_gguf(metadata: dict[str, Any], tensor_names: set[str]) -> ModelConfig:
    """Read a Llama-family or Gemma 3 GGUF's hyper-parameters (keys are prefixed by the architecture)."""
    arch = metadata.get("general.architecture")
    if arch not in ("llama", "gemma3"):
        raise UnsupportedModelError(f"GGUF architecture {arch!r} is not supported; supported: 'llama', 'gemma3'")

    def key(name: str, default: Any = None) -> Any:
        value = metadata.get(f"{arch}.{name}", default)
        if value is None:
            raise UnsupportedModelError(f"GGUF metadata lacks {arch}.{name}")
        return value

    num_heads = int(key("attention.head_count"))
    hidden_size = int(key("embedding_length"))
    head_dim = int(key("attention.key_length", key("rope.dimension_count", hidden_size // num_heads)))
    tokens = metadata.get("tokenizer.ggml.tokens")
    scaling = metadata.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None) and not (arch == "gemma3" and scaling == "linear"):
        raise UnsupportedModelError(f"rope scaling {scaling!r} is not supported")
    config = ModelConfig(
        architecture=arch,
        vocab_size=len(tokens) if tokens else int(key("vocab_size")),
        hidden_size=hidden_size,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=num_heads,
        num_kv_heads=int(key("attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        rope_theta=float(key("rope.freq_base", 10000.0)),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(key("context_length")),
        tie_word_embeddings="output.weight" not in tensor_names,
    )
    return _gemma3_from_gguf(config, metadata) if arch == "gemma3" else config


def _gemma3_from_gguf(config: ModelConfig, metadata: dict[str, Any]) -> ModelConfig:
    """What a Gemma 3 GGUF leaves to convention, as llama.cpp and transformers both fill it in:
    every 6th layer is global, the others slide; sliding layers use rope base 10000 and global
    layers the file's freq_base (with its linear scaling, if any); queries are scaled by
    head_dim ** -0.5, except in the 62-layer 27B whose query_pre_attn_scalar is hidden / heads."""
    if "gemma3.attn_logit_softcapping" in metadata:
        raise UnsupportedModelError("attention logit softcapping is not supported")
    window = metadata.get("gemma3.attention.sliding_window")
    if window is None:
        raise UnsupportedModelError("GGUF metadata lacks gemma3.attention.sliding_window")
    scalar = config.hidden_size // config.num_heads if config.num_layers == 62 else config.head_dim
    softcap = metadata.get("gemma3.final_logit_softcapping")
    linear = metadata.get("gemma3.rope.scaling.type") == "linear"
    return replace(
        config,
        sliding_window=int(window),
        is_sliding=tuple((i + 1) % 6 != 0 for i in range(config.num_layers)),
        rope_local_theta=10000.0,
        rope_scaling_factor=float(metadata.get("gemma3.rope.scaling.factor", 1.0)) if linear else 1.0,
        query_pre_attn_scalar=float(scalar),
        final_logit_softcap=float(softcap) if softcap else None,
    )


def config_from_hf_dir(directory: Path) -> ModelConfig:
    """Read a Hugging Face config.json of the Llama family or Gemma 3 text (transformers 4 or 5 layout)."""
    raw = json.loads((directory / "config.json").read_text())
    model_type = raw.get("model_type")
    if model_type == "gemma3_text":
        return _gemma3_from_hf(raw)
    if model_type != "llama":
        raise UnsupportedModelError(
            f"config.json model_type {model_type!r} is not supported; supported: 'llama', 'gemma3_text'"
        )
    for flag in ("attention_bias", "mlp_bias"):
        if raw.get(flag):
            raise UnsupportedModelError(f"config.json sets {flag}, which is not supported")
    rope = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if rope_type != "default":
        raise UnsupportedModelError(f"rope type {rope_type!r} is not supported")
    num_heads = int(raw["num_attention_heads"])
    return ModelConfig(
        architecture="llama",
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
        head_dim=int(raw.get("head_dim") or raw["hidden_size"] // num_heads),
        rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10000.0))),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
    )


def _gemma3_from_hf(raw: dict[str, Any]) -> ModelConfig:
    """A gemma3_text config.json: rope per layer type in `rope_parameters` (transformers 5) or
    rope_theta / rope_local_base_freq / rope_scaling (transformers 4)."""
    for flag in ("attention_bias", "use_bidirectional_attention", "attn_logit_softcapping"):
        if raw.get(flag):
            raise UnsupportedModelError(f"config.json sets {flag}, which is not supported")
    activation = raw.get("hidden_activation", "gelu_pytorch_tanh")
    if activation != "gelu_pytorch_tanh":
        raise UnsupportedModelError(f"hidden_activation {activation!r} is not supported")
    params = raw.get("rope_parameters") or {}
    full = params.get("full_attention") or {"rope_theta": raw.get("rope_theta", 1e6), **(raw.get("rope_scaling") or {})}
    local = params.get("sliding_attention") or {"rope_theta": raw.get("rope_local_base_freq", 10000.0)}
    full_type = full.get("rope_type", full.get("type", "default"))
    local_type = local.get("rope_type", local.get("type", "default"))
    if full_type not in ("default", "linear") or local_type != "default":
        raise UnsupportedModelError(f"rope types {full_type!r} (global) / {local_type!r} (sliding) are not supported")
    num_layers = int(raw["num_hidden_layers"])
    pattern = int(raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or 6)
    layer_types = raw.get("layer_types") or [
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers)
    ]
    num_heads = int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or 256)
    softcap = raw.get("final_logit_softcapping")
    return ModelConfig(
        architecture="gemma3",
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
        head_dim=head_dim,
        rope_theta=float(full.get("rope_theta", 1e6)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 131072)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
        sliding_window=int(raw.get("sliding_window") or 4096),
        is_sliding=tuple(kind == "sliding_attention" for kind in layer_types),
        rope_local_theta=float(local.get("rope_theta", 10000.0)),
        rope_scaling_factor=float(full.get("factor", 1.0)) if full_type == "linear" else 1.0,
        query_pre_attn_scalar=float(raw.get("query_pre_attn_scalar") or head_dim),
        final_logit_softcap=float(softcap) if softcap else None,
    )


def read_model_config(source: ModelSource, gguf: GGUFFile | None = None) -> ModelConfig:
    """The one reader of a model's config, whatever asks (start-up sizing, the loader, the e2e
    runner's fit check): from the GGUF's metadata (`gguf`, when the caller has the file open
    already) or the Hugging Face directory's config.json."""
    if source.kind is not SourceKind.GGUF:
        return config_from_hf_dir(source.path)
    if gguf is not None:
        return config_from_gguf(gguf.metadata, set(gguf.tensors))
    with GGUFFile(source.path) as opened:
        return config_from_gguf(opened.metadata, set(opened.tensors))
