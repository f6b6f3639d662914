"""Prometheus metrics of an engine (prefix `dpgate_engine_`), in a registry of its own so several
engines can live in one test process.

`dpgate_engine_info` (always 1) carries the engine's identity as labels, so a dashboard can name
an engine's series by its data parallel rank: `... * on (instance) group_left (data_parallel_rank)
dpgate_engine_info` (deploy/grafana/dpgate.json does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

if TYPE_CHECKING:
    from engines.engine import LLMEngine
    from engines.serving.async_engine import AsyncEngine

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class EngineMetrics:
    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.info = Gauge(
            "dpgate_engine_info",
            "Always 1; the labels say which engine this is.",
            ["data_parallel_rank", "data_parallel_size", "model", "version"],
            registry=registry,
        )
        self.requests = Counter(
            "dpgate_engine_requests",
            "RPCs answered by this engine, by rpc and status code.",
            ["rpc", "code"],
            registry=registry,
        )
        self.running = Gauge("dpgate_engine_running_requests", "Requests in the running batch.", registry=registry)
        self.waiting = Gauge("dpgate_engine_waiting_requests", "Requests queued.", registry=registry)
        self.kv_usage = Gauge("dpgate_engine_kv_cache_usage", "Fraction of KV-cache blocks in use.", registry=registry)
        self.preemptions = Counter("dpgate_engine_preemptions", "Sequences preempted by recompute.", registry=registry)
        self.prompt_tokens = Counter("dpgate_engine_prompt_tokens", "Prompt tokens prefilled.", registry=registry)
        self.generated_tokens = Counter("dpgate_engine_generated_tokens", "Tokens generated.", registry=registry)
        self.ttft = Histogram(
            "dpgate_engine_time_to_first_token_seconds",
            "Arrival to first token.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.tpot = Histogram(
            "dpgate_engine_time_per_output_token_seconds",
            "Mean gap between output tokens.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        # vLLM's names for the same facts: tokens looked up in the prefix cache, and found there.
        self.prefix_queries = Counter(
            "dpgate_prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", registry=registry
        )
        self.prefix_hits = Counter(
            "dpgate_prefix_cache_hits", "Prompt tokens found in the prefix cache (not recomputed).", registry=registry
        )
        self.prefix_blocks = Gauge(
            "dpgate_prefix_cache_blocks", "KV-cache blocks registered in the prefix cache.", registry=registry
        )
        self.cached_free_blocks = Gauge(
            "dpgate_prefix_cache_free_blocks",
            "Cached KV-cache blocks no request holds (reusable by a hit, evicted first-freed first).",
            registry=registry,
        )
        self._prefix_seen = (0, 0)  # the block manager's query and hit tokens at the last step
        self.step_time = Histogram(
            "dpgate_engine_step_seconds", "Duration of one engine step.", buckets=LATENCY_BUCKETS, registry=registry
        )

    def set_identity(self, data_parallel_rank: int, data_parallel_size: int, model: str, version: str) -> None:
        self.info.labels(
            data_parallel_rank=str(data_parallel_rank),
            data_parallel_size=str(data_parallel_size),
            model=model,
            version=version,
        ).set(1)

    def watch(self, engine: AsyncEngine) -> None:
        """Read load gauges from the engine and count each step's work (called on the engine thread)."""
        self.running.set_function(lambda: engine.num_running)
        self.waiting.set_function(lambda: engine.num_waiting)
        self.kv_usage.set_function(lambda: engine.kv_usage)
        self.prefix_blocks.set_function(lambda: engine.blocks.num_cached)
        self.cached_free_blocks.set_function(lambda: engine.blocks.num_cached_free)
        engine.on_step = self.record_step

    def record_step(self, engine: LLMEngine) -> None:
        stats = engine.last_step
        self.preemptions.inc(stats.num_preempted)
        self.prompt_tokens.inc(stats.num_prompt_tokens)
        self.generated_tokens.inc(stats.num_generated_tokens)
        self.step_time.observe(stats.seconds)
        manager = engine.block_manager
        queries, hits = manager.num_query_tokens, manager.num_hit_tokens
        self.prefix_queries.inc(queries - self._prefix_seen[0])
        self.prefix_hits.inc(hits - self._prefix_seen[1])
        self._prefix_seen = (queries, hits)

    def serve(self, host: str, port: int) -> None:
        start_http_server(port, addr=host, registry=self.registry)
