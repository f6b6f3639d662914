"""One request's grammar state: an xgrammar matcher built with the request's whole stop set.

`override_stop_tokens` is every token that ends this request (the model's eos ids, the generation
config's, and the request's stop_token_ids), so each of them is masked wherever the grammar cannot
end yet, and allowed where it can, even one that is ordinary text. xgrammar 0.2.9 still allows a
stop token that is ordinary text where the grammar needs that text to complete (regex `ab`, stop
token `b`, after `a`): sampled, it would stop the request one character short. `fill` therefore
clears every stop token while the grammar is not complete, so such a row is empty and the request
ends with a `GrammarConflictError` instead. The matcher has accepted exactly the request's output
tokens; `sync` restores that after anything that rewinds a sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import xgrammar as xgr

from engines.grammar.bits import allowed_token_ids, clear_bits


class RequestGrammar:
    def __init__(self, compiled: Any, stop_token_ids: frozenset[int], vocab_size: int):
        if not stop_token_ids:
            raise ValueError("a grammar needs at least one stop token to end")
        self.compiled = compiled
        self.stop_token_ids = stop_token_ids
        self.vocab_size = vocab_size
        self.sorted_stop_token_ids = sorted(stop_token_ids)
        self.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=self.sorted_stop_token_ids)
        self.num_accepted = 0

    @property
    def can_end(self) -> bool:
        """The output so far is a complete match: a stop token may end it here."""
        return self.matcher.is_completed()

    @property
    def is_terminated(self) -> bool:
        """A stop token was accepted where the grammar could end: nothing more may follow."""
        return self.matcher.is_terminated()

    def accept(self, token_id: int) -> None:
        """Advance by one sampled token. The mask allowed it, so a refusal is our bug, not the client's."""
        if not self.matcher.accept_token(token_id):
            raise RuntimeError(f"the grammar matcher refused token {token_id}, which its own mask allowed")
        self.num_accepted += 1

    def sync(self, output_ids: Sequence[int]) -> None:
        """Make the matcher hold exactly `output_ids`: roll back what the sequence no longer has,
        accept what it has gained (a recompute after preemption keeps every output token, so
        today this finds nothing to do)."""
        if self.num_accepted > len(output_ids):
            self.matcher.rollback(self.num_accepted - len(output_ids))
            self.num_accepted = len(output_ids)
        for token_id in output_ids[self.num_accepted :]:
            self.accept(token_id)

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]` (int32 words, bit t % 32 of word t // 32):
        xgrammar's mask, less every stop token unless the grammar can end here."""
        self.matcher.fill_next_token_bitmask(bitmask, row)
        clear_bits(bitmask[row], self.stop_tokens_to_clear())

    def stop_tokens_to_clear(self) -> Sequence[int]:
        """The stop tokens xgrammar's mask may allow here but this request may not take: all of
        them while the grammar cannot end, none once it can (a step's rows, filled together by
        engines/grammar/bitmask.py, clear theirs together)."""
        return () if self.can_end else self.sorted_stop_token_ids

    def explain_empty_mask(self, output_ids: Sequence[int], blocked_token_ids: Sequence[int], min_tokens: int) -> str:
        """Why no token is allowed after `output_ids`, naming the conflict. Runs only on that failure."""
        where = f"after {len(output_ids)} generated tokens"
        if self.can_end and _allowed_ids(self.matcher, self.vocab_size) <= set(blocked_token_ids):
            return (
                f"structured_output conflicts with stopping.min_tokens: {where} the grammar is complete and "
                f"allows only stop tokens, but min_tokens is {min_tokens}"
            )
        # Replay on a matcher whose stop tokens exclude the request's own, to see what the grammar
        # would take next if those tokens were ordinary text.
        other = next(t for t in range(self.vocab_size) if t not in self.stop_token_ids)
        probe = xgr.GrammarMatcher(self.compiled, override_stop_tokens=[other])
        for token_id in output_ids:
            probe.accept_token(token_id)
        required = sorted(_allowed_ids(probe, self.vocab_size) & self.stop_token_ids)
        if required:
            return (
                f"structured_output conflicts with the request's stop tokens: {where} the grammar can only "
                f"continue with token(s) {required}, which are stop tokens of this request "
                f"(stopping.stop_token_ids or the model's eos); a stop token is allowed only where the grammar can end"
            )
        return f"structured_output allows no next token {where}: no token of the vocabulary continues the grammar"


def _allowed_ids(matcher: Any, vocab_size: int) -> set[int]:
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    matcher.fill_next_token_bitmask(bitmask, 0)
    return set(allowed_token_ids(bitmask[0], vocab_size))

