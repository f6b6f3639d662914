"""Fuzzing the HTTP/2 layer in memory: any bytes in, only reactions RFC 9113 allows out.

One input drives one fresh connection, fed in chunks on a real event loop, with no socket:

- the front door's server role (`ClientConnection`, the gateway's limits, a stub forwarder
  that answers, refuses or holds calls) after a valid client preface, fed either raw bytes or
  a sequence of well-formed-but-hostile frames (any type, flags, stream id, length, padding,
  settings values, window increments, header blocks valid, malformed or undecodable);
- the engine-facing client role (`UpstreamConnection` with one call open), fed what a broken
  engine might send, raw or as such frames.

`check` then holds the connection to the rules: nothing raised (the connection's safety net
logs an unexpected exception and answers INTERNAL_ERROR: either fails the input); what the
gateway wrote parses as whole frames of the kinds a server (or client) may send, with known
error codes; after a GOAWAY nothing more is written and the transport is closed; an open
connection's windows and stream table stay within their bounds.

`python -m tests.gateway.http2.fuzz_main -runs=N` runs it under atheris (coverage-guided, as CI
does through tests/gateway/http2/test_fuzz.py); `run_input(data)` is the one-input entry.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct

import grpc
import uvloop

from gateway.config import GatewayConfig
from gateway.front_door import ClientConnection, ServerCall, front_door_limits
from gateway.grpc_wire import frame_message, status_trailers
from gateway.http2 import frames as f
from gateway.http2.header_codec import encode_block
from gateway.upstream import UpstreamConnection, UpstreamLink
from tests.support.memory_transport import MemoryTransport

CONFIG = GatewayConfig(
    engines=("127.0.0.1:1",), max_concurrent_streams=4, max_header_list_size=2048, max_continuation_frames=4,
    max_resets_per_second=8, hpack_table_size=256,
)  # fmt: skip
LIMITS = front_door_limits(CONFIG)
SERVER_CODES = {f.NO_ERROR, f.PROTOCOL_ERROR, f.FLOW_CONTROL_ERROR, f.STREAM_CLOSED, f.FRAME_SIZE_ERROR,
                f.REFUSED_STREAM, f.COMPRESSION_ERROR, f.ENHANCE_YOUR_CALM}  # fmt: skip
RESET_CODES = {f.NO_ERROR, f.PROTOCOL_ERROR, f.FLOW_CONTROL_ERROR, f.STREAM_CLOSED, f.FRAME_SIZE_ERROR,
               f.REFUSED_STREAM, f.CANCEL}  # fmt: skip

_REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/svc/M"), (b":authority", b"a"),
            (b"te", b"trailers")]  # fmt: skip
# Field blocks the structured inputs pick from: good, malformed, oversized, undecodable.
BLOCKS = [
    encode_block(_REQUEST),
    encode_block([*_REQUEST, (b"content-length", b"5")]),
    encode_block(_REQUEST[1:]),
    encode_block([(b":status", b"200"), (b"content-type", b"application/grpc")]),
    encode_block([(b"grpc-status", b"0")]),
    encode_block([*_REQUEST, (b"Upper", b"x")]),
    encode_block([*_REQUEST, (b"x-big", b"v" * 3000)]),
    encode_block([(b":path", b"/x"), *_REQUEST]),
    b"\x40\x04x-h2\x01v" + encode_block(_REQUEST),  # adds to the dynamic table
    b"\xbe",  # refers to it
    b"\x3f\xe1\x1f",  # table size update to 4096 (above the advertised 256)
    b"\x20" + encode_block(_REQUEST),
    b"\xff\xff\xff\xff",
    b"",
]
MESSAGE = frame_message(b"\x0a\x02hi")
INTERESTING = [0, 1, 2, 3, 4, 5, 6, 7, 255, 16_383, 16_384, 65_535, 65_536, 2**24 - 1, 2**24, 2**31 - 1, 2**31,
               2**32 - 1]  # fmt: skip
STREAM_IDS = [0, 1, 1, 1, 3, 3, 5, 2, 4, 7, 9, 2**31 - 1]


class StubOpener:
    """Answers calls by stream id: ids 1, 7, 13.. answer, 3, 9.. refuse, 5, 11.. stay open."""

    def open_call(self, call: ServerCall, end_stream: bool) -> None:
        kind = (call.stream_id // 2) % 3
        if kind == 0:
            call.send(MESSAGE)
            call.finish(status_trailers(grpc.StatusCode.OK, ""))
        elif kind == 1:
            call.refuse(grpc.StatusCode.UNAVAILABLE, "no")
        else:
            call.handler = HeldCall(call)


class HeldCall:
    def __init__(self, call: ServerCall) -> None:
        self.call = call

    def on_request_data(self, data: bytes, end_stream: bool) -> None:
        if end_stream:
            self.call.send(MESSAGE)

    def on_response_sent(self, num_bytes: int) -> None:
        pass

    def on_cancelled(self) -> None:
        self.call.handler = None


class Listener:
    """The relaying call behind an upstream stream: it only records."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def upstream_headers(self, headers, end_stream: bool) -> None:
        self.events.append("headers")

    def upstream_data(self, data: bytes, end_stream: bool) -> None:
        self.events.append("data")

    def upstream_reset(self, error_code: int | None) -> None:
        self.events.append("reset")


class ErrorLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


ERRORS = ErrorLog()
logging.getLogger("dpgate").addHandler(ERRORS)


# --- inputs ---------------------------------------------------------------------------------


class Reader:
    """Draws choices from the input bytes (zeros once they run out)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.offset = 0

    def byte(self) -> int:
        if self.offset >= len(self.data):
            return 0
        self.offset += 1
        return self.data[self.offset - 1]

    def pick(self, options: list):
        return options[self.byte() % len(options)]

    def take(self, length: int) -> bytes:
        chunk = self.data[self.offset : self.offset + length]
        self.offset += len(chunk)
        return chunk

    @property
    def has_more(self) -> bool:
        return self.offset < len(self.data)


def hostile_frame(reader: Reader) -> bytes:
    """One frame whose every field may break a rule; the payload fits its type most of the time."""
    frame_type = reader.pick([*range(10), *range(10), 0x0A, 0xFF])
    flags = reader.pick([0, f.END_STREAM, f.END_HEADERS, f.END_STREAM | f.END_HEADERS, f.PADDED, f.PRIORITY_FLAG,
                         f.PADDED | f.PRIORITY_FLAG | f.END_HEADERS, reader.byte()])  # fmt: skip
    stream_id = reader.pick(STREAM_IDS)
    shape = reader.byte() % 8
    if shape == 0:
        payload = reader.take(reader.byte())
    elif frame_type in (f.HEADERS, f.CONTINUATION, f.PUSH_PROMISE):
        block = reader.pick(BLOCKS)
        cut = reader.byte()
        payload = block[: cut] if cut < len(block) and shape == 1 else block
        if frame_type == f.HEADERS and flags & f.PRIORITY_FLAG:
            payload = f.pack_priority(reader.pick(STREAM_IDS), reader.byte()) + payload
        if frame_type == f.PUSH_PROMISE:
            payload = struct.pack(">L", reader.pick(STREAM_IDS)) + payload
    elif frame_type == f.DATA:
        payload = reader.pick([MESSAGE, b"", b"x" * reader.byte(), MESSAGE * 3])
    elif frame_type == f.SETTINGS:
        payload = b"".join(struct.pack(">HL", reader.byte() % 8, reader.pick(INTERESTING))
                           for _ in range(reader.byte() % 4))  # fmt: skip
    elif frame_type in (f.WINDOW_UPDATE, f.RST_STREAM):
        payload = struct.pack(">L", reader.pick(INTERESTING))
    elif frame_type == f.PRIORITY:
        payload = f.pack_priority(reader.pick(STREAM_IDS), reader.byte(), bool(reader.byte() & 1))
    elif frame_type == f.GOAWAY:
        payload = struct.pack(">LL", reader.pick(STREAM_IDS), reader.pick(INTERESTING))
    else:
        payload = reader.take(8)
    if flags & f.PADDED and frame_type in (f.DATA, f.HEADERS) and reader.byte() & 1:
        payload = bytes((reader.pick([0, 1, 3, len(payload), len(payload) + 1, 255]) & 0xFF,)) + payload
    if shape == 7:  # a length field that lies
        frame = f.pack_frame(frame_type, flags, stream_id, payload)
        length = reader.pick([0, len(payload) + 1, max(0, len(payload) - 1), 16_385])
        return struct.pack(">HB", length >> 8, length & 0xFF) + frame[3:]
    return f.pack_frame(frame_type, flags, stream_id, payload)


def chunks_of(stream: bytes, reader: Reader) -> list[bytes]:
    """`stream` cut where the input says (most inputs arrive in one piece)."""
    if reader.byte() % 4:
        return [stream]
    cuts = sorted({reader.byte() * 7 % (len(stream) + 1) for _ in range(reader.byte() % 6)})
    edges = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(edges) if b > a]


def make_input(data: bytes) -> tuple[str, list[bytes]]:
    """(role, chunks) for one fuzz input: its first byte picks the mode."""
    reader = Reader(data)
    mode = reader.byte() % 5
    if mode == 0:  # raw bytes after a valid client preface
        return "server", chunks_of(f.PREFACE + f.pack_settings({}) + data[1:], reader)
    if mode == 4:  # raw bytes from an engine after its SETTINGS
        return "client", chunks_of(f.pack_settings({}) + data[1:], reader)
    frames = []
    while reader.has_more and len(frames) < 64:
        frames.append(hostile_frame(reader))
    if mode == 3:  # a broken engine talking to the gateway's client role
        return "client", chunks_of(f.pack_settings({}) + b"".join(frames), reader)
    preface = f.PREFACE + f.pack_settings({}) if mode == 1 else f.PREFACE
    return "server", chunks_of(preface + b"".join(frames), reader)


def seed_inputs() -> list[bytes]:
    """Conversations that work, for the fuzzer to start from (mode byte first)."""
    request = f.pack_frame(f.HEADERS, f.END_HEADERS, 1, BLOCKS[0]) + f.pack_frame(f.DATA, f.END_STREAM, 1, MESSAGE)
    split = (f.pack_frame(f.HEADERS, 0, 3, BLOCKS[0][:5])
             + f.pack_frame(f.CONTINUATION, f.END_HEADERS, 3, BLOCKS[0][5:])
             + f.pack_frame(f.DATA, f.PADDED | f.END_STREAM, 3, b"\x02" + MESSAGE + b"\0\0"))  # fmt: skip
    held = f.pack_frame(f.HEADERS, f.END_HEADERS, 5, BLOCKS[1]) + f.pack_frame(f.DATA, 0, 5, b"12345")
    control = (f.pack_frame(f.PING, 0, 0, b"12345678") + f.pack_window_update(0, 100) + f.pack_settings({4: 1})
               + f.pack_frame(f.PRIORITY, 0, 9, f.pack_priority(1)) + f.pack_rst_stream(5, f.CANCEL))  # fmt: skip
    response = (f.pack_frame(f.HEADERS, f.END_HEADERS, 1, BLOCKS[3]) + f.pack_frame(f.DATA, 0, 1, MESSAGE)
                + f.pack_frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, BLOCKS[4]))  # fmt: skip
    return [
        b"\x00" + request, b"\x00" + request + split + held + control, b"\x00" + control + request,
        b"\x04" + response, b"\x04" + control[:17] + response, bytes(range(1, 4)) * 20, b"\x03" * 40,
    ]  # fmt: skip


# --- one run --------------------------------------------------------------------------------


async def drive(role: str, chunks: list[bytes]):
    ERRORS.records.clear()
    transport = MemoryTransport()
    if role == "server":
        connections: set = set()
        connection = ClientConnection(StubOpener(), CONFIG, connections, LIMITS)
        connection.connection_made(transport)
    else:
        connection = UpstreamConnection(UpstreamLink("127.0.0.1", 1))
        connection.connection_made(transport)
        connection.open_stream(Listener(), encode_block(_REQUEST), MESSAGE, end_stream=True)
    start = len(transport.written)
    for chunk in chunks:
        connection.data_received(chunk)
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    check(role, connection, transport, start)
    connection.connection_lost(None)  # cancels the timers; every stream hears of it
    if role == "server":
        assert not connections


def frames_in(data: bytes) -> list[tuple[int, int, int, bytes]]:
    frames = []
    offset = 0
    while offset < len(data):
        assert len(data) - offset >= 9, "a partial frame header was written"
        high, low, frame_type, flags, stream_id = f.FRAME_HEADER.unpack_from(data, offset)
        length = (high << 8) | low
        assert offset + 9 + length <= len(data), "a partial frame was written"
        frames.append((frame_type, flags, stream_id, data[offset + 9 : offset + 9 + length]))
        offset += 9 + length
    return frames


def check(role: str, connection, transport: MemoryTransport, start: int) -> None:
    assert not ERRORS.records, ERRORS.records[0].getMessage()
    assert transport.writes_after_close == 0, "written after close"
    written = bytes(transport.written)
    if role == "client":
        assert written.startswith(f.PREFACE)
        written = written[len(f.PREFACE) :]
    frames = frames_in(written)
    goaways = [i for i, frame in enumerate(frames) if frame[0] == f.GOAWAY]
    if goaways:
        assert goaways == [len(frames) - 1], "frames after GOAWAY, or two GOAWAYs"
        assert connection.is_closed and transport.is_closed
        code = f.unpack_goaway(frames[-1][3])[1]
        assert code in SERVER_CODES, f"GOAWAY {code}"
    else:
        assert not transport.is_closed
        assert connection.send_window <= f.MAX_WINDOW and connection.recv_window >= 0
        assert all(s.send_window <= f.MAX_WINDOW and s.recv_window >= 0 for s in connection.streams.values())
        if role == "server":
            assert len(connection.streams) <= CONFIG.max_concurrent_streams
            assert all(sid % 2 == 1 and sid <= connection.last_peer_stream_id for sid in connection.streams)
    for frame_type, _, stream_id, payload in frames:
        assert frame_type <= f.CONTINUATION and frame_type != f.PUSH_PROMISE and frame_type != f.PRIORITY
        if frame_type == f.RST_STREAM:
            assert stream_id and f.unpack_error_code(payload) in RESET_CODES
        elif frame_type in (f.SETTINGS, f.PING, f.GOAWAY):
            assert stream_id == 0
        elif frame_type == f.WINDOW_UPDATE:
            assert f.unpack_u32(payload) > 0
        elif role == "server":  # HEADERS, DATA, CONTINUATION: responses on client-opened streams
            assert stream_id % 2 == 1


_loop: asyncio.AbstractEventLoop | None = None


def run_input(data: bytes) -> None:
    """Feed one input to a fresh connection; raises AssertionError (or worse) on a broken rule."""
    global _loop
    if _loop is None:
        _loop = uvloop.new_event_loop()
    role, chunks = make_input(data)
    _loop.run_until_complete(drive(role, chunks))
