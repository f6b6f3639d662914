"""The engine-facing side (client role) holds a broken engine to RFC 9113 as the front door holds clients.

A client connection with one call open is fed what a server might send; the test reads what it
answered (RST_STREAM on the call, or GOAWAY) and what the call heard (`on_reset(code)`).
"""

from __future__ import annotations

import asyncio
import struct

from gateway.http2 import frames as f
from gateway.http2.connection import LOCAL_STREAM_WINDOW, Http2Connection, Stream
from gateway.http2.header_codec import encode_block
from tests.support.memory_transport import MemoryTransport

REQUEST = encode_block([(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/svc/M"),
                        (b"te", b"trailers")])  # fmt: skip
RESPONSE = encode_block([(b":status", b"200"), (b"content-type", b"application/grpc")])
TRAILERS = encode_block([(b"grpc-status", b"0")])
SERVER_PREFACE = f.pack_settings({})


class Call(Stream):
    auto_credit = False  # like the gateway's upstream streams: credit comes back when relayed

    def __init__(self, connection) -> None:
        super().__init__(connection)
        self.events: list[tuple] = []

    def on_headers(self, headers, end_stream):
        self.events.append(("headers", dict(headers), end_stream))

    def on_data(self, data, end_stream):
        self.events.append(("data", len(data), end_stream))

    def on_reset(self, error_code):
        self.events.append(("reset", error_code))


class Client(Http2Connection):
    is_client = True


def frames_of(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out = []
    offset = len(f.PREFACE)
    while offset < len(data):
        high, low, frame_type, flags, stream_id = f.FRAME_HEADER.unpack_from(data, offset)
        length = (high << 8) | low
        out.append((frame_type, flags, stream_id, bytes(data[offset + 9 : offset + 9 + length])))
        offset += 9 + length
    return out


def exchange(*server_frames: bytes) -> tuple[Call, list[tuple[int, int, int, bytes]], MemoryTransport]:
    """Open call 1 on a fresh client connection, feed it the server's bytes; what did each side see?"""

    async def run():
        client = Client()
        transport = MemoryTransport()
        client.connection_made(transport)
        call = Call(client)
        client.add_stream(call, 1)
        client.send_headers(call, REQUEST, end_stream=True)
        client.data_received(SERVER_PREFACE + b"".join(server_frames))
        await asyncio.sleep(0)
        return call, frames_of(bytes(transport.written)), transport

    return asyncio.run(run())


def resets(frames) -> list[tuple[int, int]]:
    return [(stream_id, f.unpack_error_code(payload)) for frame_type, _, stream_id, payload in frames
            if frame_type == f.RST_STREAM]  # fmt: skip


def goaway_code(frames) -> int | None:
    codes = [f.unpack_goaway(payload)[1] for frame_type, _, _, payload in frames if frame_type == f.GOAWAY]
    return codes[-1] if codes else None


def headers(stream_id: int, block: bytes, end_stream: bool = False) -> bytes:
    return f.pack_frame(f.HEADERS, f.END_HEADERS | (f.END_STREAM if end_stream else 0), stream_id, block)


def data(stream_id: int, payload: bytes, end_stream: bool = False) -> bytes:
    return f.pack_frame(f.DATA, f.END_STREAM if end_stream else 0, stream_id, payload)


def test_a_well_formed_response_reaches_the_call():
    call, frames, _ = exchange(
        headers(1, encode_block([(b":status", b"100")])),  # interim: not relayed
        headers(1, RESPONSE), data(1, b"\0\0\0\0\0"), headers(1, TRAILERS, end_stream=True),
    )  # fmt: skip
    assert [event[0] for event in call.events] == ["headers", "data", "headers"]
    assert call.events[0][1][b":status"] == b"200"
    assert not resets(frames) and goaway_code(frames) is None


def test_a_malformed_response_resets_the_call_with_protocol_error():
    cases = {
        "data before headers": data(1, b"x"),
        "no :status": headers(1, encode_block([(b"content-type", b"application/grpc")])),
        "request pseudo-header": headers(1, encode_block([(b":status", b"200"), (b":path", b"/")])),
        "uppercase name": headers(1, encode_block([(b":status", b"200"), (b"Grpc-Status", b"0")])),
        "pseudo-header in trailers": headers(1, RESPONSE) + headers(1, encode_block([(b":status", b"200")]), True),
        "trailers without END_STREAM": headers(1, RESPONSE) + headers(1, TRAILERS),
        "interim response ending the stream": headers(1, encode_block([(b":status", b"103")]), end_stream=True),
        "content-length larger than the data": headers(1, encode_block([(b":status", b"200"),
                                                                        (b"content-length", b"9")]))
        + data(1, b"x", end_stream=True),
    }  # fmt: skip
    for name, frames_in in cases.items():
        call, frames, _ = exchange(frames_in)
        assert resets(frames) == [(1, f.PROTOCOL_ERROR)], name
        assert call.events[-1] == ("reset", f.PROTOCOL_ERROR), name
        assert goaway_code(frames) is None, name


def test_what_only_a_client_must_refuse_ends_the_connection():
    cases = {
        "a stream the server opened": headers(2, RESPONSE),
        "a response on a stream never opened": headers(3, RESPONSE),
        "PUSH_PROMISE": f.pack_frame(f.PUSH_PROMISE, f.END_HEADERS, 1, b"\x00\x00\x00\x02" + RESPONSE),
        "a server enabling push": f.pack_frame(f.SETTINGS, 0, 0, struct.pack(">HL", f.SETTINGS_ENABLE_PUSH, 1)),
        "GOAWAY raising its last stream id": f.pack_goaway(1, 0) + f.pack_goaway(3, 0),
    }
    for name, frames_in in cases.items():
        _, frames, transport = exchange(frames_in)
        assert goaway_code(frames) == f.PROTOCOL_ERROR, name
        assert transport.is_closed, name


def test_the_server_preface_must_be_settings():
    async def run():
        client = Client()
        transport = MemoryTransport()
        client.connection_made(transport)
        client.data_received(f.pack_frame(f.PING, 0, 0, b"12345678"))
        return frames_of(bytes(transport.written)), transport

    frames, transport = asyncio.run(run())
    assert goaway_code(frames) == f.PROTOCOL_ERROR and transport.is_closed


def test_a_server_that_sends_past_the_window_gets_flow_control_error():
    chunk = b"x" * f.DEFAULT_MAX_FRAME
    overflow = [data(1, chunk) for _ in range(LOCAL_STREAM_WINDOW // len(chunk))] + [data(1, b"x")]
    call, frames, _ = exchange(headers(1, RESPONSE), *overflow)
    assert resets(frames) == [(1, f.FLOW_CONTROL_ERROR)]
    assert call.events[-1] == ("reset", f.FLOW_CONTROL_ERROR)


def test_frames_in_flight_after_the_gateway_reset_a_call_are_ignored():
    async def run():
        client = Client()
        transport = MemoryTransport()
        client.connection_made(transport)
        call = Call(client)
        client.add_stream(call, 1)
        client.send_headers(call, REQUEST, end_stream=True)
        client.data_received(SERVER_PREFACE + headers(1, RESPONSE))
        client.reset_stream(call)  # the client went away: the gateway cancels upstream
        client.data_received(data(1, b"late") + headers(1, TRAILERS, end_stream=True))
        await asyncio.sleep(0)
        return frames_of(bytes(transport.written))

    assert resets(asyncio.run(run())) == [(1, f.CANCEL)]  # the gateway's own reset, nothing more


def test_a_goaway_refuses_the_calls_it_did_not_take():
    call, frames, _ = exchange(f.pack_goaway(0, f.NO_ERROR))
    assert call.events == [("reset", f.REFUSED_STREAM)]
    assert goaway_code(frames) is None  # the gateway opens a new connection for its next call
