"""A raw HTTP/2 client for the wire tests and the e2e fuzz workload: it sends exactly the frames a
caller builds, and reads the gateway's answers frame by frame, so a caller can expect one reaction
(GOAWAY with a code, RST_STREAM with a code, a response, a ping ack) the way h2spec does.

Frame builders take the raw fields, so tests can break any rule: lengths, flags, stream ids,
padding, header blocks (encoded without a dynamic table, as the gateway encodes its own).
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field

from hpack import Decoder

from dpgate.v1 import generate_pb2
from gateway.grpc_wire import frame_message
from gateway.http2 import frames as f
from gateway.http2.header_codec import encode_block

GENERATE = b"/dpgate.v1.InferenceService/Generate"
GENERATE_STREAM = b"/dpgate.v1.InferenceService/GenerateStream"


def stopping(max_tokens: int) -> generate_pb2.StoppingCriteria:
    return generate_pb2.StoppingCriteria(max_tokens=max_tokens, ignore_eos=True)


GENERATE_BODY = frame_message(generate_pb2.GenerateRequest(text="hi", stopping=stopping(2)).SerializeToString())
# A stream that goes on for as long as a test needs (the client opens no window for it).
ENDLESS_BODY = frame_message(
    generate_pb2.GenerateStreamRequest(text="hi", stopping=stopping(10**7)).SerializeToString()
)


def request_fields(path: bytes = GENERATE, extra: tuple[tuple[bytes, bytes], ...] = ()) -> list[tuple[bytes, bytes]]:
    return [
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", path), (b":authority", b"gateway"),
        (b"content-type", b"application/grpc"), (b"te", b"trailers"), *extra,
    ]  # fmt: skip


def generate_body_of_length(length: int) -> bytes:
    """A framed GenerateRequest exactly `length` bytes long (the prompt pads it)."""
    text = "x" * (length - 16)
    while True:
        body = frame_message(generate_pb2.GenerateRequest(text=text, stopping=stopping(2)).SerializeToString())
        if len(body) == length:
            return body
        text = text[: len(text) - (len(body) - length)] if len(body) > length else text + "x"


def padded(content: bytes, pad_length: int) -> bytes:
    return bytes((pad_length,)) + content + b"\0" * pad_length


def headers(
    stream_id: int,
    fields: list[tuple[bytes, bytes]] | None = None,
    *,
    end_stream: bool = False,
    end_headers: bool = True,
    block: bytes | None = None,
    flags: int = 0,
) -> bytes:
    """A HEADERS frame; `block` (raw HPACK) wins over `fields` (default: a Generate request)."""
    if block is None:
        block = encode_block(request_fields() if fields is None else fields)
    flags |= (f.END_STREAM if end_stream else 0) | (f.END_HEADERS if end_headers else 0)
    return f.pack_frame(f.HEADERS, flags, stream_id, block)


def data(stream_id: int, payload: bytes = GENERATE_BODY, *, end_stream: bool = True, flags: int = 0) -> bytes:
    return f.pack_frame(f.DATA, flags | (f.END_STREAM if end_stream else 0), stream_id, payload)


def call(stream_id: int, path: bytes = GENERATE, body: bytes = GENERATE_BODY) -> bytes:
    """A whole unary gRPC request."""
    return headers(stream_id, request_fields(path)) + data(stream_id, body)


def endless_call(stream_id: int) -> bytes:
    """A GenerateStream the engine keeps serving: the stream stays half-closed (remote)."""
    return headers(stream_id, request_fields(GENERATE_STREAM)) + data(stream_id, ENDLESS_BODY)


def settings(*pairs: tuple[int, int], ack: bool = False, stream_id: int = 0) -> bytes:
    """A SETTINGS frame from (identifier, value) pairs, repeats kept in order."""
    payload = b"".join(struct.pack(">HL", key, value) for key, value in pairs)
    return f.pack_frame(f.SETTINGS, f.ACK if ack else 0, stream_id, payload)


def ping(payload: bytes = b"h2spec!!", *, ack: bool = False, stream_id: int = 0) -> bytes:
    return f.pack_frame(f.PING, f.ACK if ack else 0, stream_id, payload)


def window_update(stream_id: int, increment: int) -> bytes:
    return f.pack_window_update(stream_id, increment)


def rst_stream(stream_id: int, error_code: int = f.CANCEL) -> bytes:
    return f.pack_rst_stream(stream_id, error_code)


def priority(stream_id: int, dependency: int = 0, weight: int = 15, exclusive: bool = False) -> bytes:
    return f.pack_frame(f.PRIORITY, 0, stream_id, f.pack_priority(dependency, weight, exclusive))


@dataclass(slots=True)
class Frame:
    type: int
    flags: int
    stream_id: int
    payload: bytes
    headers: list[tuple[bytes, bytes]] | None = None  # decoded, for HEADERS ending a block


@dataclass(slots=True)
class Seen:
    """Everything the gateway sent while a test waited; `closed` when it closed the connection."""

    frames: list[Frame] = field(default_factory=list)
    closed: bool = False

    def of_type(self, frame_type: int) -> list[Frame]:
        return [frame for frame in self.frames if frame.type == frame_type]


class H2Client:
    """One raw connection to the gateway. `handshake` sends the preface and SETTINGS."""

    def __init__(self, port: int, timeout: float = 5.0, host: str = "127.0.0.1", source: str | None = None) -> None:
        # `source`: the local address to connect from (127.0.0.2 is another peer to a gateway on loopback).
        source_address = (source, 0) if source is not None else None
        self.sock = socket.create_connection((host, port), timeout=timeout, source_address=source_address)
        self.buffer = b""
        self.decoder = Decoder()
        self.server_settings: dict[int, int] = {}
        self.is_closed = False
        self._block = b""

    def handshake(self, *pairs: tuple[int, int]) -> None:
        self.send(f.PREFACE + settings(*pairs))

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            self.is_closed = True

    def read_frame(self, deadline: float) -> Frame | None:
        """The next frame, or None once the gateway closed the connection; raises on timeout."""
        while True:
            if len(self.buffer) >= 9:
                high, low, frame_type, flags, stream_id = f.FRAME_HEADER.unpack_from(self.buffer)
                length = (high << 8) | low
                if len(self.buffer) >= 9 + length:
                    payload = self.buffer[9 : 9 + length]
                    self.buffer = self.buffer[9 + length :]
                    return self._take(Frame(frame_type, flags, stream_id & 0x7FFF_FFFF, payload))
            if self.is_closed:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the gateway sent nothing more in time")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                raise TimeoutError("the gateway sent nothing more in time") from None
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.is_closed = True
            self.buffer += chunk

    def _take(self, frame: Frame) -> Frame:
        if frame.type == f.SETTINGS and not frame.flags & f.ACK:
            for offset in range(0, len(frame.payload) - 5, 6):
                key, value = struct.unpack_from(">HL", frame.payload, offset)
                self.server_settings[key] = value
        if frame.type in (f.HEADERS, f.CONTINUATION):
            self._block += frame.payload  # the gateway pads nothing and sends no priority
            if frame.flags & f.END_HEADERS:
                frame.headers = self.decoder.decode(self._block, raw=True)
                self._block = b""
        return frame

    def read_until(self, done, timeout: float = 5.0) -> Seen:
        """Frames until `done(frame)` is true (that frame included) or the connection closes."""
        seen = Seen()
        deadline = time.monotonic() + timeout
        while True:
            frame = self.read_frame(deadline)
            if frame is None:
                seen.closed = True
                return seen
            seen.frames.append(frame)
            if done(frame):
                return seen

    def close(self) -> None:
        self.sock.close()


def grpc_status(frame: Frame) -> bytes | None:
    return dict(frame.headers or []).get(b"grpc-status")
