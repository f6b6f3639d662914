"""Builds a tiny random Llama as a Hugging Face directory, for tests that need a real engine
process but not a real model's quality: it starts in seconds and decodes hundreds of tokens a
second. The tokenizer is SmolLM2's (taken from the packaged GGUF), so text round-trips."""

from __future__ import annotations

import json
from pathlib import Path

TINY_CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}


def make_tiny_llama_dir(path: str | Path, seed: int = 0, **overrides) -> Path:
    """Write config.json, model.safetensors, tokenizer files and generation_config.json to `path`;
    `overrides` change TINY_CONFIG's entries (e.g. num_key_value_heads=1)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from engines.model.source import resolve_model

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    gguf = resolve_model("smollm2-135m-instruct").path
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(path)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=1, eos_token_id=2, **(TINY_CONFIG | overrides))
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    return path
