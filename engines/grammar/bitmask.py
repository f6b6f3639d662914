"""The grammar masks of one step: every constrained row filled into one bitmask, applied in one pass.

Per row and exact: a masked logit becomes -inf, every other logit keeps its bits, and a row's mask
depends only on its own request, so grammar masking cannot make a request's tokens depend on its
batch. Unconstrained rows are not touched (nor copied). Logprobs keep describing the model's raw
distribution: the masked rows are copies, made into buffers the engine keeps (`MaskBuffers`): on
a busy 2-core machine a fresh 8-row gather (`logits[rows]`) cost 10 ms of allocation and thread
wake-ups, a copy into a kept buffer 0.1 ms. xgrammar is imported on the first constrained step (a
grammar has compiled by then), so an engine that never sees one never loads it.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engines.grammar.matcher import GrammarConflictError
    from engines.sequence import Sequence


@dataclass(slots=True)
class MaskedRows:
    """`logits[index[r]]` is batch row r masked by its grammar; rows in `conflicts` allow no token."""

    logits: torch.Tensor
    index: dict[int, int] = field(default_factory=dict)
    conflicts: dict[int, GrammarConflictError] = field(default_factory=dict)


NO_MASKS = MaskedRows(torch.empty(0))  # a step without constrained rows


class MaskBuffers:
    """The bitmask and masked-row buffers of one engine, grown to the widest step seen, reused
    every step (each step overwrites every row it uses)."""

    def __init__(self) -> None:
        self.bitmask = torch.empty(0, 0, dtype=torch.int32)
        self.rows = torch.empty(0, 0)

    def take(self, num_rows: int, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(bitmask [num_rows, ceil(vocab / 32)] int32, rows [num_rows, vocab] float32)."""
        if self.rows.shape[0] < num_rows or self.rows.shape[1] != vocab_size:
            capacity = max(num_rows, 2 * self.rows.shape[0])
            self.bitmask = torch.empty(capacity, (vocab_size + 31) // 32, dtype=torch.int32)
            self.rows = torch.empty(capacity, vocab_size)
        return self.bitmask[:num_rows], self.rows[:num_rows]


def mask_constrained_rows(logits: torch.Tensor, seqs: Seq[Sequence], buffers: MaskBuffers) -> MaskedRows:
    """`logits`: float32 [len(seqs), vocab], row i for seqs[i]. Stop tokens blocked before
    min_tokens are cleared in the mask too, so a row they empty is caught here, not sampled. The
    result's rows live in `buffers` until the next call."""
    import xgrammar as xgr

    from engines.grammar.matcher import GrammarConflictError

    rows = [i for i, seq in enumerate(seqs) if seq.grammar is not None]
    vocab_size = logits.shape[1]
    bitmask, masked = buffers.take(len(rows), vocab_size)
    for j, i in enumerate(rows):
        grammar = seqs[i].grammar
        grammar.sync(seqs[i].output_ids)
        grammar.fill(bitmask, j)  # writes the whole row
        clear_bits(bitmask[j], seqs[i].blocked_token_ids)
        masked[j].copy_(logits[i])  # a copy: the raw row stays for logprobs
    if vocab_size % 32:  # ids past the vocabulary do not exist: never count them as allowed
        bitmask[:, -1] &= (1 << (vocab_size % 32)) - 1
    xgr.apply_token_bitmask_inplace(masked, bitmask, vocab_size=vocab_size)
    result = MaskedRows(masked, {i: j for j, i in enumerate(rows)})
    for j in (bitmask == 0).all(dim=1).nonzero().flatten().tolist():
        seq = seqs[rows[j]]
        message = seq.grammar.explain_empty_mask(seq.output_ids, seq.blocked_token_ids, seq.stopping.min_tokens)
        result.conflicts[rows[j]] = GrammarConflictError(message)
    return result


def clear_bits(row: torch.Tensor, token_ids: Seq[int]) -> None:
    """Disallow `token_ids` in one int32 bitmask row."""
    for token_id in token_ids:
        word, bit = divmod(token_id, 32)
        keep = ~(1 << bit) & 0xFFFFFFFF
        row[word] &= keep - (1 << 32) if keep >= 1 << 31 else keep
