"""The model's tokenizer (through transformers) and the full set of ids that end generation."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from engines.model_source import ModelSource, SourceKind

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models come from local files; never reach a hub

_GGUF_EOS_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


@dataclass(frozen=True, slots=True)
class TokenizerInfo:
    tokenizer: Any  # a transformers fast tokenizer
    eos_token_ids: frozenset[int]
    bos_token_id: int | None


def load_tokenizer(source: ModelSource, gguf_metadata: dict[str, Any] | None = None) -> TokenizerInfo:
    from transformers import AutoTokenizer

    if source.kind is SourceKind.GGUF:
        tokenizer = AutoTokenizer.from_pretrained(str(source.path.parent), gguf_file=source.path.name)
        eos = {int(gguf_metadata[key]) for key in _GGUF_EOS_KEYS if gguf_metadata and key in gguf_metadata}
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(source.path))
        eos = _generation_config_eos(source)
    if tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    bos = tokenizer.bos_token_id if getattr(tokenizer, "add_bos_token", False) else None
    return TokenizerInfo(tokenizer, frozenset(eos), bos)


def _generation_config_eos(source: ModelSource) -> set[int]:
    """eos ids of generation_config.json, which may list more than the tokenizer's one eos."""
    path = source.path / "generation_config.json"
    if not path.is_file():
        return set()
    value = json.loads(path.read_text()).get("eos_token_id")
    if value is None:
        return set()
    return {int(v) for v in (value if isinstance(value, list) else [value])}
