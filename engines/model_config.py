"""The shape of a model, read once from a GGUF file's metadata or a Hugging Face config.json.

Only what the runner needs is kept; anything the runner cannot honour (an unknown architecture,
an unsupported rope scaling) is refused here with a sentence naming it, so a wrong model fails at
start-up rather than producing wrong tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class UnsupportedModelError(ValueError):
    """The model is valid but uses something this runner does not implement."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Hyper-parameters of a Llama-family decoder."""

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

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def config_from_gguf(metadata: dict[str, Any], tensor_names: set[str]) -> ModelConfig:
    """Read a Llama-family GGUF's hyper-parameters (keys are prefixed by the architecture)."""
    arch = metadata.get("general.architecture")
    if arch != "llama":
        raise UnsupportedModelError(f"GGUF architecture {arch!r} is not supported; supported: 'llama'")

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
    if scaling not in ("none", None):
        raise UnsupportedModelError(f"rope scaling {scaling!r} is not supported")
    return ModelConfig(
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


def config_from_hf_dir(directory: Path) -> ModelConfig:
    """Read a Hugging Face config.json of the Llama family (transformers 4 or 5 layout)."""
    raw = json.loads((directory / "config.json").read_text())
    model_type = raw.get("model_type")
    if model_type != "llama":
        raise UnsupportedModelError(f"config.json model_type {model_type!r} is not supported; supported: 'llama'")
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
