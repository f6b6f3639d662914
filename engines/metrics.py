"""Prometheus metrics of an engine (prefix `dpgate_engine_`), in a registry of its own so several
engines can live in one test process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class EngineMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "dpgate_engine_requests",
            "RPCs answered by this engine, by rpc and status code.",
            ["rpc", "code"],
            registry=self.registry,
        )
        self.running = Gauge("dpgate_engine_running_requests", "Requests generating now.", registry=self.registry)
        self.waiting = Gauge("dpgate_engine_waiting_requests", "Requests queued.", registry=self.registry)

    def serve(self, host: str, port: int) -> None:
        start_http_server(port, addr=host, registry=self.registry)
