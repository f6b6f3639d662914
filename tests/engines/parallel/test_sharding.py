"""A tensor-parallel rank's share of a GGUF's quantized blocks (`shard_blocks`) is exactly the rows
`shard_state_dict` keeps of the dense weights: dequantized, every rank's blocks equal its share of
the dequantized checkpoint, bit for bit, padding rows included. Gemma 3's GGUF mixes formats in
one layer (Q5_0 / Q8_0 parts of a fused qkv) and pads its vocabulary on the last rank."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from engines.kernels.gguf_blocks import GroupQuantized, concatenate
from engines.model.config import read_model_config
from engines.model.gguf_reader import GGUFFile
from engines.model.source import resolve_model
from engines.model.weights import gguf_quantized_weights
from engines.parallel.plan import ParallelPlan
from engines.parallel.sharding import _take_rows, shard_blocks, shard_state_dict


def dense(parts) -> np.ndarray:
    return np.concatenate([p.dequantize() for p in parts])


@pytest.fixture(scope="module")
def gemma_blocks():
    source = resolve_model("gemma3-270m")
    with GGUFFile(source.path) as gguf:
        config = read_model_config(source, gguf)
        weights, _ = gguf_quantized_weights(gguf, config)
    names = ["lm_head.weight"] + [n for n in weights if n.startswith("layers.0.")]
    return config, {name: weights[name] for name in names}


@pytest.mark.parametrize("tp", [2, 4])
def test_each_rank_holds_the_rows_the_dense_shard_holds(gemma_blocks, tp):
    config, weights = gemma_blocks
    plan = ParallelPlan(tp_size=tp)
    full = {name: torch.from_numpy(dense(parts)) for name, parts in weights.items()}
    for rank in range(tp):
        blocks = shard_blocks(weights, config, plan, rank)
        expected = shard_state_dict(full, config, plan, rank)
        assert blocks.keys() == expected.keys()
        for name, parts in blocks.items():
            assert np.array_equal(dense(parts), expected[name].numpy()), (rank, name)
            # Neighbouring parts of one format are merged, as on one rank.
            assert all(a.kind != b.kind for a, b in itertools.pairwise(parts)), (rank, name)
    # The vocabulary's padding rows (the last rank's) are zero weights of the head's own format.
    last = shard_blocks(weights, config, plan, tp - 1)["lm_head.weight"]
    head = concatenate(last) if len(last) > 1 else last[0]
    padding = plan.vocab_rows(config) * tp - config.vocab_size
    assert head.shape[0] == plan.vocab_rows(config)
    if padding:
        assert not head.codes[-padding:].any() and not head.scales[-padding:].any()


def test_rows_across_parts_and_padding_keep_each_parts_format():
    rng = np.random.default_rng(0)
    nibbles = GroupQuantized(rng.integers(0, 16, (6, 64), dtype=np.uint8), rng.random((6, 2), np.float32),
                             rng.random((6, 2), np.float32), 32, True)  # fmt: skip
    signed = GroupQuantized(rng.integers(-128, 128, (4, 64), dtype=np.int8), rng.random((4, 2), np.float32), None,
                            32, False)  # fmt: skip
    rows = np.array([4, 5, 6, 8, -1, -1])  # the end of one part, rows of the next, then two of padding
    taken = _take_rows([nibbles, signed], rows)
    assert [p.kind for p in taken] == [nibbles.kind, signed.kind]
    assert np.array_equal(taken[0].dequantize(), nibbles.dequantize()[4:6])
    expected = np.concatenate([signed.dequantize()[[0, 2]], np.zeros((2, 64), np.float32)])
    assert np.array_equal(taken[1].dequantize(), expected)
