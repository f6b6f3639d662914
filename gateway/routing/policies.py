"""Routing policies for unpinned calls: each is a small synchronous `select(engines) -> index`.

A policy sees only engines that passed every filter (never an empty list) and returns the index of
its pick. Nobody outside this module branches on a policy's name: the name is looked up once, in
`make_policy`, when the gateway starts.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Protocol

from gateway.routing.cache_aware import CacheAware, CacheAwareWeights
from gateway.routing.filters import RouteRequest
from gateway.routing.snapshot import EngineView


class RoutingPolicy(Protocol):
    """Picks one of a non-empty list of candidate engines."""

    def select(self, engines: Sequence[EngineView], request: RouteRequest | None = None) -> int: ...


class LeastLoaded:
    """The engine with the smallest `load`; ties go round the tied engines in rank order.

    Rotating among ties (rather than always taking the lowest rank) is still deterministic for a
    given call sequence, and it spreads sequential calls on an idle deployment over every rank.
    """

    __slots__ = ("_num_ties",)

    def __init__(self) -> None:
        self._num_ties = 0

    def select(self, engines: Sequence[EngineView], request: RouteRequest | None = None) -> int:
        lowest = min(engine.load for engine in engines)
        tied = sorted((engine.rank, i) for i, engine in enumerate(engines) if engine.load == lowest)
        if len(tied) == 1:
            return tied[0][1]
        self._num_ties += 1
        return tied[self._num_ties % len(tied)][1]


class RoundRobin:
    """Each engine in turn, ordered by rank, ignoring load."""

    __slots__ = ("_num_calls",)

    def __init__(self) -> None:
        self._num_calls = 0

    def select(self, engines: Sequence[EngineView], request: RouteRequest | None = None) -> int:
        order = sorted(range(len(engines)), key=lambda i: engines[i].rank)
        pick = order[self._num_calls % len(order)]
        self._num_calls += 1
        return pick


class PowerOfTwo:
    """The less loaded of two engines drawn at random (lower rank on a tie).

    Cheaper than a full scan on large deployments and robust to stale load reports, because two
    gateways rarely draw the same pair. `rng` is injectable so tests are reproducible.
    """

    __slots__ = ("_rng",)

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def select(self, engines: Sequence[EngineView], request: RouteRequest | None = None) -> int:
        if len(engines) == 1:
            return 0
        first, second = self._rng.sample(range(len(engines)), 2)
        return min(first, second, key=lambda i: (engines[i].load, engines[i].rank))


POLICIES: dict[str, Callable[[CacheAwareWeights], RoutingPolicy]] = {
    "least-loaded": lambda weights: LeastLoaded(),
    "round-robin": lambda weights: RoundRobin(),
    "power-of-two": lambda weights: PowerOfTwo(),
    "cache-aware": CacheAware,
}


def make_policy(name: str, weights: CacheAwareWeights | None = None) -> RoutingPolicy:
    """A fresh policy by its configured name (the config has already checked the name exists)."""
    return POLICIES[name](weights or CacheAwareWeights())
