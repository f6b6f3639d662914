"""A sampled token as the rest of the engine sees it: plain data, no torch, so the scheduler's
sequences and the servicers can hold it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SampledToken:
    """The chosen token and, when asked, its log-probability and the top alternatives."""

    token_id: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
