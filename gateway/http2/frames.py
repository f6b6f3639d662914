"""HTTP/2 frame layout (RFC 9113 section 4 and 6): the constants and packers the relay uses."""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# 24-bit length (split 16 + 8), type, flags, 31-bit stream id.
FRAME_HEADER = struct.Struct(">HBBBL")
FRAME_HEADER_SIZE = FRAME_HEADER.size

# Frame types.
DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

# Flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Settings identifiers.
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

# Error codes.
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = 2**31 - 1

_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")
_GOAWAY = struct.Struct(">LL")


def pack_frame(frame_type: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return FRAME_HEADER.pack(length >> 8, length & 0xFF, frame_type, flags, stream_id) + payload


def pack_settings(settings: dict[int, int]) -> bytes:
    return pack_frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(key, value) for key, value in settings.items()))


def unpack_settings(payload: bytes) -> list[tuple[int, int]]:
    return [_SETTING.unpack_from(payload, offset) for offset in range(0, len(payload) - 5, 6)]


def pack_window_update(stream_id: int, increment: int) -> bytes:
    return pack_frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def pack_rst_stream(stream_id: int, error_code: int) -> bytes:
    return pack_frame(RST_STREAM, 0, stream_id, _U32.pack(error_code))


def pack_goaway(last_stream_id: int, error_code: int, debug: bytes = b"") -> bytes:
    return pack_frame(GOAWAY, 0, 0, _GOAWAY.pack(last_stream_id, error_code) + debug)


def unpack_u32(payload: bytes, offset: int = 0) -> int:
    return _U32.unpack_from(payload, offset)[0] & 0x7FFF_FFFF


def unpack_goaway(payload: bytes) -> tuple[int, int]:
    last_stream_id, error_code = _GOAWAY.unpack_from(payload)
    return last_stream_id & 0x7FFF_FFFF, error_code
