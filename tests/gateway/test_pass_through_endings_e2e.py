"""Health and reflection calls relayed to the gateway's local services end their upstream stream
however the client's stream ends: a gRPC cancel, a raw RST_STREAM, a dropped connection, or the
local service answering while the client still has its side open.

The gateway runs in the test's process (real sockets, the test's event loop), so the tests can
count the streams it holds open toward its local services: each call holds one while it runs,
and none may be left once it ended.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from gateway.config import GatewayConfig, validate_config
from gateway.server import GatewayServer
from tests.gateway.raw_grpc import RawCall, message
from tests.support.gateway_processes import free_port

WATCH_PATH = "/grpc.health.v1.Health/Watch"
REFLECTION_PATH = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
LIST_SERVICES = reflection_pb2.ServerReflectionRequest(list_services="").SerializeToString()


def run_with_gateway(check: Callable[[GatewayServer, Callable[[], int]], Awaitable[None]]) -> None:
    """Run `check(server, open_local_streams)` against a gateway serving on a free port.

    No engine listens at the configured address: health and reflection do not need one.
    """

    async def main() -> None:
        config = validate_config(GatewayConfig(engines=(f"127.0.0.1:{free_port()}",), port=0))
        server = GatewayServer(config)
        await server.start()

        def open_local_streams() -> int:
            link = server.forwarder.local_services
            assert link is not None
            return sum(len(connection.streams) for connection in link._connections)

        try:
            await check(server, open_local_streams)
        finally:
            await server.stop()

    asyncio.run(main())


async def until(condition: Callable[[], bool], within: float = 5) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "the gateway kept its stream to the local services open"
        await asyncio.sleep(0.01)


def test_cancelled_health_watch_resets_its_local_stream():
    async def check(server, open_local_streams):
        async with aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
            first = await call.read()
            assert first.status == health_pb2.HealthCheckResponse.NOT_SERVING  # no engine yet
            assert open_local_streams() == 1
            call.cancel()
            await until(lambda: open_local_streams() == 0)

    run_with_gateway(check)


def test_raw_rst_stream_and_dropped_connection_on_health_watch_reset_the_local_stream():
    async def check(server, open_local_streams):
        for ending in ("reset", "close"):
            call = await asyncio.to_thread(RawCall, server.port, WATCH_PATH)
            await asyncio.to_thread(call.send, message(health_pb2.HealthCheckRequest().SerializeToString()))
            await asyncio.to_thread(call.read_until, lambda answer: len(answer.data) > 0)
            assert open_local_streams() == 1
            if ending == "reset":
                await asyncio.to_thread(call.reset)
            await asyncio.to_thread(call.close)
            await until(lambda: open_local_streams() == 0)

    run_with_gateway(check)


def test_cancelled_reflection_stream_resets_its_local_stream():
    async def check(server, open_local_streams):
        async with aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = channel.stream_stream(REFLECTION_PATH)()
            await call.write(LIST_SERVICES)
            reply = reflection_pb2.ServerReflectionResponse.FromString(await call.read())
            assert "grpc.health.v1.Health" in {s.name for s in reply.list_services_response.service}
            assert open_local_streams() == 1  # the client has not closed its side
            call.cancel()
            await until(lambda: open_local_streams() == 0)

    run_with_gateway(check)


def test_reflection_stream_the_local_service_ends_while_the_client_still_sends():
    """The local service answers a garbage request with INVALID_ARGUMENT while the client's side
    of the bidirectional stream is still open: the gateway resets that stream, nothing lingers."""

    async def check(server, open_local_streams):
        async with aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = channel.stream_stream(REFLECTION_PATH)()
            await call.write(LIST_SERVICES)
            await call.read()
            await call.write(b"\x00")
            assert await call.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert await call.details() == (
                "request body is not a valid grpc.reflection.v1alpha.ServerReflectionRequest message"
            )
            await until(lambda: open_local_streams() == 0)

    run_with_gateway(check)
