"""Load a resolved model: config, weights and tokenizer, with the tokenizer built in parallel.

Building the tokenizer from a GGUF takes transformers a few seconds of mostly Python work while
dequantizing weights is numpy work that releases the GIL, so the two overlap on a thread.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from engines.gguf_reader import GGUFFile
from engines.model_config import ModelConfig, config_from_gguf, config_from_hf_dir
from engines.model_source import ModelSource, SourceKind
from engines.models.llama import LlamaForCausalLM
from engines.tokenizer import TokenizerInfo, load_tokenizer
from engines.weights import build_model, gguf_state_dict, hf_state_dict


@dataclass(frozen=True, slots=True)
class LoadedModel:
    source: ModelSource
    config: ModelConfig
    model: LlamaForCausalLM
    tokenizer: TokenizerInfo
    dtype: torch.dtype


def load(source: ModelSource, dtype: torch.dtype) -> LoadedModel:
    if source.kind is SourceKind.GGUF:
        with GGUFFile(source.path) as gguf, ThreadPoolExecutor(max_workers=1) as pool:
            config = config_from_gguf(gguf.metadata, set(gguf.tensors))
            tokenizer = pool.submit(load_tokenizer, source, gguf.metadata)
            model = build_model(config, lambda: gguf_state_dict(gguf, config), dtype)
            return LoadedModel(source, config, model, tokenizer.result(), dtype)
    config = config_from_hf_dir(source.path)
    with ThreadPoolExecutor(max_workers=1) as pool:
        tokenizer = pool.submit(load_tokenizer, source)
        model = build_model(config, lambda: hf_state_dict(source.path, config), dtype)
        return LoadedModel(source, config, model, tokenizer.result(), dtype)
