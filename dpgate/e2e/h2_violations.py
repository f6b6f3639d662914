"""Raw HTTP/2 that breaks RFC 9113 (and RFC 7541 for HPACK), each with the one reaction the RFC
names: bad frame sizes, stream-state violations, window overflows, bad HPACK and bad pseudo-headers.

A sample of each class for the e2e fuzz workload, which runs every case while a GenerateStream on
another connection is in flight and checks that call finishes unharmed. The whole h2spec list,
case by case, is tests/gateway/http2/test_h2spec_e2e.py; this is the part a deployed topology is asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpgate.e2e.h2_wire import (
    GENERATE_STREAM,
    H2Client,
    call,
    data,
    headers,
    ping,
    priority,
    request_fields,
    rst_stream,
    settings,
    window_update,
)
from dpgate.e2e.raw_calls import error_name
from gateway.http2 import frames as f

GOAWAY, RESET = "goaway", "reset"


@dataclass(frozen=True, slots=True)
class Violation:
    """`wire` sent after the preface and SETTINGS; the gateway must answer `reaction` (GOAWAY: a
    connection error, then the close; RESET: RST_STREAM on stream 1, the connection going on) with `code`."""

    name: str
    rfc: str
    wire: bytes
    reaction: str
    code: int

    @property
    def expected(self) -> str:
        return f"{self.reaction}:{error_name(self.code)}"


def _with(fields: list[tuple[bytes, bytes]], **changes: bytes) -> list[tuple[bytes, bytes]]:
    return [(name, changes.get(name.decode().lstrip(":").replace("-", "_"), value)) for name, value in fields]


_REQUEST = request_fields()
_OPEN = headers(1, request_fields(GENERATE_STREAM))  # stream 1 open, nothing sent on it yet
VIOLATIONS = (
    # Frame sizes (RFC 9113 4.2, 6.x)
    Violation("PING of 7 bytes", "6.7", f.pack_frame(f.PING, 0, 0, b"1234567"), GOAWAY, f.FRAME_SIZE_ERROR),
    Violation("SETTINGS of 5 bytes", "6.5", f.pack_frame(f.SETTINGS, 0, 0, b"\0" * 5), GOAWAY, f.FRAME_SIZE_ERROR),
    Violation("WINDOW_UPDATE of 3 bytes", "6.9", f.pack_frame(f.WINDOW_UPDATE, 0, 0, b"\0\0\1"), GOAWAY,
              f.FRAME_SIZE_ERROR),
    Violation("RST_STREAM of 3 bytes", "6.4", _OPEN + f.pack_frame(f.RST_STREAM, 0, 1, b"\0\0\1"), GOAWAY,
              f.FRAME_SIZE_ERROR),
    Violation("PRIORITY of 4 bytes", "6.3", _OPEN + f.pack_frame(f.PRIORITY, 0, 1, b"\0\0\0\1"), RESET,
              f.FRAME_SIZE_ERROR),
    Violation("DATA over SETTINGS_MAX_FRAME_SIZE", "4.2", _OPEN + data(1, b"\0" * (f.DEFAULT_MAX_FRAME + 1)),
              GOAWAY, f.FRAME_SIZE_ERROR),
    # Stream states (RFC 9113 5.1)
    Violation("DATA on an idle stream", "5.1", data(1), GOAWAY, f.PROTOCOL_ERROR),
    Violation("RST_STREAM on an idle stream", "5.1", rst_stream(1), GOAWAY, f.PROTOCOL_ERROR),
    Violation("HEADERS on an even stream id", "5.1.1", headers(2, end_stream=True), GOAWAY, f.PROTOCOL_ERROR),
    Violation("HEADERS on a stream id below one used", "5.1.1", call(3) + headers(1, end_stream=True), GOAWAY,
              f.PROTOCOL_ERROR),
    Violation("DATA on a half-closed (remote) stream", "5.1", call(1) + data(1), RESET, f.STREAM_CLOSED),
    Violation("CONTINUATION without HEADERS", "6.10", f.pack_frame(f.CONTINUATION, f.END_HEADERS, 1, b""), GOAWAY,
              f.PROTOCOL_ERROR),
    Violation("a stream depending on itself", "5.3.1", _OPEN + priority(1, dependency=1), RESET, f.PROTOCOL_ERROR),
    Violation("PUSH_PROMISE from a client", "8.4", f.pack_frame(f.PUSH_PROMISE, f.END_HEADERS, 1, b"\0\0\0\2"),
              GOAWAY, f.PROTOCOL_ERROR),
    # Flow-control windows (RFC 9113 6.9)
    Violation("connection window past 2^31-1", "6.9.1", window_update(0, f.MAX_WINDOW), GOAWAY,
              f.FLOW_CONTROL_ERROR),
    Violation("stream window past 2^31-1", "6.9.1", _OPEN + window_update(1, f.MAX_WINDOW), RESET,
              f.FLOW_CONTROL_ERROR),
    Violation("WINDOW_UPDATE of 0 on the connection", "6.9", window_update(0, 0), GOAWAY, f.PROTOCOL_ERROR),
    Violation("SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1", "6.5.2", settings((f.SETTINGS_INITIAL_WINDOW_SIZE, 1 << 31)),
              GOAWAY, f.FLOW_CONTROL_ERROR),
    # HPACK (RFC 7541, a COMPRESSION_ERROR connection error by RFC 9113 4.3)
    Violation("HPACK index 0", "7541 6.1", headers(1, block=b"\x80", end_stream=True), GOAWAY, f.COMPRESSION_ERROR),
    Violation("HPACK index past both tables", "7541 2.3.3", headers(1, block=b"\xff\x7f", end_stream=True), GOAWAY,
              f.COMPRESSION_ERROR),
    Violation("HPACK table size over the setting", "7541 6.3",
              headers(1, block=b"\x3f" + bytes([0xE9, 0x26]) + b"\x82", end_stream=True), GOAWAY, f.COMPRESSION_ERROR),
    Violation("HPACK literal longer than its block", "7541 5.2", headers(1, block=b"\x00\x7f", end_stream=True),
              GOAWAY, f.COMPRESSION_ERROR),
    # Malformed requests (RFC 9113 8.1-8.3: a stream error)
    Violation("an unknown pseudo-header", "8.3", headers(1, [(b":foo", b"1"), *_REQUEST], end_stream=True), RESET,
              f.PROTOCOL_ERROR),
    Violation("a pseudo-header after a regular field", "8.3",
              headers(1, [*_REQUEST, (b":path", b"/late")], end_stream=True), RESET, f.PROTOCOL_ERROR),
    Violation("no :path", "8.3.1", headers(1, [fd for fd in _REQUEST if fd[0] != b":path"], end_stream=True),
              RESET, f.PROTOCOL_ERROR),
    Violation(":method twice", "8.3", headers(1, [(b":method", b"POST"), *_REQUEST], end_stream=True), RESET,
              f.PROTOCOL_ERROR),
    Violation("an uppercase field name", "8.2.1", headers(1, [*_REQUEST, (b"X-Up", b"1")], end_stream=True), RESET,
              f.PROTOCOL_ERROR),
    Violation("a connection-specific field", "8.2.2",
              headers(1, [*_REQUEST, (b"connection", b"close")], end_stream=True), RESET, f.PROTOCOL_ERROR),
    Violation("an empty :path", "8.3.1", headers(1, _with(_REQUEST, path=b""), end_stream=True), RESET,
              f.PROTOCOL_ERROR),
)  # fmt: skip


def react(host: str, port: int, violation: Violation, timeout: float = 10.0) -> str:
    """Send `violation` on a fresh connection; the reaction label ("goaway:CODE", "reset:CODE", or what
    went wrong instead). A reset must leave the connection answering PINGs."""
    client = H2Client(port, timeout=timeout, host=host)
    try:
        client.handshake()
        client.send(violation.wire)
        seen = client.read_until(
            lambda frame: frame.type == f.GOAWAY or (frame.type == f.RST_STREAM and frame.stream_id == 1), timeout
        )
        if not seen.frames or seen.frames[-1].type not in (f.GOAWAY, f.RST_STREAM):
            return "closed without GOAWAY" if seen.closed else "no reaction"
        last = seen.frames[-1]
        if last.type == f.GOAWAY:
            rest = client.read_until(lambda frame: False, timeout)
            label = f"{GOAWAY}:{error_name(f.unpack_goaway(last.payload)[1])}"
            return label if rest.closed else label + " (connection left open)"
        label = f"{RESET}:{error_name(f.unpack_error_code(last.payload))}"
        client.send(ping(b"alive?!!"))
        after = client.read_until(lambda fr: fr.type == f.PING and bool(fr.flags & f.ACK), timeout)
        if after.closed or after.of_type(f.GOAWAY):
            return label + " then the connection ended"
        return label
    except TimeoutError:
        return "no reaction in time"
    finally:
        client.close()
