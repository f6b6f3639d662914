"""A client that cancels, disconnects or runs out of deadline stops the engine's work too."""

from __future__ import annotations

import asyncio
import subprocess
import time

import grpc
import pytest
from grpc import aio

from dpgate.v1 import generate_pb2_grpc
from tests.support.gateway_processes import PYTHON, ROOT, generate_request, read_line, stream_request

LONG = 900  # tokens: several seconds of generation on the tiny model


def wait_idle(engines, within: float) -> float:
    """Seconds until every engine reports nothing running or waiting; fails after `within`."""
    start = time.monotonic()
    while True:
        loads = [engine.load() for engine in engines]
        if all(load.num_running == 0 and load.num_waiting == 0 for load in loads):
            return time.monotonic() - start
        if time.monotonic() - start > within:
            pytest.fail(f"engines still busy after {within}s: {[(x.num_running, x.num_waiting) for x in loads]}")
        time.sleep(0.02)


def test_fifty_streams_cancelled_mid_generation_free_the_engines(gateway, engines):
    async def run() -> None:
        async with aio.insecure_channel(gateway.address) as channel:
            stub = generate_pb2_grpc.InferenceServiceStub(channel)
            calls = [stub.GenerateStream(stream_request(LONG), timeout=60) for _ in range(50)]
            tokens_seen = asyncio.Event()
            num_generating = 0

            async def read(call) -> None:
                nonlocal num_generating
                async for message in call:
                    if message.WhichOneof("event") == "delta":
                        num_generating += 1
                        if num_generating >= 2:
                            tokens_seen.set()
                        return

            readers = [asyncio.create_task(read(call)) for call in calls]
            await asyncio.wait_for(tokens_seen.wait(), 30)
            deadline = time.monotonic() + 10
            while True:  # every stream has reached an engine (running or queued, as its scheduler decides)
                loads = [engine.load() for engine in engines]
                if sum(load.num_running + load.num_waiting for load in loads) == 50:
                    break
                assert time.monotonic() < deadline, [(x.num_running, x.num_waiting) for x in loads]
                await asyncio.sleep(0.05)
            assert all(load.num_running >= 1 for load in loads)
            for call in calls:
                call.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            assert all(call.cancelled() for call in calls)

    asyncio.run(run())
    wait_idle(engines, within=1.0)


def test_client_that_disconnects_frees_the_engine(gateway, engines):
    """A client process killed mid-stream: the gateway sees the connection drop and cancels upstream."""
    script = (
        "import sys, grpc\n"
        "from dpgate.v1 import generate_pb2, generate_pb2_grpc\n"
        "stub = generate_pb2_grpc.InferenceServiceStub(grpc.insecure_channel(sys.argv[1]))\n"
        "request = generate_pb2.GenerateStreamRequest(text='hi', stopping=generate_pb2.StoppingCriteria("
        "max_tokens=900, ignore_eos=True))\n"
        "for message in stub.GenerateStream(request):\n"
        "    if message.WhichOneof('event') == 'delta':\n"
        "        print('generating', flush=True)\n"
    )
    client = subprocess.Popen(
        [PYTHON, "-c", script, gateway.address], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        read_line(client, "generating", timeout=30)
        assert sum(engine.load().num_running for engine in engines) == 1
    finally:
        client.kill()
        client.wait()
        client.stdout.close()
    wait_idle(engines, within=1.0)


def test_deadline_ends_the_call_and_the_engine_request(gateway, engines):
    with grpc.insecure_channel(gateway.address) as channel:
        stub = generate_pb2_grpc.InferenceServiceStub(channel)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            stub.Generate(generate_request(LONG), timeout=0.5)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 2
    wait_idle(engines, within=1.0)
