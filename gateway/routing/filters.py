"""The filters of `choose_engine_for_request`, one small predicate each, in the order they run.

Each filter keeps an engine that may serve the request. The chain order is part of the contract:
when a pinned rank's engine is filtered out, the first filter that removed it names the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from gateway.errors import GatewayError, NotFound, Unavailable
from gateway.routing.snapshot import EngineView


@dataclass(slots=True, frozen=True)
class PromptBlocks:
    """What the gateway learned from the prompt: its length and, per engine address, how many of
    its leading tokens that engine's prefix cache would give it (the exact index, plus the
    prefixes of calls this gateway has open there: gateway/routing/in_flight.py)."""

    num_prompt_tokens: int
    # address -> leading prompt tokens the engine holds or is computing for an open call (routing).
    matched_tokens: Mapping[str, int] = field(default_factory=dict)
    # address -> of which its cache held when read from the exact index (the prediction metric).
    cached_tokens: Mapping[str, int] = field(default_factory=dict)
    # address -> the prompt's block chain as that engine hashes it (kept while the call is open).
    chains: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


class RouteRequest(NamedTuple):
    """What routing knows about a call: its pinned rank, the model (when known) and engines to skip.

    `model` is None when the gateway did not read the body (the gRPC relay forwards bodies as raw
    bytes; the engine then answers NOT_FOUND for a model it does not serve); the OpenAI HTTP API,
    which parses its JSON, sets it. `excluded_addresses` holds engines
    already tried by this call, so a retry never lands on the same engine.
    `prompt` is filled only for calls the gateway tokenized (Generate text or ids, unpinned).
    A named tuple, as `EngineView` is: one is made for every call.
    """

    rank: int | None = None
    model: str | None = None
    excluded_addresses: frozenset[str] = frozenset()
    # The prompt's cache view, when the gateway hashed it (cache-aware routing); else None.
    prompt: PromptBlocks | None = None


def _unavailable(request: RouteRequest, reason: str) -> GatewayError:
    if request.rank is not None:
        return Unavailable(f"data parallel rank {request.rank} {reason}")
    return Unavailable(f"no engine can serve the request: every candidate {reason}")


def _model_not_found(request: RouteRequest, reason: str) -> GatewayError:
    where = f"data parallel rank {request.rank}" if request.rank is not None else "any connected engine"
    return NotFound(f"model {request.model!r} is not served by {where}")


@dataclass(slots=True, frozen=True)
class EngineFilter:
    """One link of the chain: a predicate, the phrase that explains a rejection, and the error a
    call gets when this filter removes every candidate (UNAVAILABLE unless the filter says)."""

    name: str
    reason: str
    keep: Callable[[EngineView, RouteRequest], bool]
    refusal: Callable[[RouteRequest, str], GatewayError] = _unavailable

    def refuse(self, request: RouteRequest) -> GatewayError:
        return self.refusal(request, self.reason)


def _is_healthy(engine: EngineView, request: RouteRequest) -> bool:
    return engine.is_healthy


def _serves_model(engine: EngineView, request: RouteRequest) -> bool:
    return not request.model or engine.model == request.model


def _is_not_draining(engine: EngineView, request: RouteRequest) -> bool:
    return not engine.is_draining


def _is_circuit_closed(engine: EngineView, request: RouteRequest) -> bool:
    return engine.is_circuit_closed


def _is_not_excluded(engine: EngineView, request: RouteRequest) -> bool:
    return engine.address not in request.excluded_addresses


def _matches_rank(engine: EngineView, request: RouteRequest) -> bool:
    return request.rank is None or engine.rank == request.rank


FILTERS: tuple[EngineFilter, ...] = (
    EngineFilter("healthy", "is not healthy", _is_healthy),
    EngineFilter("model", "does not serve the model", _serves_model, _model_not_found),
    EngineFilter("draining", "is draining", _is_not_draining),
    EngineFilter("circuit", "has an open circuit breaker", _is_circuit_closed),
    EngineFilter("excluded", "already failed this call", _is_not_excluded),
    EngineFilter("rank", "does not own the rank", _matches_rank),
)
