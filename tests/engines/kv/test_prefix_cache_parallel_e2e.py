"""Prefix-cache hits under tensor and decode context parallelism: the engine process decides the
block table once and every rank follows it, so a hit gives the same bits as a miss with T = 2 and
with T = 2 / C = 2 (where a block holds 16 positions on each DCP rank), beside noise streams and
with the uncached rest chunked. A tiny Llama with one KV head (tests/tiny_model.py), the served
default numerics otherwise.
"""

from __future__ import annotations

import random

import pytest

from tests.engines.kv.prefix_exactness import assert_same_bits, cold_and_warm, server_info, split_points
from tests.support.processes import free_port, running
from tests.tiny_model import make_tiny_llama_dir


@pytest.fixture(scope="module")
def one_kv_head_model(tmp_path_factory):
    return make_tiny_llama_dir(tmp_path_factory.mktemp("tiny-prefix"), seed=5, num_key_value_heads=1)


@pytest.mark.parametrize(
    "flags",
    [
        ["--tensor-parallel-size", "2"],
        ["--tensor-parallel-size", "2", "--decode-context-parallel-size", "2"],
    ],
    ids=["tp2", "tp2-dcp2"],
)
def test_hits_are_bit_identical_under_parallelism(one_kv_head_model, flags, tmp_path):
    port = free_port()
    args = ["engine", "--port", str(port), "--model", str(one_kv_head_model), "--max-num-batched-tokens", "40"]
    with running([*args, *flags], port, timeout=300, log_path=str(tmp_path / "engine.log")) as engine:
        info = server_info(engine.address)
        assert info.parallelism.tensor_parallel_size == 2
        positions_per_block = info.kv_block_size  # 32 with C = 2
        rng = random.Random(positions_per_block)
        base = [rng.randrange(100, 40000) for _ in range(4 * positions_per_block + 1)]
        results = cold_and_warm(engine.address, base, split_points(len(base), positions_per_block), with_noise=True)
    assert_same_bits(results)
