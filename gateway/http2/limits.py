"""What one side of an HTTP/2 connection allows its peer: settings it advertises and guards.

The front door builds one `Http2Limits` from the gateway's flags for every client connection;
connections to engines use `ENGINE_LIMITS` (the engines are the gateway's own, so their limits
only guard against bugs). `ResetBudget` is the rapid-reset guard (CVE-2023-44487), a pure
token bucket with the clock passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from gateway.http2 import frames as f


@dataclass(slots=True, frozen=True)
class Http2Limits:
    """Limits on what the peer may send. Sizes are bytes; None means no limit.

    `max_concurrent_streams` is advertised as SETTINGS_MAX_CONCURRENT_STREAMS; streams past it are
    refused (RST_STREAM REFUSED_STREAM). `max_header_list_size` is advertised as
    SETTINGS_MAX_HEADER_LIST_SIZE; a request over it is answered as too large, and a field block
    over twice that (or a compressed block that long) ends the connection, since decoding it would
    cost what the limit is meant to save. `header_table_size` is advertised as
    SETTINGS_HEADER_TABLE_SIZE and caps the peer's HPACK dynamic table. `max_continuation_frames`
    caps the CONTINUATION frames of one field block. `max_resets_per_second` is the rapid-reset
    guard: streams the peer resets within a second of opening them while the gateway still works
    on them, or makes the gateway reset or refuse by breaking the protocol, drain a bucket of that
    many tokens refilled at that rate; an empty bucket ends the connection with GOAWAY
    ENHANCE_YOUR_CALM.
    """

    max_concurrent_streams: int | None = None
    max_header_list_size: int = 1 << 20
    header_table_size: int = f.DEFAULT_HEADER_TABLE_SIZE
    max_continuation_frames: int = 64
    max_resets_per_second: int | None = None

    @property
    def max_header_block(self) -> int:
        """The hard cap on one field block, compressed or decoded (past it: connection error)."""
        return 2 * self.max_header_list_size + f.DEFAULT_MAX_FRAME

    def settings(self) -> dict[int, int]:
        """The SETTINGS entries these limits advertise (besides window and frame size)."""
        settings = {f.SETTINGS_MAX_HEADER_LIST_SIZE: self.max_header_list_size}
        if self.max_concurrent_streams is not None:
            settings[f.SETTINGS_MAX_CONCURRENT_STREAMS] = self.max_concurrent_streams
        if self.header_table_size != f.DEFAULT_HEADER_TABLE_SIZE:
            settings[f.SETTINGS_HEADER_TABLE_SIZE] = self.header_table_size
        return settings


ENGINE_LIMITS: Final = Http2Limits()


class ResetBudget:
    """A token bucket: `capacity` tokens, refilled at `capacity` per second, one spent per reset."""

    __slots__ = ("_capacity", "_last", "_tokens")

    def __init__(self, capacity: int, now: float) -> None:
        self._capacity = float(capacity)
        self._tokens = float(capacity)
        self._last = now

    def spend(self, now: float) -> bool:
        """Spend one token; False when none is left (the peer resets faster than allowed)."""
        tokens = min(self._capacity, self._tokens + (now - self._last) * self._capacity)
        self._last = now
        if tokens < 1.0:
            self._tokens = tokens
            return False
        self._tokens = tokens - 1.0
        return True
