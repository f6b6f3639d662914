"""What state a stream id is in when the stream table has no stream for it (RFC 9113 section 5.1).

A stream the connection still tracks is open or half-closed; any other id is either idle
(never used by the side that opens it) or closed. Closed ids split further: an id the peer
skipped is closed without ever having opened (a HEADERS on it is a connection error), and an
id this side reset may still see frames the peer sent before it learned (they are ignored).
Both are remembered within bounds, so a peer cannot grow them: an id that fell out of memory
is treated as an ordinary closed one. Pure bookkeeping, no I/O.
"""

from __future__ import annotations

from collections import deque
from typing import Final

_NUM_REMEMBERED_RESETS: Final = 256
_NUM_REMEMBERED_GAPS: Final = 16


class StreamIds:
    """Stream ids of one connection. `is_client`: this side opens odd ids and the peer even ones."""

    __slots__ = ("_reset_by_us", "_skipped", "last_local_stream_id", "last_peer_stream_id", "peer_parity")

    def __init__(self, is_client: bool) -> None:
        self.peer_parity = 0 if is_client else 1
        self.last_peer_stream_id = 0
        self.last_local_stream_id = 0
        self._skipped: deque[tuple[int, int]] = deque(maxlen=_NUM_REMEMBERED_GAPS)
        self._reset_by_us: dict[int, None] = {}  # insertion-ordered: the oldest is forgotten first

    def is_peer_initiated(self, stream_id: int) -> bool:
        return stream_id & 1 == self.peer_parity

    def is_idle(self, stream_id: int) -> bool:
        if stream_id & 1 == self.peer_parity:
            return stream_id > self.last_peer_stream_id
        return stream_id > self.last_local_stream_id

    def opened_by_peer(self, stream_id: int) -> None:
        """The peer opened `stream_id` (greater than any it used); the ids it skipped are closed."""
        expected = self.last_peer_stream_id + 2 if self.last_peer_stream_id else 2 - self.peer_parity
        if stream_id > expected:
            self._skipped.append((expected, stream_id - 2))
        self.last_peer_stream_id = stream_id

    def opened_locally(self, stream_id: int) -> None:
        if stream_id & 1 != self.peer_parity and stream_id > self.last_local_stream_id:
            self.last_local_stream_id = stream_id

    def was_skipped(self, stream_id: int) -> bool:
        """A peer id below one it used, which it never opened (implicitly closed)."""
        return any(low <= stream_id <= high for low, high in self._skipped)

    def reset_by_us(self, stream_id: int) -> None:
        reset = self._reset_by_us
        reset[stream_id] = None
        if len(reset) > _NUM_REMEMBERED_RESETS:
            del reset[next(iter(reset))]

    def was_reset_by_us(self, stream_id: int) -> bool:
        return stream_id in self._reset_by_us
