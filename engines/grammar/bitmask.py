"""The grammar masks of one step: every constrained row filled into one bitmask, applied in one pass.

Per row and exact: a masked logit becomes -inf, every other logit keeps its bits, and a row's mask
depends only on its own request, so grammar masking cannot make a request's tokens depend on its
batch. Unconstrained rows are not touched (nor copied). Logprobs keep describing the model's raw
distribution: the masked rows are copies. xgrammar is imported on the first constrained step (a
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


def mask_constrained_rows(logits: torch.Tensor, seqs: Seq[Sequence]) -> MaskedRows:
    """`logits`: float32 [len(seqs), vocab], row i for seqs[i]. Stop tokens blocked before
    min_tokens are cleared in the mask too, so a row they empty is caught here, not sampled."""
    import xgrammar as xgr

    from engines.grammar.matcher import GrammarConflictError

    rows = [i for i, seq in enumerate(seqs) if seq.grammar is not None]
    vocab_size = logits.shape[1]
    bitmask = xgr.allocate_token_bitmask(len(rows), vocab_size)
    for j, i in enumerate(rows):
        grammar = seqs[i].grammar
        grammar.sync(seqs[i].output_ids)
        grammar.fill(bitmask, j)
        clear_bits(bitmask[j], seqs[i].blocked_token_ids)
    if vocab_size % 32:  # ids past the vocabulary do not exist: never count them as allowed
        bitmask[:, -1] &= (1 << (vocab_size % 32)) - 1
    masked = logits[rows]  # a copy: the raw rows stay for logprobs
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
