"""Token bitmask words: int32 rows where bit t % 32 of word t // 32 allows token t (xgrammar's layout).

Shared by the per-request matcher (which clears its stop tokens in its own row) and the step's
batch of masks (which clears every constrained row's at once).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np
import torch


def clear_bits(row: torch.Tensor, token_ids: Seq[int]) -> None:
    """Disallow `token_ids` in one int32 bitmask row."""
    clear_bits_of_rows(row.numpy()[np.newaxis], [(0, token_ids)])


def clear_bits_of_rows(words: np.ndarray, cleared: Seq[tuple[int, Seq[int]]]) -> None:
    """Disallow, for each (row, token_ids) of `cleared`, those tokens in `words[row]` (int32).
    On numpy's view of the bitmask: a torch op on one element costs about 15 us, three of them a
    token, which at batch 8 came to 0.25 ms a step; numpy's cost well under a microsecond."""
    for row, token_ids in cleared:
        for token_id in token_ids:
            words[row, token_id >> 5] &= _as_int32(~(1 << (token_id & 31)) & 0xFFFFFFFF)


def _as_int32(word: int) -> int:
    """An unsigned 32-bit word as the signed int32 holding the same bits."""
    return word - (1 << 32) if word >= 1 << 31 else word


def allowed_token_ids(row: torch.Tensor, vocab_size: int) -> list[int]:
    """The ids whose bits are set in one bitmask row."""
    bits = (row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.reshape(-1)[:vocab_size].nonzero().flatten().tolist()
