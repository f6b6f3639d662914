"""An engine killed under load: its streams end promptly, traffic moves, and it comes back."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from grpc import aio

from dpgate.v1 import generate_pb2_grpc
from tests.support.gateway_processes import RANK_KEY, generate_request, inference_stub, stream_request

HEALTH_INTERVAL_S = 0.25  # FAST_HEALTH in processes.py


def test_killed_engine_streams_end_traffic_moves_and_it_returns(gateway, engines):
    victim = engines[1]

    async def run_streams() -> None:
        async with aio.insecure_channel(gateway.address) as channel:
            stub = generate_pb2_grpc.InferenceServiceStub(channel)
            calls = {
                rank: [
                    stub.GenerateStream(stream_request(900), metadata=[(RANK_KEY, str(rank))], timeout=120)
                    for _ in range(10)
                ]
                for rank in (0, 1)
            }
            deadline = time.monotonic() + 30
            while True:  # every stream reached its engine, running or queued
                loads = [engine.load() for engine in engines]
                if [x.num_running + x.num_waiting for x in loads] == [10, 10]:
                    break
                assert time.monotonic() < deadline, [(x.num_running, x.num_waiting) for x in loads]
                await asyncio.sleep(0.05)

            async def drain(call) -> grpc.StatusCode:
                try:
                    async for _ in call:
                        pass
                except aio.AioRpcError as error:
                    return error.code()
                return grpc.StatusCode.OK

            victim_ends = [asyncio.create_task(drain(call)) for call in calls[1]]
            survivor_ends = [asyncio.create_task(drain(call)) for call in calls[0]]
            killed_at = time.monotonic()
            victim.kill()
            codes = await asyncio.wait_for(asyncio.gather(*victim_ends), 2.0)
            assert time.monotonic() - killed_at < 2.0
            assert all(code != grpc.StatusCode.OK for code in codes), codes
            assert {code for code in codes} <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL}
            assert not any(task.done() for task in survivor_ends)  # rank 0 keeps generating
            for call in calls[0]:
                call.cancel()
            await asyncio.gather(*survivor_ends, return_exceptions=True)

    try:
        asyncio.run(run_streams())
        with grpc.insecure_channel(gateway.address) as channel:
            stub = inference_stub(channel)
            for _ in range(10):
                _, call = stub.Generate.with_call(generate_request(1), timeout=10)
                assert dict(call.trailing_metadata())[RANK_KEY] == "0"
            with pytest.raises(grpc.RpcError) as info:
                stub.Generate(generate_request(1), metadata=[(RANK_KEY, "1")], timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "Traceback" not in info.value.details()

            victim.start()
            victim.wait_serving()
            back_at = time.monotonic()
            while True:
                try:
                    stub.Generate(generate_request(1), metadata=[(RANK_KEY, "1")], timeout=10)
                    break
                except grpc.RpcError as error:
                    assert error.code() == grpc.StatusCode.UNAVAILABLE
                    time.sleep(0.01)
            # One interval, plus the probe's own three calls and this loop's granularity.
            elapsed = time.monotonic() - back_at
            assert elapsed <= HEALTH_INTERVAL_S + 0.25, f"rank 1 back in rotation after {elapsed:.3f} s"
    finally:
        if victim.process is None or victim.process.poll() is not None:
            victim.start()
            victim.wait_serving()
