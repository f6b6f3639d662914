"""Load a resolved model: config, weights and tokenizer, with the tokenizer built in parallel.

Building the tokenizer from a GGUF takes transformers a few seconds of mostly Python work while
dequantizing weights is numpy work that releases the GIL, so the two overlap on a thread.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from engines.gguf_reader import GGUFFile
from engines.kernels.layers import use_invariant_kernels
from engines.model_config import ModelConfig, config_from_gguf, config_from_hf_dir
from engines.model_source import ModelSource, SourceKind
from engines.models.gemma3 import Gemma3ForCausalLM
from engines.models.llama import LlamaForCausalLM
from engines.numerics import Numerics, NumericsError
from engines.quantization import quantize_int8_weight_only
from engines.tokenizer import TokenizerInfo, load_tokenizer
from engines.weights import (
    build_model,
    gemma3_gguf_state_dict,
    gemma3_hf_state_dict,
    gguf_state_dict,
    hf_state_dict,
)


@dataclass(frozen=True, slots=True)
class Architecture:
    """How to build one architecture named by `ModelConfig.architecture`, and fill it from each source."""

    model_class: type[LlamaForCausalLM] | type[Gemma3ForCausalLM]
    gguf_state: Callable[[GGUFFile, ModelConfig], dict[str, torch.Tensor]]
    hf_state: Callable[[Path, ModelConfig], dict[str, torch.Tensor]]


ARCHITECTURES = {
    "llama": Architecture(LlamaForCausalLM, gguf_state_dict, hf_state_dict),
    "gemma3": Architecture(Gemma3ForCausalLM, gemma3_gguf_state_dict, gemma3_hf_state_dict),
}


@dataclass(frozen=True, slots=True)
class LoadedModel:
    source: ModelSource
    config: ModelConfig
    model: LlamaForCausalLM | Gemma3ForCausalLM
    tokenizer: TokenizerInfo
    dtype: torch.dtype
    numerics: Numerics | None = None  # set by apply_numerics; None: plain torch modules as loaded


def load_for_serving(source: ModelSource, numerics: Numerics) -> LoadedModel:
    """Load in the numerics' dtype and put the model on its weights and kernels."""
    return apply_numerics(load(source, numerics.torch_dtype), numerics)


def apply_numerics(loaded: LoadedModel, numerics: Numerics) -> LoadedModel:
    """Quantize and swap in the chosen kernels, in place; the runner reads `numerics` back."""
    if loaded.dtype != numerics.torch_dtype:
        raise ValueError(f"model loaded in {loaded.dtype}, numerics want {numerics.dtype}")
    if numerics.batch_invariant:
        config = loaded.config
        sizes = {"hidden_size": config.hidden_size, "head_dim": config.head_dim}
        sizes["intermediate_size"] = config.intermediate_size
        uneven = [f"{name} {size}" for name, size in sizes.items() if size % 8]
        if uneven:
            raise NumericsError(
                f"the batch-invariant kernels need sizes that are multiples of 8, the model has {', '.join(uneven)}; "
                "use --no-batch-invariant"
            )
        use_invariant_kernels(loaded.model, numerics.quantization, numerics.isa)
    elif numerics.quantization == "int8":
        quantize_int8_weight_only(loaded.model)
    return replace(loaded, numerics=numerics)


def load(source: ModelSource, dtype: torch.dtype) -> LoadedModel:
    if source.kind is SourceKind.GGUF:
        with GGUFFile(source.path) as gguf, ThreadPoolExecutor(max_workers=1) as pool:
            config = config_from_gguf(gguf.metadata, set(gguf.tensors))
            arch = ARCHITECTURES[config.architecture]
            tokenizer = pool.submit(load_tokenizer, source, gguf.metadata)
            model = build_model(config, lambda: arch.gguf_state(gguf, config), dtype, arch.model_class)
            return LoadedModel(source, config, model, tokenizer.result(), dtype)
    config = config_from_hf_dir(source.path)
    arch = ARCHITECTURES[config.architecture]
    with ThreadPoolExecutor(max_workers=1) as pool:
        tokenizer = pool.submit(load_tokenizer, source)
        model = build_model(config, lambda: arch.hf_state(source.path, config), dtype, arch.model_class)
        return LoadedModel(source, config, model, tokenizer.result(), dtype)
