"""gRPC over HTTP/2 as the relay sees it: headers, timeouts, status trailers, message framing.

The protocol is https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md. The gateway
reads only what routing and accounting need: the path, the metadata it acts on, the deadline,
the 5-byte prefix of each message (to count messages, enforce the size limit and tell a token
from prompt information), and the final status.
"""

from __future__ import annotations

import struct
import urllib.parse

import grpc

from gateway.http2 import frames as f
from gateway.http2.connection import Headers
from gateway.http2.header_codec import encode_block, encode_literal

CODE_BY_VALUE: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}

_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
_MESSAGE_PREFIX = struct.Struct(">BL")
MESSAGE_PREFIX_SIZE = 5

RESPONSE_HEADERS = encode_block(((b":status", b"200"), (b"content-type", b"application/grpc")))


def parse_timeout(value: bytes) -> float | None:
    """Seconds in a `grpc-timeout` value (at most 8 digits and a unit); None if malformed."""
    digits, unit = value[:-1], value[-1:]
    scale = _TIMEOUT_UNITS.get(unit)
    if scale is None or not digits.isdigit() or len(digits) > 8:
        return None
    return int(digits) * scale


def format_timeout(seconds: float) -> bytes:
    """A `grpc-timeout` value for `seconds`, in the finest unit that fits 8 digits."""
    micros = max(1, int(seconds * 1e6))
    if micros < 100_000_000:
        return b"%du" % micros
    millis = micros // 1000
    if millis < 100_000_000:
        return b"%dm" % millis
    return b"%dS" % min(99_999_999, millis // 1000)


def encode_message(text: str) -> bytes:
    """`grpc-message` is percent-encoded UTF-8 (printable ASCII except `%` goes as is)."""
    return urllib.parse.quote(text, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode("ascii")


def decode_message(value: bytes) -> str:
    return urllib.parse.unquote(value.decode("ascii", "replace"))


def status_trailers(code: grpc.StatusCode, message: str = "", extra: bytes = b"") -> bytes:
    """The header block ending a call: grpc-status, grpc-message when set, and `extra` fields."""
    block = encode_literal(b"grpc-status", str(code.value[0]).encode())
    if message:
        block += encode_literal(b"grpc-message", encode_message(message))
    return block + extra


def reset_status(error_code: int | None) -> tuple[grpc.StatusCode, str]:
    """What an upstream stream reset means, as gRPC clients map RST_STREAM codes."""
    if error_code is None:
        return grpc.StatusCode.UNAVAILABLE, "connection to the engine was lost"
    if error_code == f.REFUSED_STREAM:
        return grpc.StatusCode.UNAVAILABLE, "the engine refused the stream"
    if error_code == f.CANCEL:
        return grpc.StatusCode.CANCELLED, "the engine cancelled the call"
    if error_code == f.ENHANCE_YOUR_CALM:
        return grpc.StatusCode.RESOURCE_EXHAUSTED, "the engine asked the gateway to slow down"
    return grpc.StatusCode.INTERNAL, f"the engine reset the stream (HTTP/2 error {error_code})"


def trailer_status(headers: Headers) -> tuple[grpc.StatusCode, str]:
    code = grpc.StatusCode.UNKNOWN
    message = ""
    for name, value in headers:
        if name == b"grpc-status":
            code = CODE_BY_VALUE.get(int(value) if value.isdigit() else -1, grpc.StatusCode.UNKNOWN)
        elif name == b"grpc-message":
            message = decode_message(value)
    return code, message


def frame_message(payload: bytes) -> bytes:
    return _MESSAGE_PREFIX.pack(0, len(payload)) + payload


def unframe_single_message(body: bytes) -> tuple[int, int] | None:
    """(compressed flag, length) when `body` is exactly one length-prefixed message, else None."""
    if len(body) < MESSAGE_PREFIX_SIZE:
        return None
    flag, length = _MESSAGE_PREFIX.unpack_from(body)
    if MESSAGE_PREFIX_SIZE + length != len(body):
        return None
    return flag, length


class MessageScanner:
    """Follows message boundaries through a byte stream cut anywhere into DATA frames.

    `feed` returns how many messages completed in the chunk. Along the way it notes the largest
    declared message length (`max_length`, for the size limit) and whether an uncompressed
    message began with `watch_byte` (`watch_seen`: for streams, the tag of a token delta).
    """

    __slots__ = ("_check_first_byte", "_header", "_remaining", "max_length", "watch_byte", "watch_seen")

    def __init__(self, watch_byte: int = -1) -> None:
        self._header = b""
        self._remaining = 0  # payload bytes of the current message not yet seen
        self.max_length = 0
        self.watch_byte = watch_byte
        self.watch_seen = False
        self._check_first_byte = False

    def feed(self, data: bytes) -> int:
        completed = 0
        position = 0
        size = len(data)
        while position < size:
            if self._remaining:
                if self._check_first_byte:
                    self._check_first_byte = False
                    self.watch_seen = data[position] == self.watch_byte
                take = min(self._remaining, size - position)
                self._remaining -= take
                position += take
                if not self._remaining:
                    completed += 1
                continue
            need = MESSAGE_PREFIX_SIZE - len(self._header)
            header = self._header + data[position : position + need]
            position += len(header) - len(self._header)
            if len(header) < MESSAGE_PREFIX_SIZE:
                self._header = header
                break
            self._header = b""
            flag, length = _MESSAGE_PREFIX.unpack(header)
            if length > self.max_length:
                self.max_length = length
            self._check_first_byte = flag == 0 and not self.watch_seen and self.watch_byte >= 0
            if length == 0:
                completed += 1
            self._remaining = length
        return completed
