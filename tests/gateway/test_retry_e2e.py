"""Retry once on another engine before the first token; never after a token was sent."""

from __future__ import annotations

import asyncio

import grpc
from grpc import aio

from dpgate.v1 import generate_pb2_grpc
from tests.support.gateway_processes import (
    RANK_KEY,
    GatewayProcess,
    SyntheticEngineProcess,
    generate_request,
    inference_stub,
    stream_request,
)

# Slow probes: the gateway must not learn of the dead engine from health checks during the test.
SLOW_HEALTH = (
    "--health-interval", "30", "--health-timeout", "5",
    "--failure-threshold", "100", "--breaker-failure-threshold", "100",
)  # fmt: skip


def start_pair(log_dir, *flags):
    engines = [SyntheticEngineProcess(rank, 2, log_dir, *flags) for rank in (0, 1)]
    for engine in engines:
        engine.start()
    for engine in engines:
        engine.wait_serving()
    return engines


def test_unpinned_calls_are_retried_on_another_engine_before_the_first_token(log_dir):
    engines = start_pair(log_dir)
    gateway = None
    try:
        gateway = GatewayProcess([e.address for e in engines], *SLOW_HEALTH, log_dir=log_dir, name="gateway-retry")
        gateway.wait_ranks([0, 1])
        engines[0].kill()
        with grpc.insecure_channel(gateway.address) as channel:
            stub = inference_stub(channel)
            # Least-loaded ties rotate, so each loop tries the dead rank 0 first at least once.
            for _ in range(4):
                _, call = stub.Generate.with_call(generate_request(1), timeout=10)
                assert dict(call.trailing_metadata())[RANK_KEY] == "1"
            for _ in range(4):
                stream = stub.GenerateStream(stream_request(2), timeout=10)
                assert [m.WhichOneof("event") for m in stream][-1] == "finish"
                assert dict(stream.trailing_metadata())[RANK_KEY] == "1"
        samples = gateway.metrics()
        assert samples['dpgate_gateway_retries_total{rpc="Generate"}'] >= 1
        assert samples['dpgate_gateway_retries_total{rpc="GenerateStream"}'] >= 1
    finally:
        if gateway is not None:
            gateway.stop()
        for engine in engines:
            engine.stop()


def test_a_stream_that_already_sent_tokens_is_not_retried(log_dir):
    engines = start_pair(log_dir, "--token-delay", "0.05")
    gateway = None
    try:
        gateway = GatewayProcess([e.address for e in engines], *SLOW_HEALTH, log_dir=log_dir, name="gateway-noretry")
        gateway.wait_ranks([0, 1])

        async def run() -> None:
            async with aio.insecure_channel(gateway.address) as channel:
                call = generate_pb2_grpc.InferenceServiceStub(channel).GenerateStream(stream_request(400), timeout=30)
                events = []
                async for message in call:
                    events.append(message.WhichOneof("event"))
                    if events.count("delta") == 3:
                        busy = [e for e in engines if e.load().num_running == 1]
                        assert len(busy) == 1
                        busy[0].kill()
                        break
                try:
                    async for message in call:
                        events.append(message.WhichOneof("event"))
                    raise AssertionError("the stream went on after its engine died")
                except aio.AioRpcError as error:
                    assert error.code() == grpc.StatusCode.INTERNAL
                    assert "failed after" in error.details()
                assert events.count("prompt_info") == 1  # no second attempt started a new stream

        asyncio.run(run())
        samples = gateway.metrics()
        assert samples.get('dpgate_gateway_retries_total{rpc="GenerateStream"}', 0) == 0
    finally:
        if gateway is not None:
            gateway.stop()
        for engine in engines:
            engine.stop()
