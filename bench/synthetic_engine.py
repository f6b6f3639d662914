"""A fast synthetic engine that speaks dpgate.v1, for the gateway's benchmark and tests.

It answers Generate and GenerateStream with a configurable number of tokens and delay per token,
implements ControlService (GetServerInfo with its rank and DP size, GetModelInfo, GetLoad, Abort)
and grpc.health.v1, and counts calls in `dpgate_engine_requests_total{rpc,code}` like the real
engine. No model runs, so the benchmark measures the gateway, not the engine (the way router
benchmarks use a stub backend). `--max-running 1` mimics the real engine's one-request-at-a-time
scheduling: later requests wait and count as num_waiting. `--prefix-cache` makes it look like an
engine with a prefix cache to the gateway, so the gateway takes its cache-aware path (tokenize,
hash, score) for every unpinned Generate: it hands out the packaged SmolLM2's tokenizer
(GetTokenizer) and publishes an empty cached set (WatchKvEvents: one snapshot, then nothing), so
every prompt is a miss and the path is measured at its full cost.

Run alone: `python bench/synthetic_engine.py --port 50061 --data-parallel-rank 0 --data-parallel-size 2`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections import Counter
from dataclasses import dataclass

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from dpgate.v1 import control_pb2, generate_pb2

INFERENCE_SERVICE = "dpgate.v1.InferenceService"
CONTROL_SERVICE = "dpgate.v1.ControlService"

# A Generate prompt with this text is answered with the deadline the engine saw (seconds left, or
# "none"), so tests can show that the gateway passes the client's deadline downstream.
ECHO_DEADLINE_PROMPT = "echo-deadline"


@dataclass(slots=True, frozen=True)
class SyntheticEngineConfig:
    """How the synthetic engine behaves. `num_tokens` is used when a request sets no max_tokens."""

    data_parallel_rank: int = 0
    data_parallel_size: int = 1
    model: str = "synthetic"
    num_tokens: int = 8
    token_delay_s: float = 0.0
    max_running: int | None = None
    # Characters of text in each streamed delta: a large value makes a stream produce bytes as fast
    # as a busy real deployment would, so a client that never reads can be tested in seconds.
    delta_chars: int = 1
    # GetTokenizer's answer, when the engine should publish a (always empty) prefix cache.
    tokenizer: control_pb2.GetTokenizerResponse | None = None


def smollm2_tokenizer_message() -> control_pb2.GetTokenizerResponse:
    """The packaged SmolLM2's tokenizer as the real engine exports it (Generate text only)."""
    from engines.model.source import resolve_model
    from engines.model.tokenizer import load_tokenizer
    from engines.serving.tokenizer_export import tokenizer_message

    return tokenizer_message(load_tokenizer(resolve_model("smollm2-135m-instruct")).tokenizer, None)


class SyntheticEngine:
    """The servicer plus its load counters; `start` binds a port and returns it."""

    def __init__(self, config: SyntheticEngineConfig) -> None:
        self.config = config
        self.num_running = 0
        self.num_waiting = 0
        self.requests_total: Counter[tuple[str, str]] = Counter()
        self._slots = asyncio.Semaphore(config.max_running) if config.max_running else None
        self._server: aio.Server | None = None
        self._tasks: dict[str, asyncio.Task] = {}
        self._metrics_counter = None
        self._server_info = control_pb2.GetServerInfoResponse(
            version="synthetic",
            parallelism=control_pb2.Parallelism(
                data_parallel_rank=config.data_parallel_rank,
                data_parallel_size=config.data_parallel_size,
                tensor_parallel_size=1,
                decode_context_parallel_size=1,
            ),
            model=config.model,
            max_model_len=4096,
            kv_block_size=16,
            num_kv_blocks=1024,
            prefix_caching=config.tokenizer is not None,
            prefix_cache_root_hash=0x5EED if config.tokenizer is not None else 0,
            tokenizer_fingerprint=config.tokenizer.fingerprint if config.tokenizer is not None else "",
        ).SerializeToString()
        self._model_info = control_pb2.GetModelInfoResponse(
            model=config.model, architecture="synthetic", vocab_size=32000, max_model_len=4096, dtype="none"
        ).SerializeToString()

    # --- accounting ---------------------------------------------------------------------------

    def _count(self, rpc: str, code: grpc.StatusCode) -> None:
        self.requests_total[(rpc, code.name)] += 1
        if self._metrics_counter is not None:
            self._metrics_counter.labels(rpc=rpc, code=code.name).inc()

    def enable_metrics(self, port: int) -> int:
        """Serve `dpgate_engine_requests_total` over HTTP on `port` (0: a free one); return the port."""
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client import Counter as PromCounter

        registry = CollectorRegistry()
        self._metrics_counter = PromCounter(
            "dpgate_engine_requests", "Calls by rpc and code.", ["rpc", "code"], registry=registry
        )
        server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
        return server.server_port

    @contextlib.asynccontextmanager
    async def _slot(self):
        if self._slots is None:
            self.num_running += 1
            try:
                yield
            finally:
                self.num_running -= 1
            return
        self.num_waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.num_waiting -= 1
        self.num_running += 1
        try:
            yield
        finally:
            self.num_running -= 1
            self._slots.release()

    @contextlib.contextmanager
    def _counted(self, rpc: str):
        """Count the call under `rpc` with OK, or CANCELLED when the client went away."""
        code = grpc.StatusCode.OK
        try:
            yield
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        finally:
            self._count(rpc, code)

    def _num_tokens(self, stopping: generate_pb2.StoppingCriteria) -> int:
        return stopping.max_tokens if stopping.HasField("max_tokens") else self.config.num_tokens

    # --- InferenceService ---------------------------------------------------------------------

    async def generate(self, raw: bytes, context: aio.ServicerContext) -> bytes:
        request = generate_pb2.GenerateRequest.FromString(raw)
        with self._counted("Generate"):
            async with self._slot():
                num_tokens = self._num_tokens(request.stopping)
                if request.text == ECHO_DEADLINE_PROMPT:
                    remaining = context.time_remaining()
                    text = "none" if remaining is None else f"{remaining:.3f}"
                    return generate_pb2.GenerateResponse(text=text).SerializeToString()
                if self.config.token_delay_s:
                    await asyncio.sleep(self.config.token_delay_s * num_tokens)
                return generate_pb2.GenerateResponse(
                    request_id=request.request_id or "r",
                    text="x" * num_tokens,
                    token_ids=range(num_tokens),
                    finish=generate_pb2.FinishInfo(
                        reason=generate_pb2.FINISH_REASON_LENGTH, num_generated_tokens=num_tokens
                    ),
                ).SerializeToString()

    async def generate_stream(self, raw: bytes, context: aio.ServicerContext) -> None:
        request = generate_pb2.GenerateStreamRequest.FromString(raw)
        with self._counted("GenerateStream"):
            async with self._slot():
                num_tokens = self._num_tokens(request.stopping)
                prompt = generate_pb2.GenerateStreamResponse(
                    prompt_info=generate_pb2.PromptInfo(request_id=request.request_id or "r")
                )
                await context.write(prompt.SerializeToString())
                delta = generate_pb2.GenerateStreamResponse(
                    delta=generate_pb2.Delta(text="x" * self.config.delta_chars, token_ids=[7])
                ).SerializeToString()
                delay = self.config.token_delay_s
                for _ in range(num_tokens):
                    if delay:
                        await asyncio.sleep(delay)
                    await context.write(delta)
                finish = generate_pb2.GenerateStreamResponse(
                    finish=generate_pb2.FinishInfo(
                        reason=generate_pb2.FINISH_REASON_LENGTH, num_generated_tokens=num_tokens
                    )
                )
                await context.write(finish.SerializeToString())

    # --- ControlService -----------------------------------------------------------------------

    async def get_server_info(self, raw: bytes, context: aio.ServicerContext) -> bytes:
        self._count("GetServerInfo", grpc.StatusCode.OK)
        return self._server_info

    async def get_model_info(self, raw: bytes, context: aio.ServicerContext) -> bytes:
        self._count("GetModelInfo", grpc.StatusCode.OK)
        return self._model_info

    async def get_load(self, raw: bytes, context: aio.ServicerContext) -> bytes:
        self._count("GetLoad", grpc.StatusCode.OK)
        return control_pb2.GetLoadResponse(
            num_running=self.num_running, num_waiting=self.num_waiting, kv_usage=0.0
        ).SerializeToString()

    async def abort(self, raw: bytes, context: aio.ServicerContext) -> bytes:
        self._count("Abort", grpc.StatusCode.OK)
        return control_pb2.AbortResponse().SerializeToString()

    async def get_tokenizer(self, raw: bytes, context: aio.ServicerContext) -> bytes:
        self._count("GetTokenizer", grpc.StatusCode.OK)
        return self.config.tokenizer.SerializeToString()

    async def watch_kv_events(self, raw: bytes, context: aio.ServicerContext):
        """An empty cached set, then nothing until the subscriber leaves."""
        self._count("WatchKvEvents", grpc.StatusCode.OK)
        snapshot = control_pb2.WatchKvEventsResponse(incarnation_id="synthetic", snapshot=control_pb2.KvSnapshot())
        yield snapshot.SerializeToString()
        await asyncio.Event().wait()

    # --- server -------------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        server = aio.server(options=[("grpc.so_reuseport", 0)])
        unary = grpc.unary_unary_rpc_method_handler
        server.add_registered_method_handlers(
            INFERENCE_SERVICE,
            {
                "Generate": unary(self.generate),
                "GenerateStream": grpc.unary_stream_rpc_method_handler(self.generate_stream),
            },
        )
        control = {
            "GetServerInfo": unary(self.get_server_info),
            "GetModelInfo": unary(self.get_model_info),
            "GetLoad": unary(self.get_load),
            "Abort": unary(self.abort),
        }
        if self.config.tokenizer is not None:
            control["GetTokenizer"] = unary(self.get_tokenizer)
            control["WatchKvEvents"] = grpc.unary_stream_rpc_method_handler(self.watch_kv_events)
        server.add_registered_method_handlers(CONTROL_SERVICE, control)
        health = health_aio.HealthServicer()
        for service in ("", INFERENCE_SERVICE, CONTROL_SERVICE):
            await health.set(service, health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        bound = server.add_insecure_port(f"{host}:{port}")
        await server.start()
        self._server = server
        return bound

    async def stop(self, grace: float | None = None) -> None:
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A synthetic dpgate.v1 engine (no model).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--data-parallel-rank", type=int, default=0)
    parser.add_argument("--data-parallel-size", type=int, default=1)
    parser.add_argument("--model", default="synthetic")
    parser.add_argument("--num-tokens", type=int, default=8, help="tokens when a request sets no max_tokens")
    parser.add_argument("--token-delay", type=float, default=0.0, help="seconds per generated token")
    parser.add_argument("--max-running", type=int, default=0, help="0: no limit; 1: like the real engine")
    parser.add_argument("--delta-chars", type=int, default=1, help="characters of text in each streamed delta")
    parser.add_argument("--metrics-port", type=int)
    parser.add_argument("--prefix-cache", action="store_true", help="publish an empty prefix cache (see above)")
    args = parser.parse_args(argv)
    config = SyntheticEngineConfig(
        data_parallel_rank=args.data_parallel_rank,
        data_parallel_size=args.data_parallel_size,
        model=args.model,
        num_tokens=args.num_tokens,
        token_delay_s=args.token_delay,
        max_running=args.max_running or None,
        delta_chars=args.delta_chars,
        tokenizer=smollm2_tokenizer_message() if args.prefix_cache else None,
    )

    async def serve() -> None:
        engine = SyntheticEngine(config)
        metrics_note = ""
        if args.metrics_port is not None:
            metrics_note = f" metrics {engine.enable_metrics(args.metrics_port)}"
        port = await engine.start(args.host, args.port)
        print(f"synthetic engine listening on {args.host}:{port}{metrics_note}", flush=True)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        await engine.stop(0.5)

    try:
        import uvloop

        uvloop.run(serve())
    except ImportError:
        asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
