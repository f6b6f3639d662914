"""`dpgate.servicer_guard` on a grpc.aio server in the test's process: garbage bodies are
INVALID_ARGUMENT naming the request type for every kind of method, and a handler's unexpected
exception is INTERNAL with a fixed text, never Python."""

from __future__ import annotations

import asyncio

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2

from dpgate.servicer_guard import ServicerGuard, request_type_name
from dpgate.v1 import control_pb2

REQUEST = health_pb2.HealthCheckRequest
INVALID = "request body is not a valid grpc.health.v1.HealthCheckRequest message"
FIXED = "internal test error"


async def echo(request, context):
    return REQUEST(service=f"echo {request.service}").SerializeToString()


async def raises(request, context):
    raise KeyError("a secret key name")


async def chooses_then_raises(request, context):
    context.set_code(grpc.StatusCode.FAILED_PRECONDITION)
    context.set_details("chosen by the handler")
    raise RuntimeError("after choosing")


async def stream_generator(request, context):
    yield REQUEST(service=request.service).SerializeToString()
    if request.service == "boom":
        raise ValueError("mid-stream")


async def stream_writer(request, context):
    await context.write(REQUEST(service=request.service).SerializeToString())


async def bidi(requests, context):
    async for request in requests:
        yield REQUEST(service=request.service).SerializeToString()


HANDLERS = {
    "Echo": grpc.unary_unary_rpc_method_handler(echo, REQUEST.FromString),
    "Raises": grpc.unary_unary_rpc_method_handler(raises, REQUEST.FromString),
    "Chooses": grpc.unary_unary_rpc_method_handler(chooses_then_raises, REQUEST.FromString),
    "Generator": grpc.unary_stream_rpc_method_handler(stream_generator, REQUEST.FromString),
    "Writer": grpc.unary_stream_rpc_method_handler(stream_writer, REQUEST.FromString),
    "Bidi": grpc.stream_stream_rpc_method_handler(bidi, REQUEST.FromString),
}


def run_with_server(check) -> list[str]:
    """Run `check(channel)` against a guarded server; returns the methods whose bodies were refused."""
    refused: list[str] = []

    async def main() -> None:
        server = aio.server(interceptors=(ServicerGuard(FIXED, refused.append),))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Guarded", HANDLERS),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                await check(channel)
        finally:
            await server.stop(None)

    asyncio.run(main())
    return refused


async def status_of(call) -> tuple[grpc.StatusCode, str]:
    try:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call
    except aio.AioRpcError as error:
        return error.code(), error.details()
    return grpc.StatusCode.OK, ""


def test_valid_bodies_reach_every_kind_of_handler():
    async def check(channel):
        assert REQUEST.FromString(await channel.unary_unary("/test.Guarded/Echo")(b"\x0a\x01a")).service == "echo a"
        for method in ("Generator", "Writer"):
            replies = [r async for r in channel.unary_stream(f"/test.Guarded/{method}")(b"\x0a\x01b")]
            assert [REQUEST.FromString(r).service for r in replies] == ["b"]
        replies = [r async for r in channel.stream_stream("/test.Guarded/Bidi")(iter([b"\x0a\x01c", b""]))]
        assert [REQUEST.FromString(r).service for r in replies] == ["c", ""]

    assert run_with_server(check) == []


def test_garbage_is_invalid_argument_naming_the_type_for_every_kind_of_method():
    async def check(channel):
        calls = [
            channel.unary_unary("/test.Guarded/Echo")(b"\x00"),
            channel.unary_stream("/test.Guarded/Generator")(b"\x80"),
            channel.unary_stream("/test.Guarded/Writer")(b"\x0f"),
            channel.stream_stream("/test.Guarded/Bidi")(iter([b"\x0a\x01c", b"\x0a\x7f"])),
        ]
        for call in calls:
            assert await status_of(call) == (grpc.StatusCode.INVALID_ARGUMENT, INVALID)

    refused = run_with_server(check)
    assert sorted(refused) == [f"/test.Guarded/{name}" for name in ("Bidi", "Echo", "Generator", "Writer")]


def test_unexpected_exceptions_are_internal_with_the_fixed_text():
    async def check(channel):
        assert await status_of(channel.unary_unary("/test.Guarded/Raises")(b"")) == (grpc.StatusCode.INTERNAL, FIXED)
        call = channel.unary_stream("/test.Guarded/Generator")(b"\x0a\x04boom")
        assert await status_of(call) == (grpc.StatusCode.INTERNAL, FIXED)

    run_with_server(check)


def test_a_status_the_handler_chose_before_raising_is_kept():
    async def check(channel):
        assert await status_of(channel.unary_unary("/test.Guarded/Chooses")(b"")) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "chosen by the handler",
        )

    run_with_server(check)


def test_request_type_names_come_from_the_descriptor_pool():
    assert request_type_name("/dpgate.v1.ControlService/Abort", lambda raw: raw) == "dpgate.v1.AbortRequest"
    assert control_pb2.AbortRequest  # the schema is imported, so its services are in the pool
    assert request_type_name("/not.Registered/Call", REQUEST.FromString) == "grpc.health.v1.HealthCheckRequest"
    assert request_type_name("/not.Registered/Call", lambda raw: raw) == "request"
