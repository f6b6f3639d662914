"""The perplexity gate's arithmetic, apart from any model: windows of a token stream, perplexity
from summed logprobs, and the relative bound both sides must meet. Plain Python, tested alone."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Window:
    """One scored prompt: `prompt` is sent as it is; every token after the first is scored, given
    the ones before it (`num_scored` = len(prompt) - 1)."""

    prompt: tuple[int, ...]

    @property
    def num_scored(self) -> int:
        return len(self.prompt) - 1


def make_windows(
    token_ids: list[int], length: int, bos_token_id: int | None, max_windows: int | None = None
) -> list[Window]:
    """Non-overlapping windows of `length` text tokens, the tail shorter than `length` dropped (so
    every window sees the same amount of context). With a BOS token each window starts with it, as
    the model was trained to see text, and all `length` tokens are scored; without, the window's
    first token is its context and `length` - 1 are scored."""
    if length < 2:
        raise ValueError(f"window length must be >= 2, got {length}")
    count = len(token_ids) // length
    if max_windows is not None:
        count = min(count, max_windows)
    head = () if bos_token_id is None else (bos_token_id,)
    return [Window(head + tuple(token_ids[i * length : (i + 1) * length])) for i in range(count)]


def perplexity(sum_logprob: float, num_scored: int) -> float:
    """exp of the mean negative natural-log likelihood per scored token."""
    if num_scored <= 0:
        raise ValueError("perplexity needs at least one scored token")
    return math.exp(-sum_logprob / num_scored)


@dataclass(frozen=True, slots=True)
class Comparison:
    """served / reference perplexity and whether it lies within `bound` (relative) of 1."""

    served: float
    reference: float
    bound: float

    @property
    def ratio(self) -> float:
        return self.served / self.reference

    @property
    def relative_difference(self) -> float:
        return abs(self.ratio - 1.0)

    @property
    def passed(self) -> bool:
        return self.relative_difference <= self.bound
