"""The model's tokenizer (through transformers) and the full set of ids that end generation."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpgate.cache_dir import dpgate_cache_dir
from engines.model.source import ModelSource, SourceKind

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
        tokenizer = _gguf_tokenizer(source.path)
        eos = {int(gguf_metadata[key]) for key in _GGUF_EOS_KEYS if gguf_metadata and key in gguf_metadata}
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(source.path))
        eos = _generation_config_eos(source)
    if tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    # Whether BOS is added is read from what the tokenizer does: a tokenizer read back from the
    # cache keeps its post-processor (Gemma's adds <bos>) but loses the add_bos_token flag.
    bos = tokenizer.bos_token_id
    if bos is not None and tokenizer("").input_ids[:1] != [bos]:
        bos = None
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


def tokenizer_cache_dir() -> Path:
    """Where tokenizers converted from GGUF files are kept."""
    return dpgate_cache_dir() / "tokenizers"


def _gguf_tokenizer(path: Path) -> Any:
    """transformers' tokenizer for a GGUF, converted once and then read back from a cache.

    Converting a GGUF vocabulary into a fast tokenizer costs seconds of Python on every start;
    the saved tokenizer.json loads in a fraction of that. The cache key covers the file's path,
    size and modification time, so a changed file is converted again.
    """
    from transformers import AutoTokenizer

    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    cached = tokenizer_cache_dir() / key
    if (cached / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(str(cached))
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=cached.parent))
        tokenizer.save_pretrained(staging)
        staging.rename(cached)  # atomic: a reader sees a whole cache entry or none
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # another process won the race, or the disk is read-only
    return tokenizer
