"""The gateway's Prometheus metrics (`dpgate_gateway_*`), in a registry of their own.

A registry per gateway (rather than the global default) lets tests run several gateways in one
process and keeps the names this module declares the only ones the endpoint shows. The series
every call updates are `loop_metrics` families (no lock an update: only the event loop writes
them); the rest are prometheus_client's. Labelled
families whose label values are known in advance start at 0 for each (`retries` per rpc by the
forwarder, `engines_refused` per reason here): a series that appears only at its first event
makes `rate()` miss that event and leaves dashboards and alerts without data to show.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from gateway.handshake import RefusalReason
from gateway.health_state import CircuitState
from gateway.loop_metrics import CounterValue, LoopCounter, LoopHistogram

# Seconds; LLM calls run from milliseconds (rejections, cached prompts) to minutes.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# What the gateway adds to a call is well under a millisecond when it keeps up: finer buckets.
_ADDED_LATENCY_BUCKETS = (
    0.00005, 0.0001, 0.00015, 0.0002, 0.0003, 0.0004, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005,
    0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1,
)  # fmt: skip
_CIRCUIT_VALUE = {CircuitState.CLOSED: 0, CircuitState.HALF_OPEN: 1, CircuitState.OPEN: 2}


class GatewayMetrics:
    """Every metric the gateway exports; methods are named for the event they record."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = LoopCounter(
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
        self.routed = LoopCounter(
            "dpgate_gateway_routed_requests",
            "Calls forwarded, by serving data parallel rank.",
            ["rank"],
            registry=r,
        )
        self.routed_by_reason = LoopCounter(
            "dpgate_gateway_routed_by_reason",
            "Unpinned calls by why the policy chose the engine: cache (it holds part of the prompt and "
            "won on cost), load (no cached block decided it), balance (the guard spilled a hot prefix).",
            ["reason"],
            registry=r,
        )
        self.hashed_prompt_tokens = LoopCounter(
            "dpgate_gateway_hashed_prompt_tokens",
            "Prompt tokens of calls routed with their prompt hashed, by the rank chosen.",
            ["rank"],
            registry=r,
        )
        self.predicted_cached_tokens = LoopCounter(
            "dpgate_gateway_predicted_cached_tokens",
            "Of those, tokens the chosen engine's prefix cache held when the call was routed; beside the "
            "engine's dpgate_prefix_cache_hits_total (its reported cached tokens) it shows how exact routing is.",
            ["rank"],
            registry=r,
        )
        self.kv_event_lag = Histogram(
            "dpgate_gateway_kv_event_lag_seconds",
            "Time from an engine sending a KV event (or snapshot) to the gateway applying it to its index.",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5),
            registry=r,
        )
        self.retries = LoopCounter(
            "dpgate_gateway_retries",
            "Calls retried on another engine before the first token.",
            ["rpc"],
            registry=r,
        )
        self.ttft = LoopHistogram(
            "dpgate_gateway_time_to_first_token_seconds",
            "Time from call start to the first token relayed (streams).",
            [],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.duration = LoopHistogram(
            "dpgate_gateway_request_duration_seconds",
            "Time from call start to its end, by rpc.",
            ["rpc"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.added_latency = LoopHistogram(
            "dpgate_gateway_added_latency_seconds",
            "What the gateway added to a call, by rpc: from reading the request to its end, less the engine's "
            "part (from the request queued upstream to the engine's end read back).",
            ["rpc"],
            buckets=_ADDED_LATENCY_BUCKETS,
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
        # Each unpinned call counts its reason (and, hashed, its tokens by rank): children are
        # looked up once, not by labels() a call (issue 27 measured the gateway's path per call).
        self._routed_by_reason: dict[str, CounterValue] = {}
        self._prompt_tokens_by_rank: dict[int, tuple[CounterValue, CounterValue]] = {}

    def record_route(self, reason: str, rank: int, prompt_tokens: int, cached_tokens: int) -> None:
        counter = self._routed_by_reason.get(reason)
        if counter is None:
            counter = self._routed_by_reason[reason] = self.routed_by_reason.labels(reason=reason)
        counter.inc()
        if prompt_tokens:
            counters = self._prompt_tokens_by_rank.get(rank)
            if counters is None:
                counters = self._prompt_tokens_by_rank[rank] = (
                    self.hashed_prompt_tokens.labels(rank=str(rank)),
                    self.predicted_cached_tokens.labels(rank=str(rank)),
                )
            counters[0].inc(prompt_tokens)
            counters[1].inc(cached_tokens)

    def watch_kv_index(self, sizes_by_engine: Callable[[], Iterable[tuple[int, str, int, int]]]) -> None:
        """Export `dpgate_gateway_kv_index_blocks{rank,address}` and
        `dpgate_gateway_kv_pending_prompts{rank,address}`, read at each scrape from the index:
        `sizes_by_engine` yields (rank, address, cached blocks, announced prompts not settled)."""
        self.registry.register(_IndexCollector(sizes_by_engine))

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


class _IndexCollector:
    """The index's size per engine, computed when scraped (no bookkeeping on the event path)."""

    def __init__(self, sizes_by_engine: Callable[[], Iterable[tuple[int, str, int, int]]]) -> None:
        self._sizes_by_engine = sizes_by_engine

    def collect(self):
        blocks = GaugeMetricFamily(
            "dpgate_gateway_kv_index_blocks",
            "Cached KV blocks the gateway's index holds for each engine (from its WatchKvEvents stream).",
            labels=["rank", "address"],
        )
        pending = GaugeMetricFamily(
            "dpgate_gateway_kv_pending_prompts",
            "Prompts each engine announced as queued or in prefill and not yet computed (WatchKvEvents).",
            labels=["rank", "address"],
        )
        for rank, address, num_blocks, num_pending in self._sizes_by_engine():
            blocks.add_metric([str(rank), address], num_blocks)
            pending.add_metric([str(rank), address], num_pending)
        yield blocks
        yield pending
