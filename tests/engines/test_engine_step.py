"""The engine core's per-step helpers: what it feeds the runner is exactly the sequence's tokens."""

from __future__ import annotations

from types import SimpleNamespace

from engines.engine import _chunk_token_ids


def test_a_chunk_is_the_slice_of_prompt_then_output_wherever_it_starts_and_ends():
    prompt, output = [10, 11, 12, 13, 14], [20, 21, 22]
    seq = SimpleNamespace(prompt_ids=prompt, output_ids=output, token_ids=prompt + output)
    for start in range(len(prompt) + len(output)):
        for num_tokens in range(1, len(prompt) + len(output) - start + 1):
            assert _chunk_token_ids(seq, start, num_tokens) == (prompt + output)[start : start + num_tokens]
