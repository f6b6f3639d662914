"""One HTTP/2 connection as an asyncio protocol: frame parsing, settings, pings, flow control.

The class is shared by both sides of the gateway: clients connect to a server-role connection,
and the gateway reaches each engine through a client-role one. Streams are objects the owner
creates (`Stream` subclasses); the connection calls their `on_headers`, `on_data` and
`on_reset` as frames arrive, and they send through `send_headers`, `send_data` and
`reset_stream`. Everything runs on the event loop's thread, so nothing here takes a lock.

Output is gathered and written once per loop iteration, so a response's HEADERS, DATA and
trailers usually leave in one system call. Flow control follows RFC 9113 section 5.2: data
waits in the stream's queue while the peer's window is closed. The gateway opens large receive
windows (4 MiB a stream). Streams whose data the gateway relays onward (`auto_credit = False`)
return credit only when the relayed bytes have left through the other connection, so a slow
reader slows its writer instead of filling the gateway's memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from gateway.http2 import frames as f
from gateway.http2.header_codec import Decoder

logger = logging.getLogger("dpgate.gateway.http2")

Headers = list[tuple[bytes, bytes]]

LOCAL_STREAM_WINDOW = 1 << 22
LOCAL_CONNECTION_WINDOW = 1 << 30
MAX_HEADER_BLOCK = 1 << 16
DYNAMIC_TABLE_SIZE_ZERO = b"\x20"  # HPACK "dynamic table size update" to 0 (RFC 7541 section 6.3)


class Stream:
    """One stream's transport state; subclasses handle its events.

    `on_reset(None)` means the connection was lost; an int is the peer's RST_STREAM error code
    (or REFUSED_STREAM for a stream a GOAWAY said the peer never processed).
    """

    auto_credit = True  # return flow-control credit on receipt; False: the owner calls `release`

    __slots__ = (
        "_recv_unacked",
        "connection",
        "is_local_closed",
        "is_remote_closed",
        "pending",
        "send_window",
        "stream_id",
    )  # fmt: skip

    def __init__(self, connection: Http2Connection) -> None:
        self.connection = connection
        self.stream_id = 0
        self.send_window = connection.peer_initial_window
        self.pending: deque[tuple[int, bytes, bool]] | None = None
        self.is_local_closed = False
        self.is_remote_closed = False
        self._recv_unacked = 0

    @property
    def is_open(self) -> bool:
        return not (self.is_local_closed and self.is_remote_closed)

    def on_headers(self, headers: Headers, end_stream: bool) -> None:
        raise NotImplementedError

    def on_data(self, data: bytes, end_stream: bool) -> None:
        raise NotImplementedError

    def on_reset(self, error_code: int | None) -> None:
        raise NotImplementedError

    def on_sent(self, num_bytes: int) -> None:
        """`num_bytes` of this stream's DATA left for the peer (they may have waited for window)."""


class ProtocolViolation(Exception):
    """A connection-level protocol error: the connection ends with GOAWAY and this code."""

    def __init__(self, error_code: int, reason: str) -> None:
        super().__init__(reason)
        self.error_code = error_code


class Http2Connection(asyncio.Protocol):
    """The frame layer of one connection; see the module docstring. Subclasses set `is_client`."""

    is_client = False

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self._buffer = bytearray()
        self._decoder = Decoder()
        self._out: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None
        self.send_window = f.DEFAULT_WINDOW
        self.peer_initial_window = f.DEFAULT_WINDOW
        self.peer_max_frame = f.DEFAULT_MAX_FRAME
        self.peer_max_streams: int | None = None
        self._recv_unacked = 0
        self._blocked: set[Stream] = set()
        self._continuation: tuple[int, int, bytearray] | None = None
        self._awaiting_preface = not self.is_client
        self.last_peer_stream_id = 0
        self.is_closed = False
        self.goaway_received = False
        self.has_sent_data = False  # HEADERS or DATA written since the owner last cleared it
        self._is_table_size_set = False
        self.last_frame_time = self._loop.time()

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses
        settings = {f.SETTINGS_INITIAL_WINDOW_SIZE: LOCAL_STREAM_WINDOW, f.SETTINGS_MAX_FRAME_SIZE: f.DEFAULT_MAX_FRAME}
        if self.is_client:
            settings[f.SETTINGS_ENABLE_PUSH] = 0
            self.write(f.PREFACE)
        self.write(f.pack_settings(settings))
        self.write(f.pack_window_update(0, LOCAL_CONNECTION_WINDOW - f.DEFAULT_WINDOW))

    def connection_lost(self, exc: Exception | None) -> None:
        self.is_closed = True
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        streams = list(self.streams.values())
        self.streams.clear()
        self._blocked.clear()
        for stream in streams:
            stream.is_local_closed = stream.is_remote_closed = True
            stream.on_reset(None)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        offset = 0
        if self._awaiting_preface:
            if len(buffer) < len(f.PREFACE):
                return
            if not buffer.startswith(f.PREFACE):
                self.close(f.PROTOCOL_ERROR, b"expected the HTTP/2 client preface")
                return
            self._awaiting_preface = False
            offset = len(f.PREFACE)
        self.last_frame_time = self._loop.time()
        size = len(buffer)
        unpack = f.FRAME_HEADER.unpack_from
        try:
            while size - offset >= f.FRAME_HEADER_SIZE:
                high, low, frame_type, flags, stream_id = unpack(buffer, offset)
                length = (high << 8) | low
                if length > f.DEFAULT_MAX_FRAME:
                    raise ProtocolViolation(f.FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
                end = offset + f.FRAME_HEADER_SIZE + length
                if end > size:
                    break
                payload = bytes(buffer[offset + f.FRAME_HEADER_SIZE : end])
                offset = end
                self._handle_frame(frame_type, flags, stream_id & 0x7FFF_FFFF, payload)
                if self.is_closed:
                    return
        except ProtocolViolation as error:
            logger.debug("closing connection: %s", error)
            self.close(error.error_code, str(error).encode())
            return
        del buffer[:offset]

    # --- receiving ----------------------------------------------------------------------------

    def _handle_frame(self, frame_type: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuation is not None and frame_type != f.CONTINUATION:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "expected CONTINUATION")
        if frame_type == f.DATA:
            self._on_data_frame(flags, stream_id, payload)
        elif frame_type == f.HEADERS:
            self._on_headers_frame(flags, stream_id, payload)
        elif frame_type == f.WINDOW_UPDATE:
            self._on_window_update(stream_id, f.unpack_u32(payload))
        elif frame_type == f.PING:
            if flags & f.ACK:
                self.on_ping_ack(payload)
            else:
                self.on_ping()
                self.write(f.pack_frame(f.PING, f.ACK, 0, payload))
        elif frame_type == f.SETTINGS:
            if not flags & f.ACK:
                self._on_settings(payload)
        elif frame_type == f.RST_STREAM:
            stream = self.streams.pop(stream_id, None)
            if stream is not None:
                self._forget(stream)
                stream.on_reset(f.unpack_u32(payload))
        elif frame_type == f.CONTINUATION:
            self._on_continuation(flags, stream_id, payload)
        elif frame_type == f.GOAWAY:
            last_stream_id, error_code = f.unpack_goaway(payload)
            self.goaway_received = True
            self.on_goaway(last_stream_id, error_code)
        elif frame_type == f.PUSH_PROMISE:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "push is disabled")
        # PRIORITY and unknown frame types are ignored, as RFC 9113 asks.

    def _on_data_frame(self, flags: int, stream_id: int, payload: bytes) -> None:
        length = len(payload)
        if flags & f.PADDED:
            payload = payload[1 : length - payload[0]]
        self._recv_unacked += length
        if self._recv_unacked >= LOCAL_CONNECTION_WINDOW // 2:
            self.write(f.pack_window_update(0, self._recv_unacked))
            self._recv_unacked = 0
        stream = self.streams.get(stream_id)
        if stream is None or stream.is_remote_closed:
            return  # a stream already reset or finished here; its data is dropped
        end_stream = bool(flags & f.END_STREAM)
        if end_stream:
            stream.is_remote_closed = True
        elif stream.auto_credit:
            self.release(stream, length)
        elif length > len(payload):
            self.release(stream, length - len(payload))  # padding: the owner only sees the payload
        stream.on_data(payload, end_stream)
        if end_stream and stream.is_local_closed:
            self.streams.pop(stream_id, None)

    def _on_headers_frame(self, flags: int, stream_id: int, payload: bytes) -> None:
        if flags & f.PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        if flags & f.PRIORITY_FLAG:
            payload = payload[5:]
        if not flags & f.END_HEADERS:
            self._continuation = (stream_id, flags, bytearray(payload))
            return
        self._on_header_block(flags, stream_id, payload)

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuation is None or self._continuation[0] != stream_id:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "CONTINUATION without HEADERS")
        block = self._continuation[2]
        block += payload
        if len(block) > MAX_HEADER_BLOCK:
            raise ProtocolViolation(f.ENHANCE_YOUR_CALM, "header block too large")
        if flags & f.END_HEADERS:
            first_flags = self._continuation[1]
            self._continuation = None
            self._on_header_block(first_flags, stream_id, bytes(block))

    def _on_header_block(self, flags: int, stream_id: int, block: bytes) -> None:
        try:
            headers = self._decoder.decode(block, raw=True)
        except Exception as error:  # hpack raises several types for a bad block
            raise ProtocolViolation(f.COMPRESSION_ERROR, f"bad header block: {error}") from None
        end_stream = bool(flags & f.END_STREAM)
        stream = self.streams.get(stream_id)
        if stream is None:
            if not self.is_client and stream_id > self.last_peer_stream_id:
                if stream_id % 2 == 0:
                    raise ProtocolViolation(f.PROTOCOL_ERROR, "client stream ids are odd")
                self.last_peer_stream_id = stream_id
                self.on_new_stream(stream_id, headers, end_stream)
            return
        if end_stream:
            stream.is_remote_closed = True
        stream.on_headers(headers, end_stream)
        if end_stream and stream.is_local_closed:
            self.streams.pop(stream_id, None)

    def _on_settings(self, payload: bytes) -> None:
        for key, value in f.unpack_settings(payload):
            if key == f.SETTINGS_INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise ProtocolViolation(f.FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == f.SETTINGS_MAX_FRAME_SIZE:
                self.peer_max_frame = value
            elif key == f.SETTINGS_MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
        self.write(f.pack_frame(f.SETTINGS, f.ACK, 0))
        self._unblock()

    def _on_window_update(self, stream_id: int, increment: int) -> None:
        if stream_id == 0:
            self.send_window += increment
            self._unblock()
            return
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.send_window += increment
            if stream.pending:
                self._drain(stream)

    def release(self, stream: Stream, num_bytes: int) -> None:
        """Give the peer back `num_bytes` of the stream's window (batched into half-window updates)."""
        if stream.is_remote_closed:
            return
        stream._recv_unacked += num_bytes
        if stream._recv_unacked >= LOCAL_STREAM_WINDOW // 2:
            self.write(f.pack_window_update(stream.stream_id, stream._recv_unacked))
            stream._recv_unacked = 0

    def _unblock(self) -> None:
        for stream in list(self._blocked):
            if self.send_window <= 0:
                return
            self._drain(stream)

    # --- hooks for subclasses -----------------------------------------------------------------

    def on_new_stream(self, stream_id: int, headers: Headers, end_stream: bool) -> None:
        """A peer opened a stream (server role). The subclass registers a Stream or resets it."""
        self.write(f.pack_rst_stream(stream_id, f.REFUSED_STREAM))

    def on_goaway(self, last_stream_id: int, error_code: int) -> None:
        """The peer will process no stream above `last_stream_id`; those are reset as refused."""
        for stream_id in [sid for sid in self.streams if sid > last_stream_id]:
            stream = self.streams.pop(stream_id)
            self._forget(stream)
            stream.on_reset(f.REFUSED_STREAM)

    def on_ping(self) -> None:
        """A peer's ping arrived (its ack is written by the connection)."""

    def on_ping_ack(self, payload: bytes) -> None:
        """An ack of one of our pings arrived."""

    # --- sending ------------------------------------------------------------------------------

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

    def add_stream(self, stream: Stream, stream_id: int) -> None:
        stream.stream_id = stream_id
        self.streams[stream_id] = stream

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
            self.write(f.pack_frame(f.DATA, f.END_STREAM if end_stream else 0, stream.stream_id, data))
            if end_stream:
                self._close_local(stream)
            stream.on_sent(length)
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
            stream.on_sent(len(data))
        stream.pending = None
        self._blocked.discard(stream)

    def _close_local(self, stream: Stream) -> None:
        stream.is_local_closed = True
        if stream.is_remote_closed:
            self.streams.pop(stream.stream_id, None)

    def _forget(self, stream: Stream) -> None:
        stream.is_local_closed = stream.is_remote_closed = True
        stream.pending = None
        self._blocked.discard(stream)

    def reset_stream(self, stream: Stream, error_code: int = f.CANCEL) -> None:
        """End a stream at once (no event is delivered to it)."""
        if self.streams.pop(stream.stream_id, None) is not None and not self.is_closed:
            self.write(f.pack_rst_stream(stream.stream_id, error_code))
        self._forget(stream)

    def send_ping(self, payload: bytes) -> None:
        self.write(f.pack_frame(f.PING, 0, 0, payload))

    def send_goaway(self, error_code: int = f.NO_ERROR, debug: bytes = b"") -> None:
        self.write(f.pack_goaway(self.last_peer_stream_id, error_code, debug))

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
