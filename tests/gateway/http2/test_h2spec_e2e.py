"""h2spec's case list against a real gateway in front of the synthetic engine, over raw sockets.

`CASES` walks h2spec's sections (generic, http2 3.5 to 8.2, hpack) with one entry per case: the
frames to send (with waits between them where a case needs a stream in some state first) and
the one reaction RFC 9113 or RFC 7541 names: GOAWAY with a code (then the connection closes),
RST_STREAM with a code on a stream (and the connection stays usable), or no error at all (a
response, a ping or settings ack). After every case a gRPC call on a fresh connection must
succeed: a broken client never costs anyone else.

Where h2spec accepts either a stream or a connection error, the entry names the one the gateway
gives and why (see gateway/http2/connection.py). Ids are h2spec's: `http2/5.1/3` is case 3 of
section 5.1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import grpc
import pytest
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

from dpgate.e2e.h2_wire import (
    GENERATE,
    GENERATE_BODY,
    H2Client,
    Seen,
    call,
    data,
    endless_call,
    generate_body_of_length,
    grpc_status,
    headers,
    padded,
    ping,
    priority,
    request_fields,
    rst_stream,
    settings,
    window_update,
)
from gateway.http2 import frames as f
from gateway.http2.header_codec import encode_block
from tests.support.gateway_processes import gateway_starter, generate_request, inference_stub, running_synthetic_engine

MAX_STREAMS = 8  # the module's gateway advertises this, so 5.1.2 opens few streams


# --- expected reactions ---------------------------------------------------------------------


def _no_errors(seen: Seen) -> None:
    assert not seen.of_type(f.GOAWAY), f"unexpected GOAWAY {[fr.payload for fr in seen.of_type(f.GOAWAY)]}"
    resets = [(fr.stream_id, f.unpack_error_code(fr.payload)) for fr in seen.of_type(f.RST_STREAM)]
    assert not resets, f"unexpected RST_STREAM {resets}"
    assert not seen.closed, "the gateway closed the connection"


@dataclass(frozen=True)
class GoAway:
    """A connection error: GOAWAY with `code` (and `last_stream_id` when given), then the close."""

    code: int
    last_stream_id: int | None = None

    def check(self, client: H2Client) -> None:
        seen = client.read_until(lambda frame: False)
        goaways = seen.of_type(f.GOAWAY)
        assert goaways, f"no GOAWAY; frames {[(fr.type, fr.stream_id) for fr in seen.frames]}"
        last_stream_id, code = f.unpack_goaway(goaways[-1].payload)
        assert code == self.code, f"GOAWAY code {code}, expected {self.code} ({goaways[-1].payload[8:]!r})"
        if self.last_stream_id is not None:
            assert last_stream_id == self.last_stream_id
        assert seen.closed


@dataclass(frozen=True)
class Reset:
    """A stream error: RST_STREAM with `code` on `stream_id`; the connection goes on."""

    code: int
    stream_id: int = 1

    def check(self, client: H2Client) -> None:
        seen = client.read_until(lambda frame: frame.type == f.RST_STREAM and frame.stream_id == self.stream_id)
        assert not seen.of_type(f.GOAWAY) and not seen.closed, "a connection error instead of a stream error"
        code = f.unpack_error_code(seen.frames[-1].payload)
        assert code == self.code, f"RST_STREAM code {code}, expected {self.code}"
        Alive().check(client)


@dataclass(frozen=True)
class Alive:
    """No reaction: the connection answers a PING and sent no GOAWAY or RST_STREAM before it."""

    def check(self, client: H2Client) -> None:
        client.send(ping(b"alive?!!"))
        seen = client.read_until(lambda fr: fr.type == f.PING and fr.flags & f.ACK and fr.payload == b"alive?!!")
        _no_errors(seen)


@dataclass(frozen=True)
class Responds:
    """A whole response on `stream_id` (gRPC status OK unless `any_status`), no error."""

    stream_id: int = 1
    any_status: bool = False

    def check(self, client: H2Client) -> None:
        seen = client.read_until(
            lambda fr: (fr.stream_id == self.stream_id and fr.flags & f.END_STREAM and fr.type in (f.HEADERS, f.DATA))
            or fr.type in (f.GOAWAY, f.RST_STREAM)
        )
        _no_errors(seen)
        last = seen.frames[-1]
        assert last.type == f.HEADERS and last.headers is not None
        if not self.any_status:
            assert grpc_status(last) == b"0", last.headers


@dataclass(frozen=True)
class HeadersArrive:
    """The response's HEADERS on `stream_id` (a wait inside a case)."""

    stream_id: int = 1

    def check(self, client: H2Client) -> None:
        seen = client.read_until(lambda fr: fr.type == f.HEADERS and fr.stream_id == self.stream_id)
        _no_errors(seen)


@dataclass(frozen=True)
class DataOfLength:
    """The next DATA frame on `stream_id` carries exactly `length` bytes (flow control)."""

    length: int
    stream_id: int = 1

    def check(self, client: H2Client) -> None:
        seen = client.read_until(lambda fr: fr.type == f.DATA and fr.stream_id == self.stream_id)
        _no_errors(seen)
        assert len(seen.frames[-1].payload) == self.length


@dataclass(frozen=True)
class SettingsAck:
    def check(self, client: H2Client) -> None:
        _no_errors(client.read_until(lambda fr: fr.type == f.SETTINGS and fr.flags & f.ACK))


@dataclass(frozen=True)
class ServerSettings:
    def check(self, client: H2Client) -> None:
        seen = client.read_until(lambda fr: fr.type == f.SETTINGS and not fr.flags & f.ACK)
        _no_errors(seen)


@dataclass(frozen=True)
class PingAck:
    """The first PING ack carries `payload` (an ack is never acked)."""

    payload: bytes

    def check(self, client: H2Client) -> None:
        seen = client.read_until(lambda fr: fr.type == f.PING and fr.flags & f.ACK)
        _no_errors(seen)
        assert seen.frames[-1].payload == self.payload


Expectation = GoAway | Reset | Alive | Responds | HeadersArrive | DataOfLength | SettingsAck | ServerSettings | PingAck


@dataclass(frozen=True)
class Case:
    """Steps are bytes to send, expectations to wait for, or functions of the client returning bytes."""

    id: str
    title: str
    steps: tuple
    expect: Expectation
    handshake: tuple[tuple[int, int], ...] | None = ()  # our SETTINGS; None: the case sends its own preface


# --- frame builders for the cases -----------------------------------------------------------

PROTO, FRAME, FLOW, CLOSED, COMPRESSION, REFUSED = (
    f.PROTOCOL_ERROR, f.FRAME_SIZE_ERROR, f.FLOW_CONTROL_ERROR, f.STREAM_CLOSED, f.COMPRESSION_ERROR,
    f.REFUSED_STREAM,
)  # fmt: skip
WINDOW_ZERO = ((f.SETTINGS_INITIAL_WINDOW_SIZE, 0),)
BASE_BLOCK = encode_block(request_fields())
BODY_64 = generate_body_of_length(64)


def raw(frame_type: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return f.pack_frame(frame_type, flags, stream_id, payload)


def continuation(stream_id: int, block: bytes = b"", end_headers: bool = True) -> bytes:
    return raw(f.CONTINUATION, f.END_HEADERS if end_headers else 0, stream_id, block)


def split_request(stream_id: int, parts: int, end_stream: bool = True) -> bytes:
    """A Generate request (no body) whose field block is cut into HEADERS + CONTINUATION frames."""
    cut = [len(BASE_BLOCK) * i // parts for i in range(parts + 1)]
    chunks = [BASE_BLOCK[cut[i] : cut[i + 1]] for i in range(parts)]
    out = headers(stream_id, block=chunks[0], end_headers=False, end_stream=end_stream)
    for i, chunk in enumerate(chunks[1:], start=2):
        out += continuation(stream_id, chunk, end_headers=i == parts)
    return out


def fields_with(*changes: tuple[bytes, bytes | None], extra: tuple[tuple[bytes, bytes], ...] = ()) -> list:
    """The request fields with some dropped (value None) or replaced, plus `extra` at the end."""
    wanted = dict(changes)
    out = [(name, wanted.get(name, value)) for name, value in request_fields() if wanted.get(name, value) is not None]
    return out + list(extra)


def bad_request(stream_id: int, fields: list) -> bytes:
    return headers(stream_id, fields) + data(stream_id)


def _string(value: bytes, huffman: bool = False) -> bytes:
    if huffman:
        value = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH).encode(value)
    assert len(value) < 127
    return bytes(((0x80 if huffman else 0) | len(value),)) + value


def with_block(stream_id: int, extra_block: bytes, before: bool = False) -> bytes:
    """A Generate request whose field block carries raw HPACK bytes before or after its own."""
    block = extra_block + BASE_BLOCK if before else BASE_BLOCK + extra_block
    return headers(stream_id, block=block) + data(stream_id)


def max_streams_plus_one(client: H2Client) -> bytes:
    count = client.server_settings[f.SETTINGS_MAX_CONCURRENT_STREAMS]
    return b"".join(headers(1 + 2 * i) for i in range(count + 1))


UA = 58  # static table index of user-agent (RFC 7541 appendix A)

CASES: list[Case] = [
    # --- generic: what every server must simply serve --------------------------------------
    Case("generic/1/1", "client connection preface", (), ServerSettings()),
    Case("generic/2/1", "PRIORITY on an idle stream", (priority(3),), Alive()),
    Case("generic/2/2", "WINDOW_UPDATE on half-closed (remote)", (endless_call(1), window_update(1, 100)), Alive(),
         WINDOW_ZERO),
    Case("generic/2/3", "PRIORITY on half-closed (remote)", (endless_call(1), priority(1, 0)), Alive(), WINDOW_ZERO),
    Case("generic/2/4", "RST_STREAM on half-closed (remote)", (endless_call(1), rst_stream(1)), Alive(), WINDOW_ZERO),
    Case("generic/2/5", "PRIORITY on a closed stream", (call(1), Responds(1), priority(1)), Alive()),
    Case("generic/3.1/1", "DATA", (call(1),), Responds()),
    Case("generic/3.1/2", "multiple DATA frames",
         (headers(1), data(1, BODY_64[:10], end_stream=False), data(1, BODY_64[10:30], end_stream=False),
          data(1, BODY_64[30:])),
         Responds()),
    Case("generic/3.1/3", "DATA with padding",
         (headers(1), data(1, padded(BODY_64, 8), flags=f.PADDED)), Responds()),
    Case("generic/3.2/1", "HEADERS", (headers(1) + data(1),), Responds()),
    Case("generic/3.2/2", "HEADERS with padding",
         (headers(1, block=padded(BASE_BLOCK, 10), flags=f.PADDED), data(1)), Responds()),
    Case("generic/3.2/3", "HEADERS with priority",
         (headers(1, block=f.pack_priority(0, 255) + BASE_BLOCK, flags=f.PRIORITY_FLAG), data(1)), Responds()),
    Case("generic/3.3/1", "PRIORITY with priority 1", (priority(1, 0, 0), call(1)), Responds()),
    Case("generic/3.3/2", "PRIORITY with priority 256", (priority(1, 0, 255), call(1)), Responds()),
    Case("generic/3.3/3", "PRIORITY with stream dependency", (priority(3, 1), call(1)), Responds()),
    Case("generic/3.3/4", "PRIORITY with exclusive", (priority(3, 1, exclusive=True), call(1)), Responds()),
    Case("generic/3.3/5", "PRIORITY for an idle stream, then HEADERS on a lower id",
         (priority(5, 0), call(3)), Responds(3)),
    Case("generic/3.4/1", "RST_STREAM", (headers(1), rst_stream(1)), Alive()),
    *[
        Case(f"generic/3.5/{i}", f"SETTINGS {name}", (settings((key, value)),), SettingsAck())
        for i, (name, key, value) in enumerate(
            [("HEADER_TABLE_SIZE", 1, 4096), ("ENABLE_PUSH", 2, 0), ("MAX_CONCURRENT_STREAMS", 3, 100),
             ("INITIAL_WINDOW_SIZE", 4, 65535), ("MAX_FRAME_SIZE", 5, 16384), ("MAX_HEADER_LIST_SIZE", 6, 65536),
             ("an unknown identifier", 0xFF, 1)],
            start=1,
        )
    ],
    Case("generic/3.7/1", "PING", (ping(b"12345678"),), PingAck(b"12345678")),
    Case("generic/3.8/1", "GOAWAY", (f.pack_goaway(0, f.NO_ERROR),), Alive()),
    Case("generic/3.9/1", "WINDOW_UPDATE on the connection", (window_update(0, 1),), Alive()),
    Case("generic/3.9/2", "WINDOW_UPDATE on a stream", (headers(1), window_update(1, 1)), Alive()),
    Case("generic/3.10/1", "CONTINUATION", (split_request(1, 2, end_stream=False), data(1)), Responds()),
    Case("generic/3.10/2", "multiple CONTINUATION frames", (split_request(1, 4, end_stream=False), data(1)),
         Responds()),
    Case("generic/4/1", "GET request",
         (headers(1, fields_with((b":method", b"GET")), end_stream=True),), Responds(any_status=True)),
    Case("generic/4/2", "HEAD request",
         (headers(1, fields_with((b":method", b"HEAD")), end_stream=True),), Responds(any_status=True)),
    Case("generic/4/3", "POST request", (call(1),), Responds()),
    Case("generic/4/4", "POST request with trailers",
         (headers(1), data(1, end_stream=False), headers(1, [(b"x-trailer", b"1")], end_stream=True)), Responds()),
    Case("generic/5/1", "HPACK indexed field", (with_block(1, b"\x90"),), Responds()),  # accept-encoding
    Case("generic/5/2", "HPACK literal, incremental indexing, indexed name; then its dynamic index",
         (with_block(1, bytes((0x40 | UA,)) + _string(b"h2")), Responds(1), with_block(3, b"\xbe")), Responds(3)),
    Case("generic/5/3", "HPACK literal, incremental indexing, new name",
         (with_block(1, b"\x40" + _string(b"x-h2") + _string(b"v")),), Responds()),
    Case("generic/5/4", "HPACK literal without indexing, indexed name",
         (with_block(1, b"\x0f\x2b" + _string(b"h2")),), Responds()),
    Case("generic/5/5", "HPACK literal without indexing, new name",
         (with_block(1, b"\x00" + _string(b"x-h2") + _string(b"v")),), Responds()),
    Case("generic/5/6", "HPACK literal never indexed, indexed name",
         (with_block(1, b"\x1f\x2b" + _string(b"h2")),), Responds()),
    Case("generic/5/7", "HPACK literal never indexed, new name",
         (with_block(1, b"\x10" + _string(b"x-h2") + _string(b"v")),), Responds()),
    Case("generic/5/8", "HPACK dynamic table size update", (with_block(1, b"\x20", before=True),), Responds()),
    Case("generic/5/9", "HPACK Huffman-encoded strings",
         (with_block(1, b"\x00" + _string(b"x-h2", True) + _string(b"huffman", True)),), Responds()),
    # --- http2/3.5 connection preface ----------------------------------------------------------
    Case("http2/3.5/1", "client connection preface", (), ServerSettings()),
    Case("http2/3.5/2", "invalid connection preface",
         (b"INVALID CONNECTION PREFACE\r\n\r\n",), GoAway(PROTO), handshake=None),
    Case("http2/3.5/x1", "preface not followed by SETTINGS", (f.PREFACE + ping(),), GoAway(PROTO), handshake=None),
    Case("http2/3.5/x2", "preface followed by a SETTINGS ACK",
         (f.PREFACE + settings(ack=True),), GoAway(PROTO), handshake=None),
    # --- http2/4.1 frame format ----------------------------------------------------------------
    Case("http2/4.1/1", "a frame of unknown type", (raw(0x16, 0, 0, b"1" * 8),), Alive()),
    Case("http2/4.1/2", "a frame with undefined flags", (raw(f.PING, 0x16, 0, b"flagged!"),), PingAck(b"flagged!")),
    Case("http2/4.1/3", "a frame with the reserved bit set",
         (raw(f.HEADERS, f.END_HEADERS, 1 | 0x8000_0000, BASE_BLOCK), data(1)), Responds()),
    # --- http2/4.2 frame size ------------------------------------------------------------------
    Case("http2/4.2/1", "DATA of 2^14 octets", (headers(1), data(1, generate_body_of_length(16_384))), Responds()),
    Case("http2/4.2/2", "DATA over SETTINGS_MAX_FRAME_SIZE", (headers(1), data(1, b"x" * 16_385)), GoAway(FRAME)),
    Case("http2/4.2/3", "HEADERS over SETTINGS_MAX_FRAME_SIZE",
         (headers(1, block=BASE_BLOCK + encode_block([(b"x-big", b"x" * 16_384)])),), GoAway(FRAME)),
    # --- http2/4.3 header compression ----------------------------------------------------------
    Case("http2/4.3/1", "invalid field block fragment", (headers(1, block=b"\xff\xff\xff\xff\xff"),),
         GoAway(COMPRESSION)),
    Case("http2/4.3/2", "PRIORITY inside a field block",
         (headers(1, block=BASE_BLOCK[:5], end_headers=False), priority(1)), GoAway(PROTO)),
    Case("http2/4.3/3", "HEADERS of another stream inside a field block",
         (headers(1, block=BASE_BLOCK[:5], end_headers=False), headers(3)), GoAway(PROTO)),
    # --- http2/5.1 stream states ---------------------------------------------------------------
    Case("http2/5.1/1", "idle: DATA", (data(1),), GoAway(PROTO)),
    Case("http2/5.1/2", "idle: RST_STREAM", (rst_stream(1),), GoAway(PROTO)),
    Case("http2/5.1/3", "idle: WINDOW_UPDATE", (window_update(1, 100),), GoAway(PROTO)),
    Case("http2/5.1/4", "idle: CONTINUATION", (continuation(1, BASE_BLOCK),), GoAway(PROTO)),
    Case("http2/5.1/5", "half closed (remote): DATA", (endless_call(1), data(1)), Reset(CLOSED), WINDOW_ZERO),
    Case("http2/5.1/6", "half closed (remote): HEADERS",
         (endless_call(1), headers(1, [(b"x-trailer", b"1")], end_stream=True)), Reset(CLOSED), WINDOW_ZERO),
    # A CONTINUATION whose HEADERS never came is a connection error whatever the stream's state.
    Case("http2/5.1/7", "half closed (remote): CONTINUATION", (endless_call(1), continuation(1)), GoAway(PROTO),
         WINDOW_ZERO),
    Case("http2/5.1/8", "closed: DATA after RST_STREAM", (headers(1), rst_stream(1), data(1)), Reset(CLOSED)),
    Case("http2/5.1/9", "closed: HEADERS after RST_STREAM",
         (headers(1), rst_stream(1), headers(1, end_stream=True)), Reset(CLOSED)),
    Case("http2/5.1/10", "closed: CONTINUATION after RST_STREAM",
         (headers(1), rst_stream(1), continuation(1)), GoAway(PROTO)),
    Case("http2/5.1/11", "closed: DATA", (call(1), Responds(1), data(1)), Reset(CLOSED)),
    Case("http2/5.1/12", "closed: HEADERS", (call(1), Responds(1), headers(1, end_stream=True)), Reset(CLOSED)),
    Case("http2/5.1/13", "closed: CONTINUATION", (call(1), Responds(1), continuation(1)), GoAway(PROTO)),
    Case("http2/5.1/x1", "closed: WINDOW_UPDATE (may be in flight) is ignored",
         (call(1), Responds(1), window_update(1, 10)), Alive()),
    Case("http2/5.1/x2", "closed: RST_STREAM is ignored", (call(1), Responds(1), rst_stream(1)), Alive()),
    # --- http2/5.1.1 stream identifiers --------------------------------------------------------
    Case("http2/5.1.1/1", "even-numbered stream identifier", (call(2),), GoAway(PROTO)),
    Case("http2/5.1.1/2", "stream identifier lower than a previous one", (headers(5), headers(3)), GoAway(PROTO)),
    Case("http2/5.1.1/x1", "the same stream id twice after it closed",
         (call(1), Responds(1), call(1)), Reset(CLOSED)),
    # --- http2/5.1.2 stream concurrency ---------------------------------------------------------
    Case("http2/5.1.2/1", "HEADERS beyond SETTINGS_MAX_CONCURRENT_STREAMS",
         (ServerSettings(), max_streams_plus_one), Reset(REFUSED, 2 * MAX_STREAMS + 1)),
    # --- http2/5.3.1 stream dependencies --------------------------------------------------------
    Case("http2/5.3.1/1", "HEADERS that depends on itself",
         (headers(1, block=f.pack_priority(1) + BASE_BLOCK, flags=f.PRIORITY_FLAG), data(1)), Reset(PROTO)),
    Case("http2/5.3.1/2", "PRIORITY that depends on itself (open stream)", (headers(1), priority(1, 1)),
         Reset(PROTO)),
    # Nothing may be sent on an idle stream, so there the stream error becomes a connection error.
    Case("http2/5.3.1/x1", "PRIORITY that depends on itself (idle stream)", (priority(3, 3),), GoAway(PROTO)),
    # --- http2/5.4.1 connection error handling -------------------------------------------------
    Case("http2/5.4.1/1", "invalid PING: GOAWAY, then the connection closes", (ping(b"123456"),), GoAway(FRAME)),
    Case("http2/5.4.1/2", "invalid PING: GOAWAY names the last stream processed",
         (call(1), Responds(1), ping(b"123456")), GoAway(FRAME, last_stream_id=1)),
    # --- http2/5.5 extending HTTP/2 ------------------------------------------------------------
    Case("http2/5.5/1", "unknown extension frame", (raw(0xFF, 0, 0, b"ext"),), Alive()),
    Case("http2/5.5/2", "unknown extension frame inside a field block",
         (headers(1, block=BASE_BLOCK[:5], end_headers=False), raw(0xFF, 0, 1, b"ext")), GoAway(PROTO)),
    # --- http2/6.1 DATA ------------------------------------------------------------------------
    Case("http2/6.1/1", "DATA on stream 0", (data(0),), GoAway(PROTO)),
    Case("http2/6.1/2", "DATA on a stream not open", (headers(1, end_stream=True), data(1)), Reset(CLOSED)),
    Case("http2/6.1/3", "DATA with padding longer than the payload",
         (headers(1), raw(f.DATA, f.PADDED | f.END_STREAM, 1, b"\x08" + b"x" * 4)), GoAway(PROTO)),
    Case("http2/6.1/x1", "PADDED DATA without a pad length", (headers(1), raw(f.DATA, f.PADDED, 1)), GoAway(FRAME)),
    # --- http2/6.2 HEADERS ---------------------------------------------------------------------
    Case("http2/6.2/1", "HEADERS without END_HEADERS, then PRIORITY",
         (headers(1, block=BASE_BLOCK, end_headers=False), priority(1)), GoAway(PROTO)),
    Case("http2/6.2/2", "HEADERS to another stream while a field block is open",
         (headers(1, block=BASE_BLOCK, end_headers=False), headers(3)), GoAway(PROTO)),
    Case("http2/6.2/3", "HEADERS on stream 0", (headers(0),), GoAway(PROTO)),
    Case("http2/6.2/4", "HEADERS with padding longer than the payload",
         (raw(f.HEADERS, f.END_HEADERS | f.PADDED, 1, bytes((len(BASE_BLOCK) + 1,)) + BASE_BLOCK),), GoAway(PROTO)),
    Case("http2/6.2/x1", "HEADERS with PRIORITY but too short for it",
         (raw(f.HEADERS, f.END_HEADERS | f.PRIORITY_FLAG, 1, b"\x00\x00"),), GoAway(FRAME)),
    # --- http2/6.3 PRIORITY --------------------------------------------------------------------
    Case("http2/6.3/1", "PRIORITY on stream 0", (priority(0, 1),), GoAway(PROTO)),
    Case("http2/6.3/2", "PRIORITY of a length other than 5",
         (headers(1), raw(f.PRIORITY, 0, 1, b"\x00" * 4)), Reset(FRAME)),
    # --- http2/6.4 RST_STREAM ------------------------------------------------------------------
    Case("http2/6.4/1", "RST_STREAM on stream 0", (rst_stream(0),), GoAway(PROTO)),
    Case("http2/6.4/2", "RST_STREAM on an idle stream", (rst_stream(1),), GoAway(PROTO)),
    Case("http2/6.4/3", "RST_STREAM of a length other than 4",
         (headers(1), raw(f.RST_STREAM, 0, 1, b"\x00" * 3)), GoAway(FRAME)),
    # --- http2/6.5 SETTINGS --------------------------------------------------------------------
    Case("http2/6.5/1", "SETTINGS ACK with a payload", (raw(f.SETTINGS, f.ACK, 0, b"\x00" * 6),), GoAway(FRAME)),
    Case("http2/6.5/2", "SETTINGS on a stream", (settings((3, 100), stream_id=1),), GoAway(PROTO)),
    Case("http2/6.5/3", "SETTINGS of a length not a multiple of 6", (raw(f.SETTINGS, 0, 0, b"\x00" * 3),),
         GoAway(FRAME)),
    Case("http2/6.5.2/1", "SETTINGS_ENABLE_PUSH 2", (settings((f.SETTINGS_ENABLE_PUSH, 2)),), GoAway(PROTO)),
    Case("http2/6.5.2/2", "SETTINGS_INITIAL_WINDOW_SIZE 2^31", (settings((f.SETTINGS_INITIAL_WINDOW_SIZE, 2**31)),),
         GoAway(FLOW)),
    Case("http2/6.5.2/3", "SETTINGS_MAX_FRAME_SIZE 16383", (settings((f.SETTINGS_MAX_FRAME_SIZE, 16_383)),),
         GoAway(PROTO)),
    Case("http2/6.5.2/4", "SETTINGS_MAX_FRAME_SIZE 2^24", (settings((f.SETTINGS_MAX_FRAME_SIZE, 2**24)),),
         GoAway(PROTO)),
    Case("http2/6.5.2/5", "SETTINGS with an unknown identifier", (settings((0xFF, 1)),), SettingsAck()),
    Case("http2/6.5.3/1", "several SETTINGS_INITIAL_WINDOW_SIZE values apply in order",
         (settings((f.SETTINGS_INITIAL_WINDOW_SIZE, 100), (f.SETTINGS_INITIAL_WINDOW_SIZE, 1)), call(1)),
         DataOfLength(1)),
    Case("http2/6.5.3/2", "SETTINGS without ACK is acknowledged", (settings((3, 100)),), SettingsAck()),
    # --- http2/6.7 PING ------------------------------------------------------------------------
    Case("http2/6.7/1", "PING", (ping(b"pingpong"),), PingAck(b"pingpong")),
    Case("http2/6.7/2", "PING with ACK is not answered",
         (ping(b"unsought", ack=True), ping(b"answered")), PingAck(b"answered")),
    Case("http2/6.7/3", "PING on a stream", (ping(stream_id=1),), GoAway(PROTO)),
    Case("http2/6.7/4", "PING of a length other than 8", (raw(f.PING, 0, 0, b"1" * 6),), GoAway(FRAME)),
    # --- http2/6.8 GOAWAY ----------------------------------------------------------------------
    Case("http2/6.8/1", "GOAWAY on a stream", (raw(f.GOAWAY, 0, 1, b"\x00" * 8),), GoAway(PROTO)),
    Case("http2/6.8/x1", "GOAWAY shorter than 8", (raw(f.GOAWAY, 0, 0, b"\x00" * 4),), GoAway(FRAME)),
    # --- http2/6.9 WINDOW_UPDATE ---------------------------------------------------------------
    Case("http2/6.9/1", "WINDOW_UPDATE of 0 on the connection", (window_update(0, 0),), GoAway(PROTO)),
    Case("http2/6.9/2", "WINDOW_UPDATE of 0 on a stream", (headers(1), window_update(1, 0)), Reset(PROTO)),
    Case("http2/6.9/3", "WINDOW_UPDATE of a length other than 4", (raw(f.WINDOW_UPDATE, 0, 0, b"\x00" * 3),),
         GoAway(FRAME)),
    Case("http2/6.9.1/1", "an initial window of 1 gives DATA of 1", (call(1),), DataOfLength(1),
         ((f.SETTINGS_INITIAL_WINDOW_SIZE, 1),)),
    Case("http2/6.9.1/2", "connection window past 2^31-1", (window_update(0, 2**31 - 1),), GoAway(FLOW)),
    Case("http2/6.9.1/3", "stream window past 2^31-1", (headers(1), window_update(1, 2**31 - 1)), Reset(FLOW)),
    Case("http2/6.9.2/1", "SETTINGS_INITIAL_WINDOW_SIZE changed after HEADERS",
         (call(1), HeadersArrive(1), settings((f.SETTINGS_INITIAL_WINDOW_SIZE, 1))), DataOfLength(1), WINDOW_ZERO),
    Case("http2/6.9.2/2", "SETTINGS_INITIAL_WINDOW_SIZE makes a window negative",
         (call(1), DataOfLength(3), settings((f.SETTINGS_INITIAL_WINDOW_SIZE, 0)), window_update(1, 4)),
         DataOfLength(1), ((f.SETTINGS_INITIAL_WINDOW_SIZE, 3),)),
    Case("http2/6.9.2/3", "SETTINGS_INITIAL_WINDOW_SIZE past the maximum",
         (settings((f.SETTINGS_INITIAL_WINDOW_SIZE, 2**31)),), GoAway(FLOW)),
    Case("http2/6.9.2/x1", "SETTINGS_INITIAL_WINDOW_SIZE overflowing an open stream's window",
         (headers(1), window_update(1, 2**31 - 1 - 65_535), settings((f.SETTINGS_INITIAL_WINDOW_SIZE, 65_536))),
         GoAway(FLOW)),
    # --- http2/6.10 CONTINUATION ---------------------------------------------------------------
    Case("http2/6.10/1", "multiple CONTINUATION frames after HEADERS",
         (split_request(1, 3, end_stream=False), data(1)), Responds()),
    Case("http2/6.10/2", "CONTINUATION followed by another frame",
         (headers(1, block=BASE_BLOCK[:4], end_headers=False), continuation(1, BASE_BLOCK[4:8], False), data(1)),
         GoAway(PROTO)),
    Case("http2/6.10/3", "CONTINUATION on stream 0",
         (headers(1, block=BASE_BLOCK[:4], end_headers=False), continuation(0, BASE_BLOCK[4:])), GoAway(PROTO)),
    Case("http2/6.10/4", "CONTINUATION after HEADERS with END_HEADERS", (headers(1), continuation(1, b"")),
         GoAway(PROTO)),
    Case("http2/6.10/5", "CONTINUATION after CONTINUATION with END_HEADERS",
         (headers(1, block=BASE_BLOCK[:4], end_headers=False), continuation(1, BASE_BLOCK[4:]), continuation(1)),
         GoAway(PROTO)),
    Case("http2/6.10/6", "CONTINUATION after DATA", (headers(1), data(1, end_stream=False), continuation(1)),
         GoAway(PROTO)),
    # --- http2/7 error codes -------------------------------------------------------------------
    Case("http2/7/1", "GOAWAY with an unknown error code", (f.pack_goaway(0, 0xFF),), Alive()),
    Case("http2/7/2", "RST_STREAM with an unknown error code", (headers(1), rst_stream(1, 0xFF)), Alive()),
    # --- http2/8.1 HTTP message exchange -------------------------------------------------------
    Case("http2/8.1/1", "a second HEADERS without END_STREAM",
         (headers(1), headers(1, [(b"x-more", b"1")])), Reset(PROTO)),
    Case("http2/8.1.2/1", "uppercase field name", (bad_request(1, fields_with(extra=((b"X-Upper", b"1"),))),),
         Reset(PROTO)),
    Case("http2/8.1.2.1/1", "unknown pseudo-header", (bad_request(1, [(b":foo", b"1"), *request_fields()]),),
         Reset(PROTO)),
    Case("http2/8.1.2.1/2", "response pseudo-header in a request",
         (bad_request(1, [(b":status", b"200"), *request_fields()]),), Reset(PROTO)),
    Case("http2/8.1.2.1/3", "pseudo-header in trailers",
         (headers(1), data(1, end_stream=False), headers(1, [(b":method", b"POST")], end_stream=True)), Reset(PROTO)),
    Case("http2/8.1.2.1/4", "pseudo-header after a regular field",
         (bad_request(1, [*request_fields(), (b":authority", b"late")]),), Reset(PROTO)),
    Case("http2/8.1.2.2/1", "connection-specific field",
         (bad_request(1, fields_with(extra=((b"connection", b"keep-alive"),))),), Reset(PROTO)),
    Case("http2/8.1.2.2/2", "te other than trailers", (bad_request(1, fields_with((b"te", b"trailers, deflate"))),),
         Reset(PROTO)),
    Case("http2/8.1.2.3/1", "empty :path", (bad_request(1, fields_with((b":path", b""))),), Reset(PROTO)),
    Case("http2/8.1.2.3/2", ":method omitted", (bad_request(1, fields_with((b":method", None))),), Reset(PROTO)),
    Case("http2/8.1.2.3/3", ":scheme omitted", (bad_request(1, fields_with((b":scheme", None))),), Reset(PROTO)),
    Case("http2/8.1.2.3/4", ":path omitted", (bad_request(1, fields_with((b":path", None))),), Reset(PROTO)),
    Case("http2/8.1.2.3/5", ":method twice", (bad_request(1, [(b":method", b"POST"), *request_fields()]),),
         Reset(PROTO)),
    Case("http2/8.1.2.3/6", ":scheme twice", (bad_request(1, [(b":scheme", b"http"), *request_fields()]),),
         Reset(PROTO)),
    Case("http2/8.1.2.3/7", ":path twice", (bad_request(1, [(b":path", GENERATE), *request_fields()]),),
         Reset(PROTO)),
    Case("http2/8.1.2.6/1", "content-length other than the DATA",
         (bad_request(1, fields_with(extra=((b"content-length", b"1"),))),), Reset(PROTO)),
    Case("http2/8.1.2.6/2", "content-length other than the sum of several DATA",
         (headers(1, fields_with(extra=((b"content-length", b"8"),))), data(1, b"\0" * 5, end_stream=False),
          data(1, b"\0" * 5)), Reset(PROTO)),
    Case("http2/8.1.2.6/x1", "content-length equal to the DATA is served",
         (headers(1, fields_with(extra=((b"content-length", str(len(GENERATE_BODY)).encode()),))), data(1)),
         Responds()),
    Case("http2/8.1.2.6/x2", "content-length with no DATA at all",
         (headers(1, fields_with(extra=((b"content-length", b"3"),)), end_stream=True),), Reset(PROTO)),
    Case("http2/8.1.2/x1", "field value with a line feed",
         (bad_request(1, fields_with(extra=((b"x-bad", b"a\nb"),))),), Reset(PROTO)),
    Case("http2/8.1.2/x2", "field name with a space", (bad_request(1, fields_with(extra=((b"x bad", b"1"),))),),
         Reset(PROTO)),
    Case("http2/8.1.2/x3", "transfer-encoding", (bad_request(1, fields_with(extra=((b"transfer-encoding", b"x"),))),),
         Reset(PROTO)),
    Case("http2/8.1.2/x4", "host that differs from :authority",
         (bad_request(1, fields_with(extra=((b"host", b"elsewhere"),))),), Reset(PROTO)),
    Case("http2/8.1.2/x5", "CONNECT with :path", (bad_request(1, fields_with((b":method", b"CONNECT"))),),
         Reset(PROTO)),
    Case("http2/8.1.2/x6", "a malformed request stream is closed: DATA after its reset is ignored",
         (bad_request(1, fields_with((b":path", b""))), Reset(PROTO), data(1)), Alive()),
    # --- http2/8.2 server push -----------------------------------------------------------------
    Case("http2/8.2/1", "PUSH_PROMISE from a client", (headers(1), raw(f.PUSH_PROMISE, f.END_HEADERS, 1,
         b"\x00\x00\x00\x02" + BASE_BLOCK)), GoAway(PROTO)),
    # --- hpack ---------------------------------------------------------------------------------
    Case("hpack/2.3.3/1", "indexed field with an index past both tables", (with_block(1, b"\xc6"),),
         GoAway(COMPRESSION)),
    Case("hpack/2.3.3/2", "literal with a name index past both tables",
         (with_block(1, b"\x7f\x10" + _string(b"x")),), GoAway(COMPRESSION)),
    Case("hpack/4.2/1", "table size update above SETTINGS_HEADER_TABLE_SIZE",
         (with_block(1, b"\x3f\xe2\x1f", before=True),), GoAway(COMPRESSION)),
    Case("hpack/5.2/1", "Huffman string holding EOS",
         (with_block(1, b"\x00\x85\xff\xff\xff\xff\xff" + _string(b"x")),), GoAway(COMPRESSION)),
    Case("hpack/5.2/2", "Huffman padding longer than 7 bits",
         (with_block(1, b"\x00\x82\x1f\xff" + _string(b"x")),), GoAway(COMPRESSION)),
    Case("hpack/5.2/3", "Huffman padding that is not EOS's prefix",
         (with_block(1, b"\x00\x81\x18" + _string(b"x")),), GoAway(COMPRESSION)),
    Case("hpack/6.1/1", "indexed field with index 0", (with_block(1, b"\x80"),), GoAway(COMPRESSION)),
    Case("hpack/6.3/1", "table size update at the end of a block", (with_block(1, b"\x20"),), GoAway(COMPRESSION)),
]


# --- the run ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(log_dir):
    with running_synthetic_engine(log_dir) as process:
        yield process


@pytest.fixture(scope="module")
def gateway(engine, log_dir):
    with gateway_starter(engine, log_dir) as start:
        gateway = start("--max-concurrent-streams", str(MAX_STREAMS), name="gateway-h2spec")
        gateway.wait_ranks([0])
        yield gateway


def run_case(case: Case, port: int) -> None:
    client = H2Client(port)
    try:
        if case.handshake is not None:
            client.handshake(*case.handshake)
        for step in case.steps:
            if isinstance(step, bytes):
                client.send(step)
            elif callable(step) and not hasattr(step, "check"):
                client.send(step(client))
            else:
                step.check(client)
        case.expect.check(client)
    finally:
        client.close()


def test_the_case_list_covers_every_section():
    sections = {case.id.rsplit("/", 1)[0] for case in CASES}
    for section in ("3.5", "4.1", "4.2", "4.3", "5.1", "5.1.1", "5.1.2", "5.3.1", "5.4.1", "5.5", "6.1", "6.2",
                    "6.3", "6.4", "6.5", "6.5.2", "6.5.3", "6.7", "6.8", "6.9", "6.9.1", "6.9.2", "6.10", "7",
                    "8.1", "8.1.2", "8.1.2.1", "8.1.2.2", "8.1.2.3", "8.1.2.6", "8.2"):  # fmt: skip
        assert f"http2/{section}" in sections, section
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_h2spec_case(case: Case, gateway):
    run_case(case, gateway.port)
    with grpc.insecure_channel(gateway.address) as channel:  # a fresh connection is served normally
        assert inference_stub(channel).Generate(generate_request(2), timeout=10).text == "xx"


def wait_running(engine, count: int) -> None:
    deadline = time.monotonic() + 5
    while engine.load().num_running != count:
        assert time.monotonic() < deadline, f"the engine runs {engine.load().num_running} calls, not {count}"
        time.sleep(0.02)


@pytest.mark.parametrize(
    "breakage",
    [raw(f.RST_STREAM, 0, 1, b"\x00" * 3), raw(f.WINDOW_UPDATE, 0, 1, b"\x00" * 5), headers(0)],
    ids=["short RST_STREAM", "long WINDOW_UPDATE", "HEADERS on stream 0"],
)
def test_a_connection_error_cancels_the_engine_calls_it_carried(breakage, gateway, engine):
    """The old relay raised struct.error on these and left the engine's stream running."""
    client = H2Client(gateway.port)
    try:
        client.handshake(*WINDOW_ZERO)
        client.send(endless_call(1))
        wait_running(engine, 1)
        client.send(breakage)
        GoAway(FRAME if breakage[3] != f.HEADERS else PROTO).check(client)
        wait_running(engine, 0)
    finally:
        client.close()
