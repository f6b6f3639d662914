"""One client sends 1,000 garbage or invalid requests while another sends 200 good ones: all 200
good ones succeed and no engine's circuit breaker ever opens.

The gateway runs with `--breaker-failure-threshold 1`, so a single outcome blamed on an engine
would open its circuit: the test shows that nothing a client can cause is (health_state's
BREAKER_BLAME). The abuse covers each way a client can fail a call: bodies that are not messages
(every dpgate.v1 RPC), bad fields, an unknown model, bad routing metadata, corrupt compression,
its own deadline and its own cancel. Real engines on the tiny model.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
from collections import Counter

import grpc
import pytest
from grpc import aio

from dpgate.v1 import generate_pb2, generate_pb2_grpc
from tests.gateway.raw_grpc import RawCall, message
from tests.gateway.test_invalid_bodies_e2e import GARBAGE, METHODS, SERVER_STREAM
from tests.support.gateway_processes import FAST_HEALTH, RANK_KEY, GatewayProcess, generate_request, stream_request

NUM_BAD, NUM_GOOD = 1000, 200
C = grpc.StatusCode
DPGATE_PATHS = [path for path in METHODS if path.startswith("/dpgate.v1.")]


@pytest.fixture(scope="module")
def strict_gateway(engines, log_dir):
    flags = ("--breaker-failure-threshold", "1", "--breaker-open-seconds", "30")
    # Health probes with room to spare: this test is about the breaker, and a probe that times out
    # on a loaded test machine would take an engine out of rotation for reasons of its own.
    lenient_health = ("--health-interval", "2", "--health-timeout", "2", "--failure-threshold", "3")
    gateway = GatewayProcess(
        [e.address for e in engines], *FAST_HEALTH, *lenient_health, *flags, log_dir=log_dir, name="gateway-abuse"
    )
    try:
        gateway.wait_ranks([0, 1])
        yield gateway
    finally:
        gateway.stop()


def corrupt_gzip(port: int) -> int:
    call = RawCall(port, "/dpgate.v1.InferenceService/Generate", (("grpc-encoding", "gzip"),))
    call.send(message(gzip.compress(b"\x0a\x01x")[:-3], 1))
    return call.finish().status


async def bad_call(channel: aio.Channel, port: int, i: int) -> tuple[str, set[C], C]:
    """The i-th abusive call: (what it was, the codes it may end with, the code it ended with)."""
    stub = generate_pb2_grpc.InferenceServiceStub(channel)
    kind = i % 10
    try:
        if kind in (0, 1, 2):  # a body that is not a message, to every dpgate.v1 rpc
            path = DPGATE_PATHS[i % len(DPGATE_PATHS)]
            body = GARBAGE[i % len(GARBAGE)]
            what, expected = f"garbage to {path}", {C.INVALID_ARGUMENT}
            if METHODS[path][0] == SERVER_STREAM:
                async for _ in channel.unary_stream(path)(body, timeout=10):
                    pass
            else:
                await channel.unary_unary(path)(body, timeout=10)
        elif kind == 3:
            what, expected = "max_tokens 0", {C.INVALID_ARGUMENT}
            await stub.Generate(generate_request(max_tokens=0), timeout=10)
        elif kind == 4:
            what, expected = "unknown model", {C.NOT_FOUND}
            await stub.Generate(generate_pb2.GenerateRequest(model="no-such-model", text="hi"), timeout=10)
        elif kind == 5:
            what, expected = "token id outside the vocabulary", {C.INVALID_ARGUMENT}
            ids = generate_pb2.TokenIds(ids=[10**7])
            await stub.Generate(generate_pb2.GenerateRequest(token_ids=ids), timeout=10)
        elif kind == 6:
            what, expected = "bad or unserved rank", {C.INVALID_ARGUMENT}
            value = ("-1", "x", "7")[i % 3]
            await stub.Generate(generate_request(), metadata=((RANK_KEY, value),), timeout=10)
        elif kind == 7:
            what, expected = "corrupt gzip", {C.INVALID_ARGUMENT}
            status = await asyncio.to_thread(corrupt_gzip, port)
            return what, expected, next(code for code in C if code.value[0] == status)
        elif kind == 8:
            what, expected = "the client's own deadline", {C.DEADLINE_EXCEEDED}
            await stub.Generate(generate_request(max_tokens=500), timeout=0.02)
        else:
            what, expected = "the client's own cancel", {C.CANCELLED}
            call = stub.GenerateStream(stream_request(max_tokens=500), timeout=10)
            await call.read()
            call.cancel()
            return what, expected, await call.code()
    except asyncio.CancelledError:
        return what, expected, C.CANCELLED
    except aio.AioRpcError as error:
        return what, expected, error.code()
    return what, expected, C.OK


def test_a_thousand_bad_calls_do_not_open_the_breaker_for_good_calls(strict_gateway):
    async def run() -> tuple[list, list]:
        async with (
            aio.insecure_channel(strict_gateway.address) as bad,
            aio.insecure_channel(strict_gateway.address) as good,
        ):
            good_stub = generate_pb2_grpc.InferenceServiceStub(good)
            slots = asyncio.Semaphore(16)
            counter = itertools.count()

            async def abuse() -> tuple[str, set[C], C]:
                async with slots:
                    return await bad_call(bad, strict_gateway.port, next(counter))

            async def good_calls() -> list[C]:
                codes = []
                for i in range(NUM_GOOD):
                    try:
                        response = await good_stub.Generate(generate_request(2, text=f"good {i}"), timeout=30)
                        codes.append(C.OK if response.finish.num_generated_tokens == 2 else C.UNKNOWN)
                    except aio.AioRpcError as error:
                        codes.append(error.code())
                return codes

            bad_results, good_codes = await asyncio.gather(
                asyncio.gather(*(abuse() for _ in range(NUM_BAD))), good_calls()
            )
            return bad_results, good_codes

    bad_results, good_codes = asyncio.run(run())
    log = strict_gateway.log_path.read_text()
    assert "circuit is now" not in log
    assert good_codes == [C.OK] * NUM_GOOD, (Counter(good_codes), log[-3000:])
    unexpected = [(what, code) for what, expected, code in bad_results if code not in expected]
    assert not unexpected, unexpected[:10]
    samples = strict_gateway.metrics()
    circuits = {name: value for name, value in samples.items() if name.startswith("dpgate_gateway_circuit_state{")}
    assert len(circuits) == 2 and set(circuits.values()) == {0.0}
