"""What a relayed call needs from the forwarder that admitted it: a protocol, so the call objects
(forwarded_call.py, pass_through.py) do not import the forwarder that creates them (forwarding.py
implements it)."""

from __future__ import annotations

from typing import Any, Protocol

import grpc

from gateway.config import GatewayConfig
from gateway.engine_client import EngineClient
from gateway.health_state import CallEvent
from gateway.metrics import GatewayMetrics
from gateway.prompt_routing import PromptRouter
from gateway.routing.filters import PromptBlocks
from gateway.upstream import UpstreamLink


class CallHost(Protocol):
    """The forwarder's side of a call: admission counts, engine choice, outcome bookkeeping."""

    metrics: GatewayMetrics
    config: GatewayConfig
    max_message_bytes: int
    num_in_flight: int
    calls: set[Any]  # the calls in flight (cancelled together at shutdown)
    in_flight_by_peer: dict[str, int]  # client address -> its calls in flight
    prompts: PromptRouter  # a Generate call's prompt blocks, for cache-aware routing
    local_services: UpstreamLink | None  # the gateway's own health and reflection server

    def choose(
        self, rank: int | None, excluded: frozenset[str], model: str | None = None, prompt: PromptBlocks | None = None
    ) -> EngineClient:
        """The engine for a call: the pinned rank's, else the policy's pick among the usable others."""
        ...

    def call_ended(
        self,
        rpc: str,
        code: grpc.StatusCode,
        rank: int | None,
        start: float,
        request_id: str,
        added_from: float | None = None,
    ) -> None:
        """Count, time and log an ended call (its code, its latency, its access line); the in-flight
        gauge reads `num_in_flight`, which the call itself lowers. `added_from`: the call's end less
        this is the latency the gateway added (None when no engine answered it)."""
        ...

    def record_outcome(self, engine: EngineClient, outcome: str | CallEvent) -> None:
        """Feed an engine's breaker what a call it served ended with."""
        ...

    def usable_engines(self) -> list[EngineClient]:
        """Engines an unpinned Abort goes to."""
        ...
