"""A request body that is not a valid message of the call's request type is INVALID_ARGUMENT naming
that type, for every RPC of every service, straight to an engine and through the gateway; no
status message ever carries a Python type name, traceback text or module path.

Real `dpgate engine` processes on the tiny model (the session's engines) and a real gateway.
"""

from __future__ import annotations

import gzip
import zlib

import grpc
import pytest

from tests.gateway.raw_grpc import RawCall, message
from tests.support.gateway_processes import RANK_KEY, generate_request

# Bodies no protobuf message accepts: field number 0, a truncated tag, wire type 7, a length past
# the end, a varint of eleven bytes, an end-group tag with no group.
GARBAGE = (b"\x00", b"\x80", b"\x0f", b"\x0a\x7f", b"\xff" * 11, b"\x0c")
# Words that would mean Python (or gRPC's wrapping of a Python exception) leaked to a client.
PYTHON_WORDS = ("<class", "Traceback", "Unexpected", "DecodeError", "Error parsing", "protobuf", ".py", 'File "')

UNARY, SERVER_STREAM, BIDI = "unary", "server-stream", "bidi"
# path -> (how it is called, its request message type)
METHODS = {
    "/dpgate.v1.InferenceService/Generate": (UNARY, "dpgate.v1.GenerateRequest"),
    "/dpgate.v1.InferenceService/GenerateStream": (SERVER_STREAM, "dpgate.v1.GenerateStreamRequest"),
    "/dpgate.v1.InferenceService/Chat": (UNARY, "dpgate.v1.ChatRequest"),
    "/dpgate.v1.InferenceService/ChatStream": (SERVER_STREAM, "dpgate.v1.ChatStreamRequest"),
    "/dpgate.v1.ControlService/GetServerInfo": (UNARY, "dpgate.v1.GetServerInfoRequest"),
    "/dpgate.v1.ControlService/GetModelInfo": (UNARY, "dpgate.v1.GetModelInfoRequest"),
    "/dpgate.v1.ControlService/GetLoad": (UNARY, "dpgate.v1.GetLoadRequest"),
    "/dpgate.v1.ControlService/Abort": (UNARY, "dpgate.v1.AbortRequest"),
    "/grpc.health.v1.Health/Check": (UNARY, "grpc.health.v1.HealthCheckRequest"),
    "/grpc.health.v1.Health/Watch": (SERVER_STREAM, "grpc.health.v1.HealthCheckRequest"),
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo":
        (BIDI, "grpc.reflection.v1alpha.ServerReflectionRequest"),
}  # fmt: skip


def call_with_raw_body(channel: grpc.Channel, path: str, body: bytes, metadata=()) -> grpc.RpcError:
    """Send `body` as the request message (no serializer) and return the error the call ended with."""
    kind = METHODS[path][0]
    with pytest.raises(grpc.RpcError) as info:
        if kind == UNARY:
            channel.unary_unary(path)(body, metadata=metadata, timeout=10)
        elif kind == SERVER_STREAM:
            list(channel.unary_stream(path)(body, metadata=metadata, timeout=10))
        else:
            list(channel.stream_stream(path)(iter([body]), metadata=metadata, timeout=10))
    return info.value


def assert_no_python(text: str) -> None:
    leaked = [word for word in PYTHON_WORDS if word in text]
    assert not leaked, f"{text!r} contains {leaked}"


def check_every_method(address: str, metadata=()) -> None:
    with grpc.insecure_channel(address) as channel:
        for path, (_, request_type) in METHODS.items():
            for body in GARBAGE:
                error = call_with_raw_body(channel, path, body, metadata)
                where = f"{address} {path} {body!r} {metadata}"
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, f"{where}: {error.code()} {error.details()}"
                assert error.details() == f"request body is not a valid {request_type} message", where
                assert_no_python(error.details())


def test_garbage_straight_to_an_engine(engines):
    before = engines[0].requests_total().get("Generate", 0)
    check_every_method(engines[0].address)
    # The engine counts the refusals among its answers.
    assert engines[0].requests_total().get("Generate", 0) == before + len(GARBAGE)


def test_garbage_through_the_gateway_unpinned_and_pinned(gateway):
    check_every_method(gateway.address)
    check_every_method(gateway.address, metadata=((RANK_KEY, "1"),))


def raw_call(port: int, path: str, body: bytes, headers=()):
    call = RawCall(port, path, headers)
    call.send(body)
    return call.finish()


@pytest.mark.parametrize(
    ("headers", "body", "code", "text"),
    [
        ((("grpc-encoding", "gzip"),), message(b"\x1f\x8bnot gzip", 1), grpc.StatusCode.INVALID_ARGUMENT,
         "request body is not a valid gzip-compressed dpgate.v1.GenerateRequest message"),
        ((("grpc-encoding", "gzip"),), message(gzip.compress(b"\x0a\x01x") + b"tail", 1),
         grpc.StatusCode.INVALID_ARGUMENT,
         "request body is not a valid gzip-compressed dpgate.v1.GenerateRequest message"),
        ((("grpc-encoding", "deflate"),), message(gzip.compress(b"\x0a\x01x"), 1), grpc.StatusCode.INVALID_ARGUMENT,
         "request body is not a valid deflate-compressed dpgate.v1.GenerateRequest message"),
        ((("grpc-encoding", "gzip"),), message(gzip.compress(b"\x00"), 1), grpc.StatusCode.INVALID_ARGUMENT,
         "request body is not a valid dpgate.v1.GenerateRequest message"),  # inflates, then the engine refuses it
        ((("grpc-encoding", "deflate"),), message(zlib.compress(b"\x80"), 1), grpc.StatusCode.INVALID_ARGUMENT,
         "request body is not a valid dpgate.v1.GenerateRequest message"),
        ((), message(b"\x0a\x01x", 1), grpc.StatusCode.INVALID_ARGUMENT,
         "request message has the compressed flag but no grpc-encoding"),
        ((("grpc-encoding", "identity"),), message(b"\x0a\x01x", 1), grpc.StatusCode.INVALID_ARGUMENT,
         "request message has the compressed flag but no grpc-encoding"),
        ((), message(b"\x0a\x01x", 2), grpc.StatusCode.INVALID_ARGUMENT,
         "request message has an unknown compressed flag"),
        ((("grpc-encoding", "snappy"),), message(b"\x0a\x01x"), grpc.StatusCode.UNIMPLEMENTED,
         "grpc-encoding 'snappy' is not supported; use identity, deflate or gzip"),
        ((), b"", grpc.StatusCode.INVALID_ARGUMENT, "Generate takes exactly one dpgate.v1.GenerateRequest message"),
        ((), message(b"") * 2, grpc.StatusCode.INVALID_ARGUMENT,
         "Generate takes exactly one dpgate.v1.GenerateRequest message"),
        ((), message(b"")[:3], grpc.StatusCode.INVALID_ARGUMENT,
         "Generate takes exactly one dpgate.v1.GenerateRequest message"),
    ],
    ids=["corrupt-gzip", "gzip-with-trailing-bytes", "gzip-named-deflate", "gzip-of-garbage", "deflate-of-garbage",
         "flag-without-encoding", "flag-with-identity", "unknown-flag", "unknown-encoding", "no-message",
         "two-messages", "cut-prefix"],
)  # fmt: skip
def test_bodies_the_gateway_refuses_before_an_engine_would_fail_on_them(gateway, headers, body, code, text):
    """An engine answers these with INTERNAL (gRPC's own decompression errors), which would be
    blamed on it; the gateway answers them itself, and names what is wrong."""
    answer = raw_call(gateway.port, "/dpgate.v1.InferenceService/Generate", body, headers)
    assert (answer.status, answer.message) == (code.value[0], text)
    assert_no_python(answer.message)


def test_a_valid_compressed_request_still_passes(gateway):
    request = message(gzip.compress(generate_request(2).SerializeToString()), 1)
    answer = raw_call(gateway.port, "/dpgate.v1.InferenceService/Generate", request, (("grpc-encoding", "gzip"),))
    assert answer.status == 0, answer.message
