"""gRPC over HTTP/2 as the relay sees it: headers, timeouts, status trailers, message framing.

The protocol is https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md. The gateway
reads only what routing and accounting need: the path, the metadata it acts on, the deadline,
the 5-byte prefix of each message (to count messages, enforce the size limit and tell a token
from prompt information), and the final status.
"""

from __future__ import annotations

import struct
import urllib.parse
import zlib
from dataclasses import dataclass
from typing import Final

import grpc

from gateway.http2 import frames as f
from gateway.http2.connection import Headers
from gateway.http2.header_codec import encode_block, encode_literal

CODE_BY_VALUE: Final[dict[int, grpc.StatusCode]] = {code.value[0]: code for code in grpc.StatusCode}

_TIMEOUT_UNITS: Final = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
_MESSAGE_PREFIX: Final = struct.Struct(">BL")
MESSAGE_PREFIX_SIZE: Final = 5

RESPONSE_HEADERS: Final = encode_block(((b":status", b"200"), (b"content-type", b"application/grpc")))


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
    text = value.decode("ascii", "replace")
    return urllib.parse.unquote(text) if "%" in text else text  # (an engine's OK sends it empty)


# Each code's `grpc-status` field, encoded once: every call ends with one. Keyed by the member's
# `_name_` (Enum's plain attribute for it): hashing an Enum member calls Enum.__hash__, in Python.
_STATUS_FIELDS: Final = {
    code._name_: encode_literal(b"grpc-status", str(code.value[0]).encode()) for code in grpc.StatusCode
}


def status_trailers(code: grpc.StatusCode, message: str = "", extra: bytes = b"") -> bytes:
    """The header block ending a call: grpc-status, grpc-message when set, and `extra` fields."""
    block = _STATUS_FIELDS[code._name_]
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


# Response fields the relay never copies from an engine: pseudo-headers and `grpc-*` fields are
# the protocol's (the gateway writes its own status; grpc-status-details-bin is handled apart),
# connection-specific fields belong to one hop, and the serving rank and the call's x-request-id
# are written by the gateway (the engine echoes the id too: relaying it would send it twice).
_NOT_RELAYED: Final = frozenset(
    {
        b"content-type",
        b"content-length",
        b"te",
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"transfer-encoding",
        b"upgrade",
        b"x-data-parallel-rank",
        b"x-request-id",
    }
)


def relayed_metadata(headers: Headers) -> bytes:
    """The custom metadata in an engine's response headers or trailers, encoded for the client."""
    block = b""
    for name, value in headers:
        if name[:1] != b":" and not name.startswith(b"grpc-") and name not in _NOT_RELAYED:
            block += encode_literal(name, value)
    return block


@dataclass(slots=True)
class ResponseStatus:
    """An engine's trailers as the relay needs them.

    `code` is None when there is no readable grpc-status (a broken response); an unknown number
    is UNKNOWN, as gRPC clients read it. `details_field` is the encoded grpc-status-details-bin
    field (b"" when absent) and `metadata` the encoded custom trailing metadata.
    """

    code: grpc.StatusCode | None
    message: str
    details_field: bytes
    metadata: bytes

    @classmethod
    def read(cls, headers: Headers) -> ResponseStatus:
        code: grpc.StatusCode | None = None
        message = ""
        details_field = b""
        for name, value in headers:
            if name == b"grpc-status":
                code = CODE_BY_VALUE.get(int(value), grpc.StatusCode.UNKNOWN) if value.isdigit() else None
            elif name == b"grpc-message":
                message = decode_message(value)
            elif name == b"grpc-status-details-bin":
                details_field = encode_literal(name, value)
        return cls(code, message, details_field, relayed_metadata(headers))


# grpc-encoding values gRPC implements -> zlib's wbits for them (None: not compressed). gRPC's
# "deflate" is the zlib format (RFC 1950), "gzip" the gzip one (RFC 1952).
INFLATE_WBITS: Final[dict[bytes, int | None]] = {b"identity": None, b"deflate": 15, b"gzip": 31}


def inflate(payload: bytes, encoding: bytes, limit: int) -> bytes | None:
    """`payload` uncompressed, or None when it is not one whole, valid stream of `encoding`.

    At most `limit + 1` bytes are produced, so a result longer than `limit` means "too large"
    (and a small bomb costs no more memory than the limit).
    """
    wbits = INFLATE_WBITS[encoding]
    assert wbits is not None
    inflater = zlib.decompressobj(wbits)
    try:
        inflated = inflater.decompress(payload, limit + 1)
    except zlib.error:
        return None
    if len(inflated) > limit:
        return inflated
    if not inflater.eof or inflater.unused_data:
        return None
    return inflated


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


@dataclass(slots=True, frozen=True)
class Refusal:
    """Why the gateway answers a call itself, before any engine sees it."""

    code: grpc.StatusCode
    message: str


def read_request(body: bytes, rpc: str, request_type: str, encoding: bytes | None, limit: int) -> bytes | Refusal:
    """The one request message of a call (uncompressed), or why the gateway refuses the body.

    `body` is every request DATA byte, `encoding` the call's grpc-encoding, `limit` the largest
    message in bytes. Besides framing and size, this refuses what an engine would answer with
    INTERNAL whatever its health (gRPC's own errors for compression), which the circuit breaker
    would have to count against the engine: an encoding gRPC does not implement, a compressed
    flag with no encoding, and compressed data that is not one whole valid stream.
    """
    framed = unframe_single_message(body)
    if framed is None:
        return Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"{rpc} takes exactly one {request_type} message")
    flag, length = framed
    if length > limit:
        return _too_large(length, limit)
    if encoding is not None and encoding not in INFLATE_WBITS:
        name = encoding.decode("ascii", "replace")
        return Refusal(
            grpc.StatusCode.UNIMPLEMENTED, f"grpc-encoding {name!r} is not supported; use identity, deflate or gzip"
        )
    payload = body[MESSAGE_PREFIX_SIZE:]
    if flag == 0:
        return payload
    if flag != 1 or encoding is None or INFLATE_WBITS[encoding] is None:
        reason = "an unknown compressed flag" if flag != 1 else "the compressed flag but no grpc-encoding"
        return Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"request message has {reason}")
    inflated = inflate(payload, encoding, limit)
    if inflated is None:
        message = f"request body is not a valid {encoding.decode()}-compressed {request_type} message"
        return Refusal(grpc.StatusCode.INVALID_ARGUMENT, message)
    if len(inflated) > limit:
        return _too_large(len(inflated), limit, " (or more, uncompressed)")
    return inflated


def _too_large(length: int, limit: int, what: str = "") -> Refusal:
    message = f"request message of {length}{what} bytes is larger than the gateway's limit of {limit} bytes"
    return Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, message)


class MessageScanner:
    """Follows message boundaries through a byte stream cut anywhere into DATA frames.

    `feed` returns how many messages completed in the chunk. Along the way it notes the largest
    declared message length (`max_length`, for the size limit) and whether a message began with
    `watch_byte` (`watch_seen`: for streams, the tag of a token delta). For a compressed message
    (the response's `encoding`, gzip or deflate) only as much is inflated as it takes to see
    that first byte; the rest is never uncompressed.
    """

    __slots__ = (
        "_check_first_byte",
        "_header",
        "_inflater",
        "_remaining",
        "encoding",
        "max_length",
        "watch_byte",
        "watch_seen",
    )  # fmt: skip

    def __init__(self, watch_byte: int = -1) -> None:
        self._header = b""
        self._remaining = 0  # payload bytes of the current message not yet seen
        self.max_length = 0
        self.watch_byte = watch_byte
        self.watch_seen = False
        self.encoding: bytes | None = None  # the response's grpc-encoding, once its headers came
        self._check_first_byte = False
        self._inflater: zlib._Decompress | None = None  # inflating a compressed message's start

    def feed(self, data: bytes) -> int:
        # Most DATA frames carry exactly one whole message: once there is no first byte to
        # watch, its prefix is all there is to read.
        if not self._remaining and not self._header and (self.watch_seen or self.watch_byte < 0):
            size = len(data)
            if size >= MESSAGE_PREFIX_SIZE:
                length = _MESSAGE_PREFIX.unpack_from(data)[1]
                if length + MESSAGE_PREFIX_SIZE == size:
                    if length > self.max_length:
                        self.max_length = length
                    return 1
        completed = 0
        position = 0
        size = len(data)
        while position < size:
            if self._remaining:
                take = min(self._remaining, size - position)
                if self._check_first_byte:
                    self._check_first_byte = False
                    self.watch_seen = data[position] == self.watch_byte
                elif self._inflater is not None:
                    self._inflate_first_byte(data[position : position + take])
                self._remaining -= take
                position += take
                if not self._remaining:
                    completed += 1
                    self._inflater = None
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
            is_watching = not self.watch_seen and self.watch_byte >= 0
            self._check_first_byte = is_watching and flag == 0
            wbits = INFLATE_WBITS.get(self.encoding) if is_watching and flag == 1 and self.encoding else None
            self._inflater = zlib.decompressobj(wbits) if wbits is not None else None
            if length == 0:
                completed += 1
                self._inflater = None
            self._remaining = length
        return completed

    def _inflate_first_byte(self, chunk: bytes) -> None:
        assert self._inflater is not None
        try:
            first = self._inflater.decompress(chunk, 1)
        except zlib.error:  # not ours to judge: the client's library will say what is wrong
            self._inflater = None
            return
        if first:
            self._inflater = None
            self.watch_seen = first[0] == self.watch_byte
