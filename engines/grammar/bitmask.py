"""The grammar masks of one step: every constrained row filled into one bitmask before the
forward (`fill_masks`), applied after it in one pass (`apply_masks`).

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
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from engines.grammar.bits import clear_bits_of_rows
from engines.grammar.errors import GrammarConflictError
from engines.sampling.params import StoppingParams

if TYPE_CHECKING:  # the matcher imports xgrammar (2 s): only an engine that sees a grammar loads it
    from engines.grammar.matcher import RequestGrammar


class ConstrainedRow(Protocol):
    """What masking reads of a batch row's request (the scheduler's `Sequence` is one): its grammar
    (None: unconstrained), the tokens it generated, the stop tokens it may not sample yet."""

    grammar: RequestGrammar | None
    output_ids: list[int]
    stopping: StoppingParams

    @property
    def blocked_token_ids(self) -> Seq[int]: ...


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
        self._views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # by row count
        self._batch_matcher: Any = None

    def take(self, num_rows: int, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(bitmask [num_rows, ceil(vocab / 32)] int32, rows [num_rows, vocab] float32)."""
        if self.rows.shape[0] < num_rows or self.rows.shape[1] != vocab_size:
            capacity = max(num_rows, 2 * self.rows.shape[0])
            self.bitmask = torch.empty(capacity, (vocab_size + 31) // 32, dtype=torch.int32)
            self.rows = torch.empty(capacity, vocab_size)
            self._views.clear()
        if num_rows not in self._views:
            self._views[num_rows] = self.bitmask[:num_rows], self.rows[:num_rows]
        return self._views[num_rows]

    def batch_matcher(self) -> Any:
        """xgrammar's batch filler, on the calling thread: one call fills every row, where a call
        per row paid its argument conversion each time (at batch 8, 0.04 ms against 0.06 ms
        warm); its own thread pool cost more than it saved on two cores (0.2 ms)."""
        if self._batch_matcher is None:
            import xgrammar as xgr

            self._batch_matcher = xgr.BatchGrammarMatcher(max_threads=1)
        return self._batch_matcher


@dataclass(slots=True)
class FilledMasks:
    """A step's bitmask, filled before its forward: `bitmask[j]` is for batch row `rows[j]`."""

    rows: list[int]
    bitmask: torch.Tensor
    masked: torch.Tensor  # where `apply_masks` writes the masked copies
    vocab_size: int
    conflicts: dict[int, GrammarConflictError]


def fill_masks(seqs: Seq[ConstrainedRow], vocab_size: int, buffers: MaskBuffers) -> FilledMasks | None:
    """Every constrained row's mask, from what its request has generated so far; None when no
    row is constrained. Stop tokens blocked before min_tokens are cleared in the mask too, so a
    row they empty is caught here (a conflict), not sampled.

    The engine calls this before the step's forward, right after the last step's tokens were
    accepted: the matchers are still in cache then. After the forward has streamed every weight
    through the caches, the same fill took six times as long (0.23 ms against 0.04 ms at batch 8)."""
    rows = [i for i, seq in enumerate(seqs) if seq.grammar is not None]
    if not rows:
        return None
    bitmask, masked = buffers.take(len(rows), vocab_size)
    cleared: list[tuple[int, Seq[int]]] = []
    for j, i in enumerate(rows):
        grammar = seqs[i].grammar
        grammar.sync(seqs[i].output_ids)
        cleared += ((j, grammar.stop_tokens_to_clear()), (j, seqs[i].blocked_token_ids))
    # xgrammar's masks, every row whole; complete once the stop tokens above are cleared too.
    buffers.batch_matcher().batch_fill_next_token_bitmask([seqs[i].grammar.matcher for i in rows], bitmask)
    words = bitmask.numpy()  # the same memory: numpy's scalar ops cost far less than torch's
    clear_bits_of_rows(words, cleared)
    if vocab_size % 32:  # ids past the vocabulary do not exist: never count them as allowed
        words[:, -1] &= (1 << (vocab_size % 32)) - 1
    conflicts = {}
    for j in np.flatnonzero(~words.any(axis=1)).tolist():
        seq = seqs[rows[j]]
        message = seq.grammar.explain_empty_mask(seq.output_ids, seq.blocked_token_ids, seq.stopping.min_tokens)
        conflicts[rows[j]] = GrammarConflictError(message)
    return FilledMasks(rows, bitmask, masked, vocab_size, conflicts)


def apply_masks(logits: torch.Tensor, filled: FilledMasks | None, *, with_kernel: bool) -> MaskedRows:
    """`logits`: float32 [batch, vocab], the rows `fill_masks` was given. The masked rows are
    copies (the raw rows stay for logprobs) that live in the buffers until the next step.

    `with_kernel`: copy and mask in one pass with dpgate's kernel library (an engine that runs
    its batch-invariant kernels has it loaded); else a copy, then xgrammar's CPU kernel. Both
    give the same bits. xgrammar's goes token by token where a token is masked: at batch 8, a
    mask that allows a few hundred tokens took it 1.7 ms, and ours 0.1 ms (all allowed: 0.05 ms
    each)."""
    if filled is None:
        return NO_MASKS
    if logits.shape[1] != filled.vocab_size:
        raise ValueError(f"logits of {logits.shape[1]} tokens for masks of {filled.vocab_size}")
    rows, masked = filled.rows, filled.masked
    if with_kernel:
        from engines import kernels

        kernels.mask_rows(logits, torch.tensor(rows), filled.bitmask, masked, filled.vocab_size)
    else:
        import xgrammar as xgr

        if len(rows) == logits.shape[0]:
            masked.copy_(logits)
        else:
            torch.index_select(logits, 0, torch.tensor(rows), out=masked)
        xgr.apply_token_bitmask_inplace(masked, filled.bitmask, vocab_size=filled.vocab_size)
    return MaskedRows(masked, {i: j for j, i in enumerate(rows)}, dict(filled.conflicts))


def mask_constrained_rows(
    logits: torch.Tensor, seqs: Seq[ConstrainedRow], buffers: MaskBuffers, *, with_kernel: bool = False
) -> MaskedRows:
    """`fill_masks` and `apply_masks` at once: `logits` [len(seqs), vocab], row i for seqs[i]."""
    return apply_masks(logits, fill_masks(seqs, logits.shape[1], buffers), with_kernel=with_kernel)
