"""The gateway's Prometheus metrics (`dpgate_gateway_*`), in a registry of their own.

A registry per gateway (rather than the global default) lets tests run several gateways in one
process and keeps the names this module declares the only ones the endpoint shows. Labelled
families whose label values are known in advance start at 0 for each (`retries` per rpc by the
forwarder, `engines_refused` per reason here): a series that appears only at its first event
makes `rate()` miss that event and leaves dashboards and alerts without data to show.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from gateway.handshake import RefusalReason
from gateway.health_state import CircuitState

# Seconds; LLM calls run from milliseconds (rejections, cached prompts) to minutes.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_CIRCUIT_VALUE = {CircuitState.CLOSED: 0, CircuitState.HALF_OPEN: 1, CircuitState.OPEN: 2}


class GatewayMetrics:
    """Every metric the gateway exports; methods are named for the event they record."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "dpgate_gateway_requests",
            "Calls served, by rpc and final status code.",
            ["rpc", "code"],
            registry=r,
        )
        self.rejected_metadata = Counter(
            "dpgate_gateway_rejected_metadata",
            "Calls refused for bad routing metadata, by metadata key.",
            ["key"],
            registry=r,
        )
        self.routed = Counter(
            "dpgate_gateway_routed_requests",
            "Calls forwarded, by serving data parallel rank.",
            ["rank"],
            registry=r,
        )
        self.retries = Counter(
            "dpgate_gateway_retries",
            "Calls retried on another engine before the first token.",
            ["rpc"],
            registry=r,
        )
        self.ttft = Histogram(
            "dpgate_gateway_time_to_first_token_seconds",
            "Time from call start to the first token relayed (streams).",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "dpgate_gateway_request_duration_seconds",
            "Time from call start to its end, by rpc.",
            ["rpc"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("dpgate_gateway_in_flight_requests", "Calls being served now.", registry=r)
        self.engine_healthy = Gauge(
            "dpgate_gateway_engine_healthy",
            "1 when the engine passes health checks, else 0, by rank and address.",
            ["rank", "address"],
            registry=r,
        )
        self.circuit_state = Gauge(
            "dpgate_gateway_circuit_state",
            "Circuit breaker per engine: 0 closed, 1 half open, 2 open.",
            ["rank", "address"],
            registry=r,
        )
        self.engines_refused = Counter(
            "dpgate_gateway_engines_refused",
            "Engines refused at the handshake, by reason.",
            ["reason"],
            registry=r,
        )

        for reason in RefusalReason:
            self.engines_refused.labels(reason=reason.value)

    def set_engine_health(self, rank: int, address: str, is_healthy: bool) -> None:
        self.engine_healthy.labels(rank=str(rank), address=address).set(1 if is_healthy else 0)

    def set_circuit_state(self, rank: int, address: str, state: CircuitState) -> None:
        self.circuit_state.labels(rank=str(rank), address=address).set(_CIRCUIT_VALUE[state])

    def forget_engine(self, rank: int, address: str) -> None:
        """Drop a retired engine's per-engine series, so dashboards do not show it forever."""
        for gauge in (self.engine_healthy, self.circuit_state):
            with contextlib.suppress(KeyError):
                gauge.remove(str(rank), address)

    def serve(self, host: str, port: int) -> int:
        """Expose the registry over HTTP; returns the bound port (`port` 0 picks a free one)."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return server.server_port
