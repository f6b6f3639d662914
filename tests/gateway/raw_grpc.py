"""A gRPC call made by hand over a raw HTTP/2 socket, for what gRPC libraries never send.

Compression flags that lie, corrupt compressed bodies, unknown encodings, an RST_STREAM in the
middle of a stream: `RawCall` sends exactly the bytes a test gives it and reads the answer
frame by frame. It uses the `hpack` package and its own frame packing, nothing of the gateway.
"""

from __future__ import annotations

import socket
import struct
import time
import urllib.parse
from dataclasses import dataclass, field

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
CANCEL = 0x8
_FRAME = struct.Struct(">HBBBL")


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return _FRAME.pack(len(payload) >> 8, len(payload) & 0xFF, kind, flags, stream_id) + payload


def message(payload: bytes, flag: int = 0) -> bytes:
    """One length-prefixed gRPC message."""
    return struct.pack(">BL", flag, len(payload)) + payload


@dataclass
class Answer:
    """What came back on the call's stream."""

    headers: dict[str, str] = field(default_factory=dict)
    data: bytes = b""
    trailers: dict[str, str] = field(default_factory=dict)
    reset: int | None = None  # RST_STREAM error code, if the stream was reset

    @property
    def status(self) -> int | None:
        fields = self.trailers or self.headers
        return int(fields["grpc-status"]) if "grpc-status" in fields else None

    @property
    def message(self) -> str:
        return urllib.parse.unquote((self.trailers or self.headers).get("grpc-message", ""))


class RawCall:
    """One connection carrying one call on stream 1."""

    def __init__(
        self, port: int, path: str, extra_headers: tuple[tuple[str, str], ...] = (), source_host: str | None = None
    ) -> None:
        source = (source_host, 0) if source_host is not None else None  # another loopback address: another peer
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=source)
        self._buffer = b""
        self._decoder = hpack.Decoder()
        self.answer = Answer()
        self._in_headers = True
        self._ended = False  # the connection closed or said GOAWAY
        headers = [
            (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", f"127.0.0.1:{port}"),
            ("content-type", "application/grpc"), ("te", "trailers"), *extra_headers,
        ]  # fmt: skip
        block = hpack.Encoder().encode(headers)
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1, block))

    def send(self, body: bytes, end_stream: bool = True) -> None:
        self.sock.sendall(frame(DATA, END_STREAM if end_stream else 0, 1, body))

    def reset(self) -> None:
        self.sock.sendall(frame(RST_STREAM, 0, 1, struct.pack(">L", CANCEL)))

    def close(self) -> None:
        self.sock.close()

    def read_until(self, done, timeout: float = 10) -> Answer:
        """Read frames until `done(answer)` holds or the stream ended; returns the answer so far."""
        deadline = time.monotonic() + timeout
        while not done(self.answer):
            if self._stream_ended():
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer within {timeout}s: {self.answer}")
            self._read_frame()
        return self.answer

    def finish(self, timeout: float = 10) -> Answer:
        """Read until the stream ends (trailers or a reset)."""
        answer = self.read_until(lambda _: False, timeout)
        self.close()
        return answer

    def _stream_ended(self) -> bool:
        return bool(self.answer.trailers) or self.answer.reset is not None or self._ended

    def _read_frame(self) -> None:
        header = self._read(9)
        length = (header[0] << 16) | (header[1] << 8) | header[2]
        kind, flags, stream_id = header[3], header[4], struct.unpack(">L", header[5:9])[0] & 0x7FFFFFFF
        payload = self._read(length)
        if kind == SETTINGS and not flags & ACK:
            self.sock.sendall(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            self.sock.sendall(frame(PING, ACK, 0, payload))
        elif kind == GOAWAY:
            self._ended = True
        elif stream_id == 1 and kind == HEADERS:
            decoded = {name: value for name, value in self._decoder.decode(payload)}
            if self._in_headers and ":status" in decoded and not flags & END_STREAM:
                self.answer.headers = decoded
                self._in_headers = False
            elif self._in_headers:  # trailers-only
                self.answer.headers = decoded
                self.answer.trailers = decoded
            else:
                self.answer.trailers = decoded
        elif stream_id == 1 and kind == DATA:
            self.answer.data += payload
        elif stream_id == 1 and kind == RST_STREAM:
            self.answer.reset = struct.unpack(">L", payload)[0]

    def _read(self, size: int) -> bytes:
        while len(self._buffer) < size:
            chunk = self.sock.recv(65536)
            if not chunk:
                self._ended = True
                raise ConnectionError("the connection closed")
            self._buffer += chunk
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data
