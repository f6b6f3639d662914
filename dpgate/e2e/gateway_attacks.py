"""The gateway-side attacks of issue 22 (items 8 and 9), spoken as raw HTTP/2 from another
loopback address: each is a function that opens its connections, sends what a hostile client
would, and reports what the gateway answered. tests/gateway/test_gateway_neighbours_e2e.py and
the adversarial workload (dpgate/e2e/adversarial.py) run them while a well-behaved client works
beside them.

Linux routes all of 127.0.0.0/8 to the loopback interface, so a socket bound to 127.0.0.2 is a
different client address to a gateway on 127.0.0.1: the gateway's per-peer limits count it
apart from the neighbour (127.0.0.1), exactly as they would count a remote host.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import time
import urllib.parse
from dataclasses import dataclass

from dpgate.e2e.h2_wire import (
    GENERATE,
    GENERATE_STREAM,
    H2Client,
    data,
    generate_body_of_length,
    headers,
    request_fields,
    settings,
    stopping,
    window_update,
)
from dpgate.v1 import generate_pb2
from gateway.grpc_wire import frame_message
from gateway.http2 import frames as f

ATTACKER = "127.0.0.2"
OTHER_CLIENT = "127.0.0.3"
WATCH = b"/grpc.health.v1.Health/Watch"


@dataclass(slots=True, frozen=True)
class Ending:
    """How the gateway ended one stream: a gRPC status with its message, or an RST_STREAM code."""

    status: int | None = None
    message: str = ""
    reset: int | None = None


def connect(port: int, source: str = ATTACKER) -> H2Client:
    """A connection past the handshake: the gateway's SETTINGS (its 4 MiB stream window) and its
    connection window were read and acknowledged, so the client may send that much."""
    client = H2Client(port, timeout=10, source=source)
    client.handshake()
    client.read_until(lambda frame: frame.type == f.WINDOW_UPDATE and frame.stream_id == 0, timeout=10)
    client.send(settings(ack=True))
    return client


def read_endings(client: H2Client, stream_ids: list[int], timeout: float) -> dict[int, Ending]:
    """How each of `stream_ids` ended, reading until all did, the connection closed, or `timeout`."""
    wanted, endings = set(stream_ids), {}

    def done(frame) -> bool:
        if frame.stream_id in wanted and frame.stream_id not in endings:
            if frame.type == f.HEADERS and frame.flags & f.END_STREAM and frame.headers is not None:
                fields = dict(frame.headers)
                status = fields.get(b"grpc-status")
                message = urllib.parse.unquote(fields.get(b"grpc-message", b"").decode())
                endings[frame.stream_id] = Ending(int(status) if status is not None else None, message)
            elif frame.type == f.RST_STREAM:
                endings[frame.stream_id] = Ending(reset=f.unpack_error_code(frame.payload))
        return len(endings) == len(wanted)

    with contextlib.suppress(TimeoutError):  # what ended by then is the answer; the test counts it
        client.read_until(done, timeout=timeout)
    return endings


def stream_ids(count: int) -> list[int]:
    return list(range(1, 2 * count, 2))


def call_fields(path: bytes, key: str | None) -> list[tuple[bytes, bytes]]:
    """A call's request headers, with the API key when the gateway wants one (an attacker with a
    valid key is the worse case: it gets past authentication to the limits behind it)."""
    extra = ((b"authorization", f"Bearer {key}".encode()),) if key is not None else ()
    return request_fields(path, extra)


def is_served(port: int, key: str | None = None, source: str = OTHER_CLIENT) -> Ending | None:
    """One Generate from another address on a fresh connection: how it ended (status 0 is served),
    or None when the connection was refused or closed before an answer."""
    try:
        client = connect(port, source)
    except (OSError, TimeoutError):
        return None
    try:
        client.send(headers(1, call_fields(GENERATE, key)) + data(1))
        return read_endings(client, [1], timeout=30).get(1)
    finally:
        client.close()


def big_bodies_without_end(
    port: int, connections: int, streams: int, body_bytes: int, frame_bytes: int, key: str | None = None
) -> list[H2Client]:
    """On each connection, `streams` Generate calls each sending a `body_bytes` request message in
    full, in DATA frames of `frame_bytes` (at most 16,384, the gateway's SETTINGS_MAX_FRAME_SIZE),
    but never END_STREAM: the gateway holds every body until --request-body-timeout. Small frames
    make a body's collection cost show: a copy of the whole body per frame is quadratic in them."""
    body = generate_body_of_length(body_bytes)
    chunks = [body[at : at + frame_bytes] for at in range(0, len(body), frame_bytes)]
    clients = [connect(port) for _ in range(connections)]
    for client in clients:
        for stream_id in stream_ids(streams):
            frames = [headers(stream_id, call_fields(GENERATE, key))]
            frames += [data(stream_id, chunk, end_stream=False) for chunk in chunks]
            client.send(b"".join(frames))
    return clients


def headers_only(port: int, connections: int, streams: int, key: str | None = None) -> list[H2Client]:
    """On each connection, `streams` Generate calls that send their headers and nothing else."""
    clients = [connect(port) for _ in range(connections)]
    block = [headers(stream_id, call_fields(GENERATE, key)) for stream_id in stream_ids(streams)]
    for client in clients:
        client.send(b"".join(block))
    return clients


def unauthenticated_watches(port: int, connections: int, streams: int) -> list[H2Client]:
    """On each connection, `streams` health Watch calls without a key (their request is whole)."""
    request = frame_message(b"")  # HealthCheckRequest(service="")
    clients = [connect(port) for _ in range(connections)]
    for client in clients:
        client.send(b"".join(headers(i, request_fields(WATCH)) + data(i, request) for i in stream_ids(streams)))
    return clients


def never_reading_streams(
    port: int, connections: int, streams: int, max_tokens: int, key: str | None = None
) -> list[H2Client]:
    """On each connection, `streams` GenerateStream calls that go on and on, behind windows opened
    as wide as HTTP/2 allows, whose responses the client never reads: only the gateway's
    backpressure (a paused transport stops the engine's stream) keeps their bytes out of its memory."""
    request = generate_pb2.GenerateStreamRequest(text="hi", stopping=stopping(max_tokens))
    body = frame_message(request.SerializeToString())
    clients = []
    for _ in range(connections):
        client = H2Client(port, timeout=10, source=ATTACKER)
        client.handshake((f.SETTINGS_INITIAL_WINDOW_SIZE, f.MAX_WINDOW))
        frames = [window_update(0, f.MAX_WINDOW - f.DEFAULT_WINDOW)]
        for stream_id in stream_ids(streams):
            frames += [headers(stream_id, call_fields(GENERATE_STREAM, key)), data(stream_id, body)]
        client.send(b"".join(frames))
        clients.append(client)
    return clients


def idle_connections(port: int, count: int, source: str = ATTACKER) -> list[socket.socket]:
    """`count` TCP connections that never say anything."""
    return [socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) for _ in range(count)]


def closed_by_gateway(sockets: list[socket.socket], timeout: float) -> list[float | None]:
    """For each socket, when (time.monotonic()) the gateway closed it, or None if it did not within
    `timeout`; what the gateway sent is drained. Stops once nothing happened for half a second.
    (A selector, not select(): a flood past 1,024 connections has descriptors select() refuses.)"""
    closed_at: list[float | None] = [None] * len(sockets)
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        for index, sock in enumerate(sockets):
            selector.register(sock, selectors.EVENT_READ, index)
        while time.monotonic() < deadline:
            ready = selector.select(min(0.5, max(0.0, deadline - time.monotonic())))
            if not ready:
                break
            for key, _ in ready:
                try:
                    chunk = key.fileobj.recv(65536)
                except ConnectionResetError:
                    chunk = b""
                if not chunk:
                    closed_at[key.data] = time.monotonic()
                    selector.unregister(key.fileobj)
    return closed_at


def close_all(clients) -> None:
    for client in clients:
        client.close()
