"""The `cache-aware` policy: the engine whose cache and queue make this prompt cheapest.

For each candidate: cost = prefill_weight x the prompt tokens it would have to compute (those its
cache does not hold, from the gateway's exact index of the engines' own KV events) + load_weight x
its load in tokens (`EngineView.load_tokens`: KV it holds for running requests plus prefill this
gateway has sent it and not seen finish). The lowest cost wins; ties go to the least loaded
engine (by calls), then rotate, so cache misses spread over every engine instead of landing on
the same one each time. A balance guard stops one hot prefix piling everything on one engine:
when the pick's calls exceed `balance_ratio` x the least loaded engine's plus `balance_slack`, it
spills to the cheapest engine within that bound. A call the gateway did not hash (Chat, pinned
or control calls, no engine publishing events) is routed exactly as `least-loaded` routes it.

Pure: it sees `EngineView`s and the request's `PromptBlocks`, returns an index and a reason.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.routing.filters import RouteRequest
from gateway.routing.snapshot import EngineView


class RouteReason(enum.Enum):
    """Why the policy picked its engine (the metric label)."""

    CACHE = "cache"  # the pick holds some of the prompt's blocks and won on cost
    LOAD = "load"  # no candidate holds any of it (or no prompt): load decided
    BALANCE = "balance"  # the cache's favourite was overloaded: the guard spilled


@dataclass(slots=True, frozen=True)
class CacheAwareWeights:
    """The policy's knobs (flags --cache-prefill-weight, --cache-load-weight, --cache-balance-*)."""

    prefill_weight: float = 16.0
    load_weight: float = 1.0
    balance_ratio: float = 1.5
    balance_slack: int = 4


class CacheAware:
    """See the module docstring. `last_reason` and `last_matched_tokens` describe the last pick."""

    __slots__ = ("_num_ties", "last_matched_tokens", "last_reason", "weights")

    def __init__(self, weights: CacheAwareWeights | None = None) -> None:
        self.weights = weights or CacheAwareWeights()
        self._num_ties = 0
        self.last_reason = RouteReason.LOAD
        self.last_matched_tokens = 0

    def select(self, engines: Sequence[EngineView], request: RouteRequest | None = None) -> int:
        weights = self.weights
        prompt = request.prompt if request is not None else None
        if prompt is None:  # nothing hashed: exactly least-loaded (calls), ties in turn
            self.last_reason, self.last_matched_tokens = RouteReason.LOAD, 0
            return self._pick(engines, [float(e.load) for e in engines], range(len(engines)))
        matched = [prompt.matched_tokens.get(e.address, 0) for e in engines]
        num_tokens = prompt.num_prompt_tokens
        costs = [
            weights.prefill_weight * (num_tokens - matched[i]) + weights.load_weight * engine.load_tokens
            for i, engine in enumerate(engines)
        ]
        least_calls = min(engine.load for engine in engines)
        bound = weights.balance_ratio * least_calls + weights.balance_slack
        allowed = [i for i, engine in enumerate(engines) if engine.load <= bound]  # never empty: least is in
        best = self._pick(engines, costs, range(len(engines)))
        pick = best if best in allowed else self._pick(engines, costs, allowed)
        if pick != best and matched[best] > matched[pick]:
            self.last_reason = RouteReason.BALANCE
        elif matched[pick] > 0:
            self.last_reason = RouteReason.CACHE
        else:
            self.last_reason = RouteReason.LOAD
        self.last_matched_tokens = matched[pick]
        return pick

    def _pick(self, engines: Sequence[EngineView], costs: list[float], among) -> int:
        """The lowest cost among `among`; ties to the fewest calls, then in turn by rank."""
        among = list(among)
        lowest = min([costs[i] for i in among])  # (a list: a generator is a frame of its own)
        tied = [i for i in among if costs[i] == lowest]
        if len(tied) > 1:
            fewest = min(engines[i].load for i in tied)
            tied = sorted((i for i in tied if engines[i].load == fewest), key=lambda i: engines[i].rank)
        if len(tied) == 1:
            return tied[0]
        self._num_ties += 1
        return tied[self._num_ties % len(tied)]
