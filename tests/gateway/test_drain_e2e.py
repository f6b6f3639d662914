"""SIGTERM: NOT_SERVING first, a grace period, then new calls refused while running ones finish."""

from __future__ import annotations

import asyncio
import signal
import time

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dpgate.v1 import generate_pb2_grpc
from gateway.forwarding import DRAINING_MESSAGE
from tests.support.gateway_processes import (
    FAST_HEALTH,
    GatewayProcess,
    SyntheticEngineProcess,
    generate_request,
    inference_stub,
    stream_request,
)

GRACE_S = 0.3


def test_sigterm_lets_running_streams_finish_and_refuses_new_calls(engines, log_dir):
    gateway = GatewayProcess(
        [e.address for e in engines], *FAST_HEALTH, "--drain-grace", str(GRACE_S), "--shutdown-timeout", "30",
        log_dir=log_dir, name="gateway-drain",
    )  # fmt: skip
    try:
        gateway.wait_ranks([0, 1])

        async def run() -> None:
            async with aio.insecure_channel(gateway.address) as channel:
                stub = generate_pb2_grpc.InferenceServiceStub(channel)
                health = health_pb2_grpc.HealthStub(channel)
                calls = [stub.GenerateStream(stream_request(150), timeout=60) for _ in range(10)]

                async def collect(call) -> list[str]:
                    return [message.WhichOneof("event") async for message in call]

                results = [asyncio.create_task(collect(call)) for call in calls]
                while sum(engine.load().num_running for engine in engines) < 2:
                    await asyncio.sleep(0.02)
                gateway.process.send_signal(signal.SIGTERM)
                signalled = time.monotonic()

                status = await health.Check(health_pb2.HealthCheckRequest(), timeout=2)
                assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING
                await asyncio.sleep(GRACE_S + 0.2)
                try:
                    await stub.Generate(generate_request(1), timeout=5)
                    raise AssertionError("a new call was accepted after the drain grace")
                except aio.AioRpcError as error:
                    assert error.code() == grpc.StatusCode.UNAVAILABLE
                    assert error.details() == DRAINING_MESSAGE
                assert not all(task.done() for task in results), "streams ended before the refusal was seen"

                events = await asyncio.gather(*results)
                for call, streamed in zip(calls, events, strict=True):
                    assert await call.code() == grpc.StatusCode.OK
                    assert streamed[0] == "prompt_info" and streamed[-1] == "finish"
                    assert streamed.count("delta") >= 1
                assert time.monotonic() - signalled < 30

        asyncio.run(run())
        assert gateway.process.wait(15) == 0
    finally:
        gateway.stop()


def test_calls_still_running_at_the_shutdown_timeout_are_cancelled_upstream(log_dir):
    engine = SyntheticEngineProcess(0, 1, log_dir, "--token-delay", "0.05")
    engine.start()
    gateway = None
    try:
        engine.wait_serving()
        gateway = GatewayProcess(
            [engine.address], *FAST_HEALTH, "--drain-grace", "0.2", "--shutdown-timeout", "1",
            log_dir=log_dir, name="gateway-timeout",
        )  # fmt: skip
        gateway.wait_ranks([0])
        with grpc.insecure_channel(gateway.address) as channel:
            call = inference_stub(channel).GenerateStream(stream_request(1000), timeout=60)
            assert next(call).WhichOneof("event") == "prompt_info"
            gateway.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            try:
                for _ in call:
                    pass
                raise AssertionError("a 50 s stream finished inside a 1 s shutdown timeout")
            except grpc.RpcError as error:
                assert error.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
            assert time.monotonic() - signalled < 3
        assert gateway.process.wait(10) == 0
        deadline = time.monotonic() + 1
        while engine.load().num_running:
            assert time.monotonic() < deadline, "the engine kept generating for a cancelled call"
            time.sleep(0.02)
    finally:
        if gateway is not None:
            gateway.stop()
        engine.stop()
