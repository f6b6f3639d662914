"""The sending half of an HTTP/2 connection: streams, write coalescing, flow-controlled output.

`Http2Sender` owns what both directions share: the stream table, the peer's windows and frame
size, and the output queue. Everything queued in one loop iteration leaves in one write, so a
response's HEADERS, DATA and trailers usually leave in one system call. DATA waits in a
stream's queue while the peer's window is closed (RFC 9113 section 5.2), and HEADERS queued
behind it (trailers) wait their turn. `Http2Connection` (connection.py) adds receiving.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import ClassVar, Final

from mypy_extensions import mypyc_attr

from gateway.http2 import frames as f
from gateway.http2.stream import Stream
from gateway.http2.stream_ids import StreamIds

_FRAME_HEADER_PACK: Final = f.FRAME_HEADER_WORDS.pack

DYNAMIC_TABLE_SIZE_ZERO: Final = b"\x20"  # HPACK "dynamic table size update" to 0 (RFC 7541 section 6.3)


# Http2Connection, its compiled subclass, is subclassed in Python too (gateway/compiled.py).
@mypyc_attr(allow_interpreted_subclasses=True)
class Http2Sender:
    """Streams and output of one connection (see the module docstring). Subclasses set `is_client`."""

    # Class-level (ClassVar): a compiled base reads a Python subclass's value only through the class.
    is_client: ClassVar[bool] = False

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self._out: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None
        self.send_window = f.DEFAULT_WINDOW
        self.peer_initial_window = f.DEFAULT_WINDOW
        self.peer_max_frame = f.DEFAULT_MAX_FRAME
        self._blocked: set[Stream] = set()
        # Streams with `credit_step` bytes of DATA queued but not yet taken by an unpaused transport:
        # a stream hears `on_sent` (and an engine gets its credit back) only once the bytes left.
        self._credits: list[Stream] = []
        self._is_write_paused = False  # the transport's buffer is over its high-water mark
        self.ids = StreamIds(self.is_client)
        self.is_closed = False
        self.has_sent_data = False  # HEADERS or DATA written since the owner last cleared it
        self._is_table_size_set = False
        self.idle_since = self._loop.time()  # when the last stream closed (meaningful while `streams` is empty)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the connection runs on. (Cheaper for a call than `asyncio.get_running_loop()`,
        which on Python 3.11 makes a `getpid` system call each time to notice a fork.)"""
        return self._loop

    def write(self, data: bytes) -> None:
        """Queue bytes; everything queued in one loop iteration leaves in one write."""
        self._out.append(data)
        if self._flush_handle is None and not self.is_closed:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        out = self._out
        if out and not self.is_closed and self.transport is not None:
            self._out = []
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
        if not self._is_write_paused:  # (a write above may have paused it: then credit waits)
            self._deliver_credits()

    def _deliver_credits(self) -> None:
        """Tell each stream its bytes left (the transport took them and is not paused)."""
        credits, self._credits = self._credits, []
        for stream in credits:
            num_bytes, stream.unsent = stream.unsent, 0
            stream.on_sent(num_bytes)

    def _count_unsent(self, stream: Stream, num_bytes: int) -> None:
        """Note DATA queued for `stream`; the stream is credited once its step's worth is."""
        unsent = stream.unsent = stream.unsent + num_bytes
        if unsent >= stream.credit_step > unsent - num_bytes:
            self._credits.append(stream)

    def add_stream(self, stream: Stream, stream_id: int) -> None:
        stream.stream_id = stream_id
        self.streams[stream_id] = stream
        self.ids.opened_locally(stream_id)

    def send_headers(self, stream: Stream, block: bytes, end_stream: bool = False) -> None:
        if stream.is_local_closed:
            return
        if stream.pending:
            stream.pending.append((f.HEADERS, block, end_stream))
            return
        self._write_headers(stream, block, end_stream)

    def _write_headers(self, stream: Stream, block: bytes, end_stream: bool) -> None:
        self.has_sent_data = True
        if not self._is_table_size_set:
            # Our blocks never use the dynamic table; saying its size is 0 once makes that
            # official, so no later SETTINGS_HEADER_TABLE_SIZE from the peer needs an answer.
            self._is_table_size_set = True
            block = DYNAMIC_TABLE_SIZE_ZERO + block
        flags = f.END_STREAM if end_stream else 0
        max_frame = self.peer_max_frame
        if len(block) <= max_frame:
            self.write(f.pack_frame(f.HEADERS, flags | f.END_HEADERS, stream.stream_id, block))
        else:
            self.write(f.pack_frame(f.HEADERS, flags, stream.stream_id, block[:max_frame]))
            for start in range(max_frame, len(block), max_frame):
                last = start + max_frame >= len(block)
                chunk = block[start : start + max_frame]
                self.write(f.pack_frame(f.CONTINUATION, f.END_HEADERS if last else 0, stream.stream_id, chunk))
        if end_stream:
            self._close_local(stream)

    def send_data(self, stream: Stream, data: bytes, end_stream: bool = False) -> None:
        if stream.is_local_closed:
            return
        length = len(data)
        if (
            stream.pending is None
            and length <= self.send_window
            and length <= stream.send_window
            and length <= self.peer_max_frame
        ):
            self.send_window -= length
            stream.send_window -= length
            self.has_sent_data = True
            # `write` of `pack_frame`, unrolled: the frame's header and its data are queued as
            # two pieces (the flush joins them anyway), once per relayed message.
            flags = f.END_STREAM if end_stream else 0
            out = self._out
            out.append(_FRAME_HEADER_PACK(length << 8, flags, stream.stream_id))  # (DATA is type 0)
            out.append(data)
            if self._flush_handle is None and not self.is_closed:
                self._flush_handle = self._loop.call_soon(self._flush)
            if end_stream:
                self._close_local(stream)
            # `_count_unsent`, inline: the stream waits for its credit only once it crossed its step
            unsent = stream.unsent = stream.unsent + length
            if unsent >= stream.credit_step > unsent - length:
                self._credits.append(stream)
            return
        if stream.pending is None:
            stream.pending = deque()
        stream.pending.append((f.DATA, data, end_stream))
        self._drain(stream)

    def _drain(self, stream: Stream) -> None:
        """Send what the windows allow from the stream's queue, in order."""
        pending = stream.pending
        assert pending is not None
        while pending:
            kind, data, end_stream = pending[0]
            if kind == f.HEADERS:
                pending.popleft()
                self._write_headers(stream, data, end_stream)
                continue
            allowed = min(self.send_window, stream.send_window, self.peer_max_frame)
            if len(data) > allowed:
                if allowed <= 0:
                    self._blocked.add(stream)
                    return
                pending[0] = (kind, data[allowed:], end_stream)
                data, end_stream = data[:allowed], False
            else:
                pending.popleft()
            self.send_window -= len(data)
            stream.send_window -= len(data)
            self.has_sent_data = True
            self.write(f.pack_frame(f.DATA, f.END_STREAM if end_stream else 0, stream.stream_id, data))
            if end_stream:
                self._close_local(stream)
            self._count_unsent(stream, len(data))
        stream.pending = None
        self._blocked.discard(stream)

    def _close_local(self, stream: Stream) -> None:
        stream.is_local_closed = True
        if stream.is_remote_closed:
            self._remove(stream.stream_id)

    def _forget(self, stream: Stream) -> None:
        stream.is_local_closed = stream.is_remote_closed = True
        stream.pending = None
        self._blocked.discard(stream)
        if stream in self._credits:  # a reset stream's bytes will not be sent: nothing to credit
            self._credits.remove(stream)

    def reset_stream(self, stream: Stream, error_code: int = f.CANCEL) -> None:
        """End a stream at once (no event is delivered to it)."""
        if stream.stream_id in self.streams:
            self._remove(stream.stream_id)
            if not self.is_closed:
                self.ids.reset_by_us(stream.stream_id)
                self.write(f.pack_rst_stream(stream.stream_id, error_code))
        self._forget(stream)

    def send_ping(self, payload: bytes) -> None:
        self.write(f.pack_frame(f.PING, 0, 0, payload))

    def send_goaway(self, error_code: int = f.NO_ERROR, debug: bytes = b"") -> None:
        self.write(f.pack_goaway(self.ids.last_peer_stream_id, error_code, debug))

    def close(self, error_code: int = f.NO_ERROR, debug: bytes = b"") -> None:
        """Say GOAWAY and close; streams still open get `on_reset(None)` from connection_lost."""
        if self.is_closed or self.transport is None:
            return
        self.send_goaway(error_code, debug)
        self._flush()
        self.is_closed = True
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self.transport.close()

    @property
    def last_peer_stream_id(self) -> int:
        """The highest stream id the peer opened (what a GOAWAY from this side names)."""
        return self.ids.last_peer_stream_id

    def _remove(self, stream_id: int) -> None:
        self.streams.pop(stream_id, None)
        if not self.streams:
            self.idle_since = self._loop.time()

    def _unblock(self) -> None:
        for stream in list(self._blocked):
            if self.send_window <= 0:
                return
            self._drain(stream)
