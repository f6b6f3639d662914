"""The front door's HTTP/2 rules against a raw socket: keepalive, ping abuse, broken clients.

A raw client lets the tests do what gRPC libraries never do (ignore pings, flood them, send
garbage) and read the exact frames the gateway answers with.
"""

from __future__ import annotations

import asyncio
import socket
import time

import grpc
import pytest

from gateway.http2 import frames as f
from tests.support.gateway_processes import (
    GatewayProcess,
    generate_request,
    inference_stub,
)


class RawClient:
    """An HTTP/2 client connection that sends only what a test tells it to."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def handshake(self) -> None:
        self.send(f.PREFACE + f.pack_settings({}))

    def frames_until_closed(self, timeout: float) -> list[tuple[int, int, bytes]]:
        """Every frame the gateway sends until it closes the connection (or `timeout` passes)."""
        frames = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                return frames
            if not chunk:
                return frames
            self.buffer += chunk
            while len(self.buffer) >= 9:
                high, low, frame_type, flags, _ = f.FRAME_HEADER.unpack_from(self.buffer)
                length = (high << 8) | low
                if len(self.buffer) < 9 + length:
                    break
                frames.append((frame_type, flags, self.buffer[9 : 9 + length]))
                self.buffer = self.buffer[9 + length :]
        raise AssertionError(f"the gateway kept the connection open for {timeout} s; frames: {frames}")

    def close(self) -> None:
        self.sock.close()


def goaway_of(frames: list[tuple[int, int, bytes]]) -> tuple[int, bytes]:
    (payload,) = [payload for frame_type, _, payload in frames if frame_type == f.GOAWAY]
    return f.unpack_goaway(payload)[1], payload[8:]


def still_serves(gateway: GatewayProcess) -> None:
    with grpc.insecure_channel(gateway.address) as channel:
        assert inference_stub(channel).Generate(generate_request(2), timeout=10).text


def test_a_client_that_never_answers_pings_is_disconnected(start_gateway):
    gateway = start_gateway("--keepalive-time", "0.3", "--keepalive-timeout", "0.3")
    client = RawClient(gateway.port)
    try:
        client.handshake()
        started = time.monotonic()
        frames = client.frames_until_closed(timeout=5)
        assert any(frame_type == f.PING and not flags & f.ACK for frame_type, flags, _ in frames)
        assert time.monotonic() - started < 2
    finally:
        client.close()
    still_serves(gateway)


def test_ping_floods_on_an_idle_connection_end_with_too_many_pings(start_gateway):
    gateway = start_gateway("--min-client-ping-interval", "5")
    client = RawClient(gateway.port)
    try:
        client.handshake()
        client.send(b"".join(f.pack_frame(f.PING, 0, 0, b"12345678") for _ in range(5)))
        frames = client.frames_until_closed(timeout=5)
        assert goaway_of(frames) == (f.ENHANCE_YOUR_CALM, b"too_many_pings")
        assert sum(frame_type == f.PING and flags & f.ACK for frame_type, flags, _ in frames) >= 1
    finally:
        client.close()
    still_serves(gateway)


def test_sequential_calls_with_grpc_bdp_pings_are_not_taken_for_a_ping_flood(start_gateway):
    """gRPC clients ping after each response they read (bandwidth probing), often between calls.

    gRPC servers forgive pings that follow data they sent; a gateway that counted those pings as
    strikes ended busy connections with GOAWAY too_many_pings and made their clients reconnect.
    """
    gateway = start_gateway()
    log_before = len(gateway.log_path.read_text())  # the module's gateways share one log file

    async def run() -> None:
        async with grpc.aio.insecure_channel(gateway.address) as channel:
            generate = inference_stub(channel).Generate
            for _ in range(1500):
                await generate(generate_request(1), timeout=10)

    asyncio.run(run())
    assert "too_many_pings" not in gateway.log_path.read_text()[log_before:]


_STARTED = f.PREFACE + f.pack_settings({})  # a client preface: the magic, then SETTINGS


@pytest.mark.parametrize(
    "garbage, error_code",
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b" " * 8, f.PROTOCOL_ERROR),  # not HTTP/2 at all
        (_STARTED + f.pack_frame(f.DATA, 0, 0, b"x" * 20_000), f.FRAME_SIZE_ERROR),  # over the frame limit
        (_STARTED + f.pack_frame(f.HEADERS, f.END_HEADERS, 1, b"\xff\xff\xff\xff\xff"), f.COMPRESSION_ERROR),
        (_STARTED + f.pack_frame(f.HEADERS, 0, 1, b"") + f.pack_frame(f.PING, 0, 0, b"1" * 8), f.PROTOCOL_ERROR),
        (f.PREFACE + f.pack_frame(f.PING, 0, 0, b"1" * 8), f.PROTOCOL_ERROR),  # the preface's SETTINGS missing
    ],
    ids=["http1", "oversized-frame", "bad-hpack", "headers-then-ping", "no-settings"],
)
def test_broken_clients_lose_their_connection_and_nobody_else_notices(start_gateway, garbage, error_code):
    gateway = start_gateway()
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_stub(channel)
        running = stub.Generate.future(generate_request(50), timeout=10)
        client = RawClient(gateway.port)
        try:
            client.send(garbage)
            frames = client.frames_until_closed(timeout=5)
            assert goaway_of(frames)[0] == error_code
        finally:
            client.close()
        assert running.result().text == "x" * 50
        assert stub.Generate(generate_request(2), timeout=10).text == "xx"
