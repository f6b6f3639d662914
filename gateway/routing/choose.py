"""`choose_engine_for_request`: the filter chain, then one policy pick (DESIGN.md rules 2 and 5)."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.errors import GatewayError, InvalidArgument, Unavailable
from gateway.routing.filters import FILTERS, RouteRequest
from gateway.routing.policies import RoutingPolicy
from gateway.routing.snapshot import EngineView

__all__ = ["RouteRequest", "choose_engine_for_request"]

_KEEPS = tuple(engine_filter.keep for engine_filter in FILTERS)  # the chain's predicates, in order


def _connected_ranks(engines: Sequence[EngineView]) -> list[int]:
    return sorted({engine.rank for engine in engines})


def _not_connected_message(rank: int, engines: Sequence[EngineView]) -> str:
    return f"data parallel rank {rank} is not connected to this gateway; connected ranks: {_connected_ranks(engines)}"


def _missing_rank_message(rank: int, data_parallel_size: int, engines: Sequence[EngineView]) -> str:
    return (
        f"data parallel rank {rank} of data parallel size {data_parallel_size} is not connected to "
        f"this gateway right now; connected ranks: {_connected_ranks(engines)}"
    )


def _choose_pinned(engines: Sequence[EngineView], request: RouteRequest, data_parallel_size: int | None) -> EngineView:
    """The engine owning the pinned rank, or the error that says why it cannot serve.

    Rank numbers are global, so the owner is found by rank, never by position, and a pin is never
    served by another rank. A rank no engine owns is the client's mistake (INVALID_ARGUMENT)
    unless it lies below the handshaken DP size: then the deployment has that rank and its engine
    is only missing for now (starting, restarting, refused), so the call may be retried
    (UNAVAILABLE). Before any handshake nothing can be judged, and nothing served: UNAVAILABLE.
    """
    rank = request.rank
    assert rank is not None  # our invariant: only called for pinned requests
    owners = [engine for engine in engines if engine.rank == rank]
    if not owners:
        if data_parallel_size is not None and rank < data_parallel_size:
            raise Unavailable(_missing_rank_message(rank, data_parallel_size, engines))
        if data_parallel_size is None and not engines:
            # Nothing has handshaken, so no rank can be judged yet: a retry may succeed.
            raise Unavailable(f"data parallel rank {rank} cannot be served yet: no engine has passed the handshake")
        raise InvalidArgument(_not_connected_message(rank, engines))
    # The handshake keeps ranks unique, so there is one owner; checking each keeps this honest.
    for engine_filter in FILTERS:
        kept = [engine for engine in owners if engine_filter.keep(engine, request)]
        if not kept:
            raise engine_filter.refuse(request)
        owners = kept
    return owners[0]


def choose_engine_for_request(
    engines: Sequence[EngineView],
    request: RouteRequest,
    policy: RoutingPolicy,
    *,
    data_parallel_size: int | None = None,
) -> EngineView:
    """Return the engine that serves `request`, or raise a `gateway.errors` exception.

    `engines` are the connected (handshaken) engines; `data_parallel_size` is the DP size they
    reported in the handshake, None while no engine has handshaken. A pinned rank skips the
    policy: the rank decides. Unpinned requests go through every filter and the policy picks
    among the survivors.
    """
    if request.rank is not None:
        return _choose_pinned(engines, request, data_parallel_size)
    if not engines:
        raise Unavailable("no engine is connected to this gateway")
    # Every filter on each engine in one pass (a list per filter was six more Python frames a
    # call, issue 27); when none is left, the chain is run filter by filter for the first one
    # that removed every candidate, whose refusal the call gets.
    candidates = []
    for engine in engines:
        for keep in _KEEPS:
            if not keep(engine, request):
                break
        else:
            candidates.append(engine)
    if not candidates:
        raise _first_refusal(engines, request)
    return candidates[policy.select(candidates, request)]


def _first_refusal(engines: Sequence[EngineView], request: RouteRequest) -> GatewayError:
    """The refusal of the first filter of the chain that leaves no candidate (one must)."""
    candidates = list(engines)
    for engine_filter in FILTERS:
        candidates = [engine for engine in candidates if engine_filter.keep(engine, request)]
        if not candidates:
            return engine_filter.refuse(request)
    raise AssertionError("every filter kept an engine that the single pass refused")
