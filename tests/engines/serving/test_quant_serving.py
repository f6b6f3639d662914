"""`--quantization gguf` on the real models: the GGUF's own blocks served, same bits as its dequantized grid.

SmolLM2-135M's GGUF is Q4_1 with a Q8_0 token embedding (the tied lm_head): every linear layer is
served from its blocks, and the logits equal the float32 kernels' over the dequantized weights
(`--quantization none`) bit for bit, so the parity with transformers in
test_model_vs_transformers.py holds for gguf too. Gemma 3's Q4_K_M file mixes Q5_0, Q8_0, Q4_K and
Q6_K; every linear layer is served from its blocks. Where the blocks cannot be served (torch's kernels,
a safetensors directory) the engine says so and serves int8; a tensor-parallel rank takes its rows of
them (tests/engines/parallel/test_sharding.py).
"""

from __future__ import annotations

import argparse
import logging

import numpy as np
import pytest
import torch

from engines.config import ConfigError, EngineConfig, add_engine_arguments
from engines.model.config import config_from_gguf
from engines.model.gguf_reader import GGUFFile
from engines.model.kernel_layers import KernelLinear
from engines.model.numerics import Numerics
from engines.model.source import ModelSource, SourceKind, resolve_model
from engines.model.weights import gguf_quantized_weights
from engines.runner.loader import shipped_weights
from engines.runner.model_runner import ChunkInput, ModelRunner
from tests.engines.kernel_choice import load_with_kernels

PROMPT = [1, 504, 3458, 282, 4195, 314, 260, 1345, 28, 7, 9, 21]


@pytest.fixture(scope="module")
def smollm2():
    return resolve_model("smollm2-135m-instruct")


@pytest.mark.e2e
def test_smollm2_serves_every_linear_layer_from_its_blocks_with_the_dequantized_bits_batch_invariantly(smollm2):
    served = load_with_kernels(smollm2, "batch-invariant", quantization="gguf")
    linears = [m for m in served.model.modules() if isinstance(m, KernelLinear)]
    assert len(linears) == 4 * served.config.num_layers + 1
    assert {m.storage for m in linears} == {"gguf"}
    dense = load_with_kernels(smollm2, "batch-invariant", quantization="none")
    expected = ModelRunner(dense, 64).forward(PROMPT, 0)
    runner = ModelRunner(served, 64, num_blocks=16)
    assert torch.equal(runner.forward(PROMPT, 0), expected)
    # Alone vs beside other sequences in one step, and as a chunked prefill: the same bits.
    before, after = ChunkInput(PROMPT[::-1] * 3, 0, range(4, 7)), ChunkInput(PROMPT[:7], 0, range(8, 9))
    assert torch.equal(runner.execute([before, ChunkInput(PROMPT, 0, range(2)), after])[1], expected)
    runner.forward(PROMPT[:5], 0)
    assert torch.equal(runner.forward(PROMPT[5:], 5), expected)


@pytest.mark.e2e
def test_smollm2_int_dot_serves_every_layer_but_qkv_and_down_proj_on_integer_sums_batch_invariantly(smollm2):
    served = load_with_kernels(smollm2, "batch-invariant", quantization="int-dot")
    linears = {name: m for name, m in served.model.named_modules() if isinstance(m, KernelLinear)}
    assert len(linears) == 4 * served.config.num_layers + 1
    float_activations = ("qkv_proj", "down_proj")  # over int8 weights (kernel_layers.FLOAT_ACTIVATION_LAYERS)
    assert {m.storage for name, m in linears.items() if name.endswith(float_activations)} == {"int8"}
    assert {m.storage for name, m in linears.items() if not name.endswith(float_activations)} == {"gguf/int-dot"}
    assert all(layer.fused is not None for layer in served.model.layers)
    expected = ModelRunner(served, 64).forward(PROMPT, 0)
    # Close to float32 activations over int8 weights (what qkv_proj and down_proj serve here too;
    # the other layers differ by their activations' 8-bit grid and by the GGUF's grid against int8's
    # re-quantization of it), and the same next token.
    float_path = ModelRunner(load_with_kernels(smollm2, "batch-invariant", quantization="int8"), 64).forward(PROMPT, 0)
    assert torch.argmax(expected[-1]) == torch.argmax(float_path[-1])
    assert (expected - float_path).abs().max() < 0.05 * float_path.abs().max()
    runner = ModelRunner(served, 64, num_blocks=16)
    before, after = ChunkInput(PROMPT[::-1] * 3, 0, range(4, 7)), ChunkInput(PROMPT[:7], 0, range(8, 9))
    assert torch.equal(runner.execute([before, ChunkInput(PROMPT, 0, range(2)), after])[1], expected)
    runner.forward(PROMPT[:5], 0)
    assert torch.equal(runner.forward(PROMPT[5:], 5), expected)


def test_gemma3_serves_its_mixed_formats_as_shipped():
    with GGUFFile(resolve_model("gemma3-270m").path) as gguf:
        config = config_from_gguf(gguf.metadata, set(gguf.tensors))
        weights, left_out = gguf_quantized_weights(gguf, config)
        assert left_out == []
        assert len(weights) == 4 * config.num_layers + 1
        for i in (0, config.num_layers - 1):
            names = [f"blk.{i}.attn_q.weight", f"blk.{i}.attn_k.weight", f"blk.{i}.attn_v.weight"]
            parts = weights[f"layers.{i}.self_attn.qkv_proj.weight"]
            dense = np.concatenate([gguf.tensor(n) for n in names])
            assert np.array_equal(np.concatenate([p.dequantize() for p in parts]), dense)
        kinds = {part.kind for parts in weights.values() for part in parts}
        # Q5_0/Q8_0 (int8 codes, groups of 32) merge in a fused qkv; Q4_K nibbles; Q6_K groups of 16
        assert kinds == {(32, False, False), (32, True, True), (16, False, False)}


GGUF_NUMERICS = Numerics("float32", "gguf", True, "scalar", "test")


@pytest.mark.parametrize(
    ("numerics", "shard", "kind", "reason"),
    [
        (Numerics("float32", "gguf", False, None, "test"), None, SourceKind.GGUF, "--no-batch-invariant"),
        (GGUF_NUMERICS, None, SourceKind.HF_DIRECTORY, "not a GGUF file"),
    ],
)
def test_where_blocks_cannot_be_served_the_log_says_why_and_int8_serves(smollm2, caplog, numerics, shard, kind, reason):
    source = ModelSource(kind, smollm2.path, "m")
    with caplog.at_level(logging.WARNING, logger="engines.runner.loader"):
        assert shipped_weights(source, numerics, shard) is None
    assert reason in caplog.text and "int8" in caplog.text


def test_the_flag_takes_gguf_and_names_the_choices_otherwise():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    config = EngineConfig.from_args(parser.parse_args(["--quantization", "gguf"]))
    config.validate()
    assert config.quantization == "gguf"
    with pytest.raises(ConfigError, match=r"^--quantization q4 must be one of auto, none, int8, gguf, int-dot$"):
        EngineConfig.from_args(parser.parse_args(["--quantization", "q4"])).validate()
