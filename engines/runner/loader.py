"""Load a resolved model: config, weights and tokenizer, with the tokenizer built in parallel.

Building the tokenizer from a GGUF takes transformers a few seconds of mostly Python work while
dequantizing weights is numpy work that releases the GIL, so the two overlap on a thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from engines.kernels.gguf_blocks import GroupQuantized
from engines.model.config import ModelConfig, read_model_config
from engines.model.fused import fuse_decoder_layers
from engines.model.gemma3 import Gemma3ForCausalLM
from engines.model.gguf_reader import GGUFFile
from engines.model.kernel_layers import use_invariant_kernels
from engines.model.llama import LlamaForCausalLM
from engines.model.numerics import Numerics, NumericsError
from engines.model.quantization import quantize_int8_weight_only
from engines.model.source import ModelSource, SourceKind
from engines.model.tokenizer import TokenizerInfo, load_tokenizer
from engines.model.weights import (
    build_model,
    gemma3_gguf_state_dict,
    gemma3_hf_state_dict,
    gguf_quantized_weights,
    gguf_state_dict,
    hf_state_dict,
)
from engines.parallel.layers import split_by_output
from engines.parallel.plan import ParallelPlan
from engines.parallel.sharding import shard_blocks, shard_state_dict

logger = logging.getLogger(__name__)


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
    tokenizer: TokenizerInfo | None  # None on TP workers: only rank 0 tokenizes
    dtype: torch.dtype
    numerics: Numerics | None = None  # set by apply_numerics; None: plain torch modules as loaded
    shard: RankShard | None = None  # a tensor-parallel rank's share; None: the whole model

    @property
    def plan(self) -> ParallelPlan:
        return self.shard.plan if self.shard is not None else ParallelPlan()


@dataclass(frozen=True, slots=True)
class RankShard:
    """Which share of the model a tensor-parallel rank holds (engines/parallel/plan.py)."""

    plan: ParallelPlan
    rank: int


def load_for_serving(
    source: ModelSource, numerics: Numerics, shard: RankShard | None = None, with_tokenizer: bool = True
) -> LoadedModel:
    """Load in the numerics' dtype (only `shard`'s share of the weights, when given) and put the
    model on its weights and kernels."""
    return apply_numerics(load(source, numerics.torch_dtype, shard, with_tokenizer), numerics)


def shipped_weights(
    source: ModelSource, numerics: Numerics, shard: RankShard | None = None
) -> dict[str, list[GroupQuantized]] | None:
    """For `--quantization gguf` and `int-dot`: the GGUF's quantized linear weights by parameter
    name (a tensor-parallel rank's rows of them with `shard`), or None where they cannot be served
    as shipped (then every linear layer is int8, and the log says why). Weights in a format without
    a kernel are left out (int8 too), each named in the log."""
    if numerics.quantization not in ("gguf", "int-dot"):
        return None
    flag = f"--quantization {numerics.quantization}"
    reason = None
    if source.kind is not SourceKind.GGUF:
        reason = "the checkpoint is not a GGUF file"
    elif not numerics.batch_invariant:
        reason = "torch's kernels (--no-batch-invariant) have no GGUF block path"
    if reason is not None:
        logger.warning("%s: %s; serving every linear layer on int8 instead", flag, reason)
        return None
    with GGUFFile(source.path) as gguf:
        config = read_model_config(source, gguf)
        weights, left_out = gguf_quantized_weights(gguf, config)
    if shard is not None:  # the rows this rank computes, as shard_state_dict keeps them
        weights = shard_blocks(weights, config, shard.plan, shard.rank)
    for line in left_out:
        logger.warning("%s: %s; this layer is served on int8", flag, line)
    logger.info("%s: %d linear weights served as shipped, %d on int8", flag, len(weights), len(left_out))
    return weights


def apply_numerics(loaded: LoadedModel, numerics: Numerics) -> LoadedModel:
    """Quantize and swap in the chosen kernels, in place; the runner reads `numerics` back.
    `--quantization gguf` and `int-dot` read the GGUF's own blocks again (`shipped_weights`)."""
    if loaded.dtype != numerics.torch_dtype:
        raise ValueError(f"model loaded in {loaded.dtype}, numerics want {numerics.dtype}")
    shipped = shipped_weights(loaded.source, numerics, loaded.shard)
    if numerics.batch_invariant:
        config = loaded.plan.local_config(loaded.config)
        sizes = {"hidden_size": config.hidden_size, "head_dim": config.head_dim}
        sizes["intermediate_size (per tensor-parallel rank)" if loaded.shard else "intermediate_size"] = (
            config.intermediate_size
        )
        uneven = [f"{name} {size}" for name, size in sizes.items() if size % 8]
        if uneven:
            raise NumericsError(
                f"the batch-invariant kernels need sizes that are multiples of 8, the model has {', '.join(uneven)}; "
                "use --no-batch-invariant"
            )
        use_invariant_kernels(loaded.model, numerics.quantization, numerics.isa, shipped)
        if loaded.shard is None and loaded.dtype == torch.float32:
            fuse_decoder_layers(loaded.model, numerics.isa)
    elif numerics.quantization in ("int8", "gguf"):  # choose_numerics refuses int-dot here
        quantize_int8_weight_only(loaded.model)
    return replace(loaded, numerics=numerics)


def load(
    source: ModelSource, dtype: torch.dtype, shard: RankShard | None = None, with_tokenizer: bool = True
) -> LoadedModel:
    """The model in `dtype` (a rank's share of it with `shard`) and, unless told not to, its
    tokenizer, built on a thread while the weights load (TP workers need none)."""
    with ExitStack() as stack:
        pool = stack.enter_context(ThreadPoolExecutor(max_workers=1))
        if source.kind is SourceKind.GGUF:
            gguf = stack.enter_context(GGUFFile(source.path))
            config = read_model_config(source, gguf)
            arch = ARCHITECTURES[config.architecture]
            tokenizer = pool.submit(load_tokenizer, source, gguf.metadata) if with_tokenizer else None
            full_state = lambda: arch.gguf_state(gguf, config)  # noqa: E731
        else:
            config = read_model_config(source)
            arch = ARCHITECTURES[config.architecture]
            tokenizer = pool.submit(load_tokenizer, source) if with_tokenizer else None
            full_state = lambda: arch.hf_state(source.path, config)  # noqa: E731
        if shard is None:
            model = build_model(config, full_state, dtype, arch.model_class)
        else:
            shard.plan.check_model(config)
            local = shard.plan.local_config(config)
            state = lambda: shard_state_dict(full_state(), config, shard.plan, shard.rank)  # noqa: E731
            reshape = lambda model: split_by_output(model, config, shard.plan)  # noqa: E731
            model = build_model(local, state, dtype, arch.model_class, reshape)
        return LoadedModel(source, config, model, tokenizer.result() if tokenizer else None, dtype, shard=shard)
