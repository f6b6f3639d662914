"""HTTP/2 frame layout (RFC 9113 sections 4 and 6): constants, packers, and payload parsers.

The parsers check what a frame's own bytes must satisfy (lengths, padding, setting values) and
raise `ProtocolViolation` with the error code RFC 9113 names; what depends on a stream's state
is the connection's business (gateway/http2/connection.py).
"""

from __future__ import annotations

import struct
from typing import Final

from gateway.http2.errors import ProtocolViolation

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# 24-bit length (split 16 + 8), type, flags, 31-bit stream id.
FRAME_HEADER: Final = struct.Struct(">HBBBL")
FRAME_HEADER_SIZE: Final = 9  # (FRAME_HEADER.size, as a literal the compiled modules inline)
# The same nine bytes packed from three values: the 24-bit length and the type as one 32-bit
# word (`length << 8 | type`), the flags, the stream id. Two fewer values to pack, and no
# splitting of the length, for the one frame packed per relayed message (DATA is type 0).
FRAME_HEADER_WORDS: Final[struct.Struct] = struct.Struct(">LBL")

# Frame types.
DATA: Final = 0x0
HEADERS: Final = 0x1
PRIORITY: Final = 0x2
RST_STREAM: Final = 0x3
SETTINGS: Final = 0x4
PUSH_PROMISE: Final = 0x5
PING: Final = 0x6
GOAWAY: Final = 0x7
WINDOW_UPDATE: Final = 0x8
CONTINUATION: Final = 0x9
FRAME_NAMES: Final = ("DATA", "HEADERS", "PRIORITY", "RST_STREAM", "SETTINGS", "PUSH_PROMISE", "PING", "GOAWAY",
               "WINDOW_UPDATE", "CONTINUATION")  # fmt: skip

# Flags.
END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY_FLAG: Final = 0x20

# Settings identifiers.
SETTINGS_HEADER_TABLE_SIZE: Final = 0x1
SETTINGS_ENABLE_PUSH: Final = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS: Final = 0x3
SETTINGS_INITIAL_WINDOW_SIZE: Final = 0x4
SETTINGS_MAX_FRAME_SIZE: Final = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE: Final = 0x6

# Error codes.
NO_ERROR: Final = 0x0
PROTOCOL_ERROR: Final = 0x1
INTERNAL_ERROR: Final = 0x2
FLOW_CONTROL_ERROR: Final = 0x3
SETTINGS_TIMEOUT: Final = 0x4
STREAM_CLOSED: Final = 0x5
FRAME_SIZE_ERROR: Final = 0x6
REFUSED_STREAM: Final = 0x7
CANCEL: Final = 0x8
COMPRESSION_ERROR: Final = 0x9
ENHANCE_YOUR_CALM: Final = 0xB

DEFAULT_WINDOW: Final = 65_535
DEFAULT_MAX_FRAME: Final = 16_384
MAX_FRAME_LIMIT: Final = 2**24 - 1
MAX_WINDOW: Final = 2**31 - 1
DEFAULT_HEADER_TABLE_SIZE: Final = 4_096

# The fixed payload lengths of RFC 9113 section 6.
PRIORITY_SIZE: Final = 5
RST_STREAM_SIZE: Final = 4
PING_SIZE: Final = 8
WINDOW_UPDATE_SIZE: Final = 4
GOAWAY_MIN_SIZE: Final = 8

_U32: Final = struct.Struct(">L")
_SETTING: Final = struct.Struct(">HL")
_GOAWAY: Final = struct.Struct(">LL")


def pack_frame(frame_type: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return FRAME_HEADER_WORDS.pack(len(payload) << 8 | frame_type, flags, stream_id) + payload


def pack_settings(settings: dict[int, int]) -> bytes:
    return pack_frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(key, value) for key, value in settings.items()))


def pack_window_update(stream_id: int, increment: int) -> bytes:
    return pack_frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def pack_rst_stream(stream_id: int, error_code: int) -> bytes:
    return pack_frame(RST_STREAM, 0, stream_id, _U32.pack(error_code))


def pack_goaway(last_stream_id: int, error_code: int, debug: bytes = b"") -> bytes:
    return pack_frame(GOAWAY, 0, 0, _GOAWAY.pack(last_stream_id, error_code) + debug)


def pack_priority(dependency: int, weight: int = 15, exclusive: bool = False) -> bytes:
    """A PRIORITY payload (also the priority fields of a HEADERS frame)."""
    return _U32.pack(dependency | (0x8000_0000 if exclusive else 0)) + bytes((weight,))


def unpack_u32(payload: bytes, offset: int = 0) -> int:
    """A 31-bit field (stream id, window increment); the reserved high bit is ignored."""
    return _U32.unpack_from(payload, offset)[0] & 0x7FFF_FFFF


def unpack_error_code(payload: bytes, offset: int = 0) -> int:
    return _U32.unpack_from(payload, offset)[0]


def unpack_goaway(payload: bytes) -> tuple[int, int]:
    last_stream_id, error_code = _GOAWAY.unpack_from(payload)
    return last_stream_id & 0x7FFF_FFFF, error_code


def strip_padding(payload: bytes) -> bytes:
    """The content of a PADDED DATA frame: a pad length byte, the content, then that much padding."""
    if not payload:
        raise ProtocolViolation(FRAME_SIZE_ERROR, "PADDED frame without a pad length")
    pad_length = payload[0]
    if pad_length >= len(payload):
        raise ProtocolViolation(PROTOCOL_ERROR, "padding as long as the frame")
    return payload[1 : len(payload) - pad_length]


def split_headers_payload(flags: int, payload: bytes) -> tuple[bytes, int | None]:
    """A HEADERS payload's field block fragment and stream dependency (None without PRIORITY)."""
    start = 0
    end = len(payload)
    pad_length = 0
    mandatory = (1 if flags & PADDED else 0) + (PRIORITY_SIZE if flags & PRIORITY_FLAG else 0)
    if end < mandatory:
        raise ProtocolViolation(FRAME_SIZE_ERROR, "HEADERS frame too short for its PADDED or PRIORITY fields")
    if flags & PADDED:
        pad_length = payload[0]
        start = 1
        if pad_length > end - mandatory:
            raise ProtocolViolation(PROTOCOL_ERROR, "padding longer than the HEADERS payload")
    dependency = None
    if flags & PRIORITY_FLAG:
        dependency = unpack_u32(payload, start)
        start += PRIORITY_SIZE
    return payload[start : end - pad_length], dependency


def parse_settings(payload: bytes, is_client: bool) -> list[tuple[int, int]]:
    """Validated (identifier, value) pairs of a SETTINGS frame (RFC 9113 sections 6.5 and 6.5.2).

    `is_client`: the receiver is the client, so ENABLE_PUSH must be 0 (a server may not push-enable).
    Unknown identifiers are returned too; the receiver ignores them.
    """
    if len(payload) % 6:
        raise ProtocolViolation(FRAME_SIZE_ERROR, "SETTINGS length is not a multiple of 6")
    settings = list(_SETTING.iter_unpack(payload))
    for key, value in settings:
        if key == SETTINGS_ENABLE_PUSH:
            if value > 1 or (is_client and value != 0):
                raise ProtocolViolation(PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value}")
        elif key == SETTINGS_INITIAL_WINDOW_SIZE:
            if value > MAX_WINDOW:
                raise ProtocolViolation(FLOW_CONTROL_ERROR, f"SETTINGS_INITIAL_WINDOW_SIZE {value} above 2^31-1")
        elif key == SETTINGS_MAX_FRAME_SIZE and not DEFAULT_MAX_FRAME <= value <= MAX_FRAME_LIMIT:
            raise ProtocolViolation(PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value} outside 2^14..2^24-1")
    return settings
