"""The relay's building blocks on plain data: header blocks, gRPC framing, timeouts, flow control."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest
from hpack import Decoder

from gateway.grpc_wire import (
    MessageScanner,
    decode_message,
    encode_message,
    format_timeout,
    frame_message,
    parse_timeout,
    status_trailers,
    unframe_single_message,
)
from gateway.http2 import frames as f
from gateway.http2.connection import Http2Connection, Stream
from gateway.http2.header_codec import encode_block, encode_literal
from tests.support.memory_transport import MemoryTransport


def test_header_blocks_decode_to_the_same_fields():
    fields = [
        (b":method", b"POST"),  # fully indexed in the static table
        (b":path", b"/dpgate.v1.InferenceService/Generate"),  # indexed name, literal value
        (b"x-data-parallel-rank", b"1"),  # new name
        (b"x-long", b"v" * 1000),  # a length that needs a multi-byte integer
    ]
    block = encode_block(fields) + encode_literal(b"grpc-timeout", b"999u")
    assert Decoder().decode(block, raw=True) == [*fields, (b"grpc-timeout", b"999u")]


@pytest.mark.parametrize(
    "value, seconds", [(b"1S", 1.0), (b"250m", 0.25), (b"7H", 25200.0), (b"99999999n", 0.099999999)]
)
def test_timeouts_parse(value, seconds):
    assert parse_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [b"", b"S", b"1x", b"123456789S", b"-1S", b"1.5S"])
def test_malformed_timeouts_are_none(value):
    assert parse_timeout(value) is None


@pytest.mark.parametrize("seconds", [0.0000001, 0.5, 7.0, 99.9, 3600.0, 10**9])
def test_formatted_timeouts_fit_eight_digits_and_round_trip(seconds):
    value = format_timeout(seconds)
    assert len(value) <= 9
    parsed = parse_timeout(value)
    assert parsed is not None
    assert parsed == pytest.approx(min(max(seconds, 1e-6), 99_999_999), rel=1e-3)


def test_status_messages_are_percent_encoded():
    text = "rank 3 failed: 100% of ünïcode \n newline"
    encoded = encode_message(text)
    assert all(0x20 <= byte < 0x7F for byte in encoded) and b"%25" in encoded
    assert decode_message(encoded) == text
    block = status_trailers(grpc.StatusCode.UNAVAILABLE, text)
    assert Decoder().decode(block, raw=True) == [(b"grpc-status", b"14"), (b"grpc-message", encoded)]


def test_single_message_framing():
    assert unframe_single_message(frame_message(b"abc")) == (0, 3)
    assert unframe_single_message(frame_message(b"")) == (0, 0)
    assert unframe_single_message(frame_message(b"abc") + b"x") is None
    assert unframe_single_message(frame_message(b"abc")[:-1]) is None
    assert unframe_single_message(b"\x00\x00") is None


def test_scanner_counts_messages_however_the_stream_is_cut():
    rng = random.Random(7)
    payloads = [bytes([0x0A]) + b"p" * 30, b"", bytes([0x12]) + b"t" * 100_000, bytes([0x12, 1]), b"z" * 17]
    stream = b"".join(frame_message(p) for p in payloads)
    first_delta_byte = len(frame_message(payloads[0])) + len(frame_message(payloads[1])) + 5
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(0, 12)))
        starts, ends = [0, *cuts], [*cuts, len(stream)]
        scanner = MessageScanner(watch_byte=0x12)
        total = 0
        for start, end in zip(starts, ends, strict=True):
            was_seen = scanner.watch_seen
            total += scanner.feed(stream[start:end])
            # The delta is noticed in exactly the chunk holding its first payload byte.
            assert scanner.watch_seen == (was_seen or end > first_delta_byte)
        assert total == len(payloads)
        assert scanner.max_length == 100_001


def test_scanner_does_not_see_the_watch_byte_in_other_messages():
    scanner = MessageScanner(watch_byte=0x12)
    assert scanner.feed(frame_message(b"\x0a\x12\x12") + frame_message(b"\x1a")) == 2
    assert not scanner.watch_seen


# --- two connections wired back to back in memory --------------------------------------------


class Recorder(Stream):
    def __init__(self, connection: Http2Connection) -> None:
        super().__init__(connection)
        self.events: list[tuple] = []

    def on_headers(self, headers, end_stream):
        self.events.append(("headers", headers, end_stream))

    def on_data(self, data, end_stream):
        self.events.append(("data", data, end_stream))

    def on_reset(self, error_code):
        self.events.append(("reset", error_code))


class ManualCreditRecorder(Recorder):
    auto_credit = False


class Client(Http2Connection):
    is_client = True


class Server(Http2Connection):
    stream_type: type[Recorder] = Recorder

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[Recorder] = []

    def on_new_stream(self, stream_id, headers, end_stream):
        stream = self.stream_type(self)
        self.add_stream(stream, stream_id)
        stream.events.append(("headers", headers, end_stream))
        if end_stream:
            stream.is_remote_closed = True
        self.opened.append(stream)


async def wired(server_type: type[Server] = Server) -> tuple[Client, Server]:
    loop = asyncio.get_running_loop()
    client, server = Client(), server_type()
    to_server, to_client = MemoryTransport(loop), MemoryTransport(loop)
    to_server.peer, to_client.peer = server, client
    server.connection_made(to_client)
    client.connection_made(to_server)
    await settle()
    return client, server


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def request_fields(path: bytes) -> list[tuple[bytes, bytes]]:
    """The pseudo-headers every request needs (RFC 9113 section 8.3.1)."""
    return [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path)]


def request_block(path: bytes) -> bytes:
    return encode_block(request_fields(path))


def data_of(stream: Recorder) -> bytes:
    return b"".join(event[1] for event in stream.events if event[0] == "data")


def test_data_waits_for_the_peers_window_and_trailers_wait_for_the_data():
    async def run() -> None:
        client, server = await wired()
        server.write(f.pack_settings({f.SETTINGS_INITIAL_WINDOW_SIZE: 10}))
        await settle()
        stream = Recorder(client)
        client.add_stream(stream, 1)
        client.send_headers(stream, request_block(b"/x"))
        client.send_data(stream, b"a" * 25)
        client.send_headers(stream, encode_block([(b"grpc-status", b"0")]), end_stream=True)
        await settle()
        (peer,) = server.opened
        assert data_of(peer) == b"a" * 10
        assert not any(event[0] == "headers" and event[2] for event in peer.events)
        server.write(f.pack_window_update(1, 10))
        await settle()
        assert data_of(peer) == b"a" * 20
        server.write(f.pack_window_update(1, 100))
        await settle()
        assert data_of(peer) == b"a" * 25
        assert peer.events[-1] == ("headers", [(b"grpc-status", b"0")], True)

    asyncio.run(run())


def test_header_blocks_larger_than_a_frame_use_continuation():
    async def run() -> None:
        client, server = await wired()
        stream = Recorder(client)
        client.add_stream(stream, 1)
        fields = [*request_fields(b"/x"), (b"x-big", b"b" * 40_000)]
        client.send_headers(stream, encode_block(fields), end_stream=True)
        await settle()
        (peer,) = server.opened
        assert peer.events == [("headers", fields, True)]
        assert server._decoder.header_table_size == 0  # the first block said the table is empty

    asyncio.run(run())


def test_after_read_runs_once_the_whole_read_is_handled():
    """A stream opened by HEADERS sees, in an after_read callback, whether the DATA that ended it
    came in the same read (then no request-body timer is needed) or has yet to come."""

    class BodyWatchingServer(Server):
        def __init__(self) -> None:
            super().__init__()
            self.body_seen: list[bool] = []

        def on_new_stream(self, stream_id, headers, end_stream):
            super().on_new_stream(stream_id, headers, end_stream)
            stream = self.opened[-1]
            self.after_read(lambda: self.body_seen.append(stream.is_remote_closed))

    async def run() -> None:
        client, server = await wired(BodyWatchingServer)
        for stream_id, body_in_same_write in ((1, True), (3, False)):
            stream = Recorder(client)
            client.add_stream(stream, stream_id)
            client.send_headers(stream, request_block(b"/x"))
            if body_in_same_write:
                client.send_data(stream, b"body", end_stream=True)
            await settle()  # (one loop iteration's frames leave in one write, read in one data_received)
            if not body_in_same_write:
                client.send_data(stream, b"body", end_stream=True)
                await settle()
        assert server.body_seen == [True, False]
        outside = []
        server.after_read(lambda: outside.append("ran"))  # no read being handled: at once
        assert outside == ["ran"]

    asyncio.run(run())


def plain_block(fields: list[tuple[bytes, bytes]]) -> bytes:
    """Every field a literal without indexing with its name spelled out: a block the gateway's
    decoder reads on its short path and remembers (as it does a gRPC client's indexed repeats)."""
    return b"".join(b"\x00" + bytes((len(name),)) + name + bytes((len(value),)) + value for name, value in fields)


def test_a_repeated_request_block_is_judged_once_and_a_malformed_one_every_time(monkeypatch):
    """The request rules' verdict is kept with the block the decoder remembers (gRPC clients send
    the same bytes on every call); a refusal is never kept, so each repeat of a bad block is reset."""
    from gateway.http2 import connection as connection_module

    judged: list[int] = []
    check_request = connection_module.check_request

    def counting_check_request(headers, limit):
        judged.append(len(headers))
        return check_request(headers, limit)

    monkeypatch.setattr(connection_module, "check_request", counting_check_request)

    async def run() -> None:
        client, server = await wired()
        good = plain_block(request_fields(b"/x"))
        bad = plain_block([*request_fields(b"/x"), (b"X-Upper", b"v")])  # names are lowercase (RFC 9113 8.2.1)
        blocks = (good, good, good, bad, bad)
        streams = []
        for stream_id, block in zip(range(1, 2 * len(blocks), 2), blocks, strict=True):
            stream = Recorder(client)
            client.add_stream(stream, stream_id)
            client.send_headers(stream, block, end_stream=True)
            streams.append(stream)
            await settle()
        assert len(server.opened) == 3
        # The first block sets the table size too (the general decoder's); the second is
        # remembered with its verdict, the third reuses it; the bad one is judged each time.
        assert judged == [3, 3, 4, 4]
        assert [stream.events for stream in streams[3:]] == [[("reset", f.PROTOCOL_ERROR)]] * 2

    asyncio.run(run())


def test_manual_credit_returns_window_only_when_released():
    class ManualServer(Server):
        stream_type = ManualCreditRecorder

    async def run() -> None:
        from gateway.http2.connection import LOCAL_STREAM_WINDOW

        client, server = await wired(ManualServer)
        stream = Recorder(client)
        client.add_stream(stream, 1)
        client.send_headers(stream, request_block(b"/x"))
        chunk = b"c" * 16_000
        for _ in range(LOCAL_STREAM_WINDOW // len(chunk) + 20):
            client.send_data(stream, chunk)
        await settle()
        (peer,) = server.opened
        received = len(data_of(peer))
        assert received <= LOCAL_STREAM_WINDOW  # the writer stopped at the window
        assert stream.pending  # and holds the rest
        server.release(peer, received)
        await settle()
        assert len(data_of(peer)) > received

    asyncio.run(run())


def test_peer_reset_and_lost_connection_reach_the_stream():
    async def run() -> None:
        client, server = await wired()
        first, second = Recorder(client), Recorder(client)
        client.add_stream(first, 1)
        client.add_stream(second, 3)
        client.send_headers(first, request_block(b"/a"))
        client.send_headers(second, request_block(b"/b"))
        await settle()
        server.reset_stream(server.opened[0], f.CANCEL)
        await settle()
        assert first.events == [("reset", f.CANCEL)]
        client.connection_lost(None)
        assert second.events == [("reset", None)]

    asyncio.run(run())
