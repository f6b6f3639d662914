"""Warm-up runs the largest shapes the configuration allows, and a buffer too small for the
configuration fails there, in the code that owns it."""

from __future__ import annotations

import pytest
import torch

from engines.model.llama import RotaryEmbedding
from engines.model.source import resolve_model
from engines.runner.loader import load
from engines.runner.model_runner import ModelRunner


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load(resolve_model(str(tiny_model_dir)), torch.float32)


def test_warm_up_runs_the_widest_batch_and_the_deepest_position(tiny, monkeypatch):
    runner = ModelRunner(tiny, max_model_len=1024, num_blocks=80, block_size=16)
    seen = []
    execute = runner.execute
    monkeypatch.setattr(runner, "execute", lambda chunks: seen.append(list(chunks)) or execute(chunks))
    runner.warm_up(max_num_seqs=8, max_num_batched_tokens=64)
    wide, deep = seen
    assert sum(len(c.token_ids) == 1 for c in wide) == 7  # every decode slot but the prefill's
    assert sum(len(c.token_ids) for c in wide) == 64  # the whole token budget
    assert [(c.start, len(c.token_ids)) for c in deep] == [(1023, 1)]


def test_a_rotary_table_shorter_than_the_context_fails_at_warm_up(tiny):
    runner = ModelRunner(tiny, max_model_len=1024, num_blocks=64, block_size=16)
    runner.model.rotary = RotaryEmbedding(tiny.config.head_dim, 512, tiny.config.rope_theta)  # a bug to catch
    try:
        with pytest.raises(ValueError, match="position 1023 is beyond the rotary table"):
            runner.warm_up(max_num_seqs=4, max_num_batched_tokens=32)
    finally:
        runner.model.rotary = RotaryEmbedding(tiny.config.head_dim, 1024, tiny.config.rope_theta)
