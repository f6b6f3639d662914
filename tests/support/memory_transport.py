"""The suite's one in-memory asyncio transport for the HTTP/2 layer's tests (units, client role,
the fuzz target): it records what a connection writes and, wired to a peer, hands every write to
the peer's `data_received` on the next loop iteration, as a socket would."""

from __future__ import annotations

import asyncio
from typing import Any


class MemoryTransport:
    """`written`: every byte written; `writes_after_close` counts writes that came after `close`
    (a connection must not write then). `peer` (with `loop`): the protocol the bytes are for."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None, peer: Any = None) -> None:
        self.loop = loop
        self.peer = peer
        self.written = bytearray()
        self.writes_after_close = 0
        self.is_closed = False

    def write(self, data: bytes) -> None:
        if self.is_closed:
            self.writes_after_close += 1
        self.written += data
        if self.peer is not None:
            assert self.loop is not None, "a wired transport needs the loop that delivers its bytes"
            self.loop.call_soon(self.peer.data_received, bytes(data))

    def close(self) -> None:
        self.is_closed = True

    def is_closing(self) -> bool:
        return self.is_closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def get_write_buffer_size(self) -> int:
        return 0
