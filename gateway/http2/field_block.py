"""A field block arriving in pieces: HEADERS without END_HEADERS, then CONTINUATION frames.

RFC 9113 sections 4.3 and 6.10: the frames of one block are contiguous and on one stream. The
front door caps how many CONTINUATION frames one block may take and how large it may grow
(CVE-2024-27316 and friends: a block that never ends must not grow without bound).
"""

from __future__ import annotations

from gateway.http2 import frames as f
from gateway.http2.errors import ProtocolViolation
from gateway.http2.limits import Http2Limits


class PendingFieldBlock:
    """The block so far; `flags` and `is_self_dependent` are its HEADERS frame's."""

    __slots__ = ("flags", "fragment", "is_self_dependent", "num_continuations", "started_at", "stream_id")

    def __init__(self, stream_id: int, flags: int, fragment: bytes, is_self_dependent: bool, now: float) -> None:
        self.stream_id = stream_id
        self.flags = flags
        self.fragment = bytearray(fragment)
        self.is_self_dependent = is_self_dependent
        self.num_continuations = 0
        self.started_at = now

    def add(self, stream_id: int, payload: bytes, limits: Http2Limits) -> None:
        """One CONTINUATION frame's fragment; raises ProtocolViolation past a rule or a limit."""
        if stream_id != self.stream_id:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "CONTINUATION on another stream than its HEADERS")
        self.num_continuations += 1
        if self.num_continuations > limits.max_continuation_frames:
            raise ProtocolViolation(f.ENHANCE_YOUR_CALM, "too many CONTINUATION frames in one field block")
        self.fragment += payload
        if len(self.fragment) > limits.max_header_block:
            raise ProtocolViolation(f.ENHANCE_YOUR_CALM, "field block far over SETTINGS_MAX_HEADER_LIST_SIZE")
