"""One HTTP/2 connection as an asyncio protocol: frames checked against stream states, then acted on.

The class is shared by both sides of the gateway: clients connect to a server-role connection,
and the gateway reaches each engine through a client-role one. Streams are objects the owner
creates (`Stream` subclasses); the connection calls their `on_headers`, `on_data` and
`on_reset` as frames arrive, and they send through `send_headers`, `send_data` and
`reset_stream`. Everything runs on the event loop's thread, so nothing here takes a lock.

Receiving follows RFC 9113 as nghttp2 does: every frame is checked (its length and flags in
`frames`, its stream's state here, a field block's fields in `header_rules`) before anything
acts on it, and each violation gets the error the RFC names: a connection error is GOAWAY with
that code and the connection closes; a stream error is RST_STREAM on that stream (whose owner
gets `on_reset(code)`), except on an idle stream, where nothing may be sent, so it becomes a
connection error. The state of an id without a stream (idle, closed, skipped, reset by this
side) is `StreamIds`; field blocks in pieces are `PendingFieldBlock`. Nothing the peer sends
raises out of `data_received`: an unexpected exception is logged and closes the connection
with INTERNAL_ERROR (the fuzz test holds that this never happens).

Sending (streams, write coalescing, the peer's windows) is `Http2Sender` (sending.py). Flow
control follows RFC 9113 section 5.2 both ways: data waits in the stream's queue while the
peer's window is closed, and a peer that sends past the windows the gateway opened (4 MiB a
stream) gets FLOW_CONTROL_ERROR. Streams whose data the gateway relays onward
(`auto_credit = False`) return credit only when the relayed bytes have left through the other
connection, so a slow reader slows its writer instead of filling the gateway's memory.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Callable
from typing import Final, TypeVar

from hpack import OversizedHeaderListError
from mypy_extensions import mypyc_attr

from gateway.http2 import frames as f
from gateway.http2.errors import HeadersTooLarge, MalformedHeaders, ProtocolViolation
from gateway.http2.field_block import PendingFieldBlock
from gateway.http2.header_codec import Decoder
from gateway.http2.header_rules import check_request, check_response, check_trailers
from gateway.http2.limits import ENGINE_LIMITS, Http2Limits, ResetBudget
from gateway.http2.sending import Http2Sender
from gateway.http2.stream import LOCAL_STREAM_WINDOW, Headers, Stream

__all__ = ["LOCAL_CONNECTION_WINDOW", "LOCAL_STREAM_WINDOW", "Headers", "Http2Connection", "ProtocolViolation",
           "Stream"]  # fmt: skip

logger = logging.getLogger("dpgate.gateway.http2")

LOCAL_CONNECTION_WINDOW: Final = 1 << 30
_CONNECTION_WINDOW_UPDATE_AT: Final = LOCAL_CONNECTION_WINDOW // 2  # received bytes that earn the peer a WINDOW_UPDATE
# Frames that need an answer (PING, SETTINGS, stream errors) while the peer reads nothing:
# past this many the peer is flooding (CVE-2019-9512, -9515) and the connection ends.
_MAX_REPLIES_WHILE_PAUSED: Final = 1024
_PREMATURE_RESET_S: Final = 1.0
_U32_UNPACK: Final = struct.Struct(">L").unpack  # a WINDOW_UPDATE's increment
_UNCHECKED: Final = object()  # (no verdict yet: a rule's verdict may be None)
_Verdict = TypeVar("_Verdict")


# Subclassed in Python too (the tests' connections) when this module runs compiled (gateway/compiled.py).
@mypyc_attr(allow_interpreted_subclasses=True)
class Http2Connection(Http2Sender, asyncio.Protocol):
    """The frame layer of one connection; see the module docstring. Subclasses set `is_client`."""

    def __init__(self, limits: Http2Limits = ENGINE_LIMITS) -> None:
        super().__init__()
        self.limits = limits
        self._buffer = bytearray()
        self._decoder = Decoder(max_header_list_size=limits.max_header_block)
        self.recv_window = f.DEFAULT_WINDOW  # what the peer may still send on the connection
        self.peer_max_streams: int | None = None
        self._recv_unacked = 0
        self._block: PendingFieldBlock | None = None
        self._awaiting_preface = not self.is_client
        self._awaiting_settings = True  # the peer's first frame must be SETTINGS (RFC 9113 section 3.4)
        self._num_unacked_settings = 0
        self._peer_goaway_last_id: int | None = None
        self.goaway_received = False
        self._num_replies_while_paused = 0
        self._is_reading = False  # inside data_received (see after_read)
        self._after_read: list[Callable[[], None]] = []
        now = self._loop.time()
        self._reset_budget = (
            ResetBudget(limits.max_resets_per_second, now) if limits.max_resets_per_second is not None else None
        )
        self.last_frame_time = now
        # time.perf_counter() when the latest bytes arrived: a call's added latency counts from
        # the read that brought its request, or its engine's answer (the loop's clock is too coarse).
        self.last_read_at = time.perf_counter()
        # Indexed by frame type; types past CONTINUATION are extensions and are ignored.
        self._handlers = (
            self._on_data, self._on_headers, self._on_priority, self._on_rst_stream, self._on_settings,
            self._on_push_promise, self._on_ping, self._on_goaway, self._on_window_update, self._on_continuation,
        )  # fmt: skip

    @property
    def field_block_started_at(self) -> float | None:
        """When the field block still waiting for CONTINUATION frames began (None: none is)."""
        return None if self._block is None else self._block.started_at

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses
        settings = {
            f.SETTINGS_INITIAL_WINDOW_SIZE: LOCAL_STREAM_WINDOW,
            f.SETTINGS_MAX_FRAME_SIZE: f.DEFAULT_MAX_FRAME,
            **self.limits.settings(),
        }
        if self.is_client:
            settings[f.SETTINGS_ENABLE_PUSH] = 0
            self.write(f.PREFACE)
        self.write(f.pack_settings(settings))
        self._num_unacked_settings += 1
        self.write(f.pack_window_update(0, LOCAL_CONNECTION_WINDOW - f.DEFAULT_WINDOW))
        self.recv_window = LOCAL_CONNECTION_WINDOW

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

    def pause_writing(self) -> None:
        self._is_write_paused = True
        self._num_replies_while_paused = 0

    def resume_writing(self) -> None:
        self._is_write_paused = False
        self._deliver_credits()  # bytes written while paused have now left: their credit goes back

    def data_received(self, data: bytes) -> None:
        if self.is_closed:
            return
        self._is_reading = True
        try:
            self._read_frames(data)
        finally:
            self._is_reading = False
            if self._after_read:
                self._run_after_read()

    def after_read(self, callback: Callable[[], None]) -> None:
        """Run `callback` once every frame of the read being handled has been handled (at once
        when no read is). A call that starts waiting for its request body arms a timer only if the
        body did not come in the same read, which for a unary gRPC call it nearly always does: a
        timer made and cancelled within one read cost more than the rest of the call's bookkeeping
        (issue 27)."""
        if self._is_reading:
            self._after_read.append(callback)
        else:
            callback()

    def _run_after_read(self) -> None:
        callbacks, self._after_read = self._after_read, []
        for callback in callbacks:
            callback()

    def _read_frames(self, data: bytes) -> None:
        # Frames are cut from the bytes as read; only what a read left of a frame is kept in
        # `_buffer` (slicing bytes copies a payload once, a bytearray's slice twice).
        leftover = self._buffer
        if type(data) is not bytes:  # (asyncio's transports pass bytes; a test may not)
            data = bytes(data)
        if leftover:
            leftover += data
            data = bytes(leftover)
            leftover.clear()
        offset = 0
        if self._awaiting_preface:
            preface_length = len(f.PREFACE)
            if not f.PREFACE.startswith(data[:preface_length]):
                self.close(f.PROTOCOL_ERROR, b"expected the HTTP/2 client preface")
                return
            if len(data) < preface_length:
                leftover += data
                return
            self._awaiting_preface = False
            offset = preface_length
        self.last_frame_time = self._loop.time()
        self.last_read_at = time.perf_counter()
        size = len(data)
        try:
            while size - offset >= f.FRAME_HEADER_SIZE:
                # The nine-byte frame header read byte by byte: compiled, these are C array reads
                # (struct's unpack_from built a tuple of three boxed ints per frame).
                length = data[offset] << 16 | data[offset + 1] << 8 | data[offset + 2]
                frame_type = data[offset + 3]
                flags = data[offset + 4]
                stream_id = (
                    (data[offset + 5] & 0x7F) << 24 | data[offset + 6] << 16 | data[offset + 7] << 8 | data[offset + 8]
                )
                if length > f.DEFAULT_MAX_FRAME:
                    raise ProtocolViolation(f.FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
                end = offset + f.FRAME_HEADER_SIZE + length
                if end > size:
                    break
                payload = data[offset + f.FRAME_HEADER_SIZE : end]
                offset = end
                if self._block is not None or self._awaiting_settings:
                    self._check_expected_frame(frame_type, flags)
                # The frames of every call (DATA, HEADERS, WINDOW_UPDATE) are direct calls; the
                # rest go through the table. Types past CONTINUATION are extensions: ignored.
                if frame_type == f.DATA:
                    self._on_data(flags, stream_id, payload)
                elif frame_type == f.HEADERS:
                    self._on_headers(flags, stream_id, payload)
                elif frame_type == f.WINDOW_UPDATE:
                    self._on_window_update(flags, stream_id, payload)
                elif frame_type <= f.CONTINUATION:
                    self._handlers[frame_type](flags, stream_id, payload)
                if self.is_closed:
                    return
        except ProtocolViolation as error:
            # A client breaking the rules is the client's business; an engine doing so is a bug.
            (logger.warning if self.is_client else logger.debug)("closing an HTTP/2 connection: %s", error)
            self.close(error.error_code, str(error).encode())
            return
        except Exception:
            logger.exception("closing an HTTP/2 connection after an unexpected error")
            self.close(f.INTERNAL_ERROR, b"internal error")
            return
        if offset < size:
            leftover += data[offset:]

    def _check_expected_frame(self, frame_type: int, flags: int) -> None:
        if self._block is not None and frame_type != f.CONTINUATION:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "a field block was interrupted by another frame")
        if self._awaiting_settings:
            if frame_type != f.SETTINGS or flags & f.ACK:
                raise ProtocolViolation(f.PROTOCOL_ERROR, "the connection preface must start with SETTINGS")
            self._awaiting_settings = False

    # --- stream states ------------------------------------------------------------------------

    def _reply(self, frame: bytes) -> None:
        """Write a frame the peer's frame asked for; a peer that asks while reading nothing is cut off."""
        if self._is_write_paused:
            self._num_replies_while_paused += 1
            if self._num_replies_while_paused > _MAX_REPLIES_WHILE_PAUSED:
                raise ProtocolViolation(f.ENHANCE_YOUR_CALM, "the peer sends frames that need answers but reads none")
        self.write(frame)

    def _send_reset(self, stream_id: int, error_code: int) -> None:
        self.ids.reset_by_us(stream_id)
        self._reply(f.pack_rst_stream(stream_id, error_code))

    def _peer_caused_reset(self) -> None:
        """A stream ended early because of the peer: the rapid-reset guard counts it."""
        budget = self._reset_budget
        if budget is not None and not budget.spend(self._loop.time()):
            logger.warning("closing a connection that resets streams faster than %s per second",
                           self.limits.max_resets_per_second)  # fmt: skip
            raise ProtocolViolation(f.ENHANCE_YOUR_CALM, "too_many_resets")

    def _stream_error(self, stream: Stream, error_code: int) -> None:
        """RST_STREAM `error_code` on a stream the peer broke the rules on; its owner hears of it."""
        stream_id = stream.stream_id
        self._remove(stream_id)
        self._forget(stream)
        self._send_reset(stream_id, error_code)
        stream.on_reset(error_code)
        self._peer_caused_reset()

    def _stream_error_on(self, stream_id: int, error_code: int, reason: str) -> None:
        """A stream error by id, whatever the stream's state."""
        stream = self.streams.get(stream_id)
        if stream is not None:
            self._stream_error(stream, error_code)
        elif self.ids.is_idle(stream_id):
            raise ProtocolViolation(error_code, f"{reason} (on an idle stream)")
        elif not self.ids.was_reset_by_us(stream_id):
            self._send_reset(stream_id, error_code)
            self._peer_caused_reset()

    def _on_closed_stream(self, stream_id: int) -> None:
        """DATA or HEADERS on a closed stream: STREAM_CLOSED, unless this side reset it (frames in flight)."""
        if not self.ids.was_reset_by_us(stream_id):
            self._send_reset(stream_id, f.STREAM_CLOSED)
            self._peer_caused_reset()

    # --- receiving ----------------------------------------------------------------------------

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "DATA on stream 0")
        length = len(payload)
        # The connection window counts every DATA frame, whatever its stream's state (RFC 9113 6.9).
        self.recv_window -= length
        if self.recv_window < 0:
            raise ProtocolViolation(f.FLOW_CONTROL_ERROR, "DATA beyond the connection's flow-control window")
        self._recv_unacked += length
        if self._recv_unacked >= _CONNECTION_WINDOW_UPDATE_AT:
            self.write(f.pack_window_update(0, self._recv_unacked))
            self.recv_window += self._recv_unacked
            self._recv_unacked = 0
        if flags & f.PADDED:
            data = f.strip_padding(payload)
            padding = length - len(data)
        else:
            data, padding = payload, 0
        try:
            stream = self.streams[stream_id]
        except KeyError:
            if self.ids.is_idle(stream_id):
                raise ProtocolViolation(f.PROTOCOL_ERROR, "DATA on an idle stream") from None
            self._on_closed_stream(stream_id)
            return
        if stream.is_remote_closed:
            self._stream_error(stream, f.STREAM_CLOSED)
            return
        stream.recv_window -= length
        if stream.recv_window < 0:
            self._stream_error(stream, f.FLOW_CONTROL_ERROR)
            return
        if not stream.is_headers_received:  # DATA before the response's headers
            self._stream_error(stream, f.PROTOCOL_ERROR)
            return
        end_stream = flags & f.END_STREAM != 0
        if stream.content_length is not None:
            remaining = stream.content_length = stream.content_length - (length - padding)
            if remaining < 0 or (end_stream and remaining):  # RFC 9113 8.1.1: malformed
                self._stream_error(stream, f.PROTOCOL_ERROR)
                return
        if end_stream:
            stream.is_remote_closed = True
        elif stream.credit_on_receipt:
            self.release(stream, length)
        elif padding:
            self.release(stream, padding)  # the owner only sees the content
        stream.on_data(data, end_stream)
        if end_stream and stream.is_local_closed:
            self._remove(stream_id)

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "HEADERS on stream 0")
        fragment, dependency = payload, None
        if flags & (f.PADDED | f.PRIORITY_FLAG):
            fragment, dependency = f.split_headers_payload(flags, payload)
        is_self_dependent = dependency == stream_id
        if flags & f.END_HEADERS:
            self._on_field_block(stream_id, flags, fragment, is_self_dependent)
            return
        self._block = PendingFieldBlock(stream_id, flags, fragment, is_self_dependent, self._loop.time())
        self.on_field_block_started()

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        block = self._block
        if block is None:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "CONTINUATION without a HEADERS frame before it")
        block.add(stream_id, payload, self.limits)
        if flags & f.END_HEADERS:
            self._block = None
            self._on_field_block(stream_id, block.flags, bytes(block.fragment), block.is_self_dependent)

    def _on_field_block(self, stream_id: int, flags: int, fragment: bytes, is_self_dependent: bool) -> None:
        # Decode first, whatever becomes of the stream: the HPACK state must follow every block.
        try:
            headers = self._decoder.decode(fragment, raw=True)
        except OversizedHeaderListError:
            raise ProtocolViolation(f.ENHANCE_YOUR_CALM, "field block far over SETTINGS_MAX_HEADER_LIST_SIZE") from None
        except Exception:  # hpack raises several types for a bad block
            raise ProtocolViolation(f.COMPRESSION_ERROR, "undecodable field block") from None
        end_stream = bool(flags & f.END_STREAM)
        stream = self.streams.get(stream_id)
        if stream is None:
            ids = self.ids
            if not ids.is_idle(stream_id):
                if ids.is_peer_initiated(stream_id) and ids.was_skipped(stream_id):
                    raise ProtocolViolation(f.PROTOCOL_ERROR, "stream id lower than one already used")
                self._on_closed_stream(stream_id)
            elif not ids.is_peer_initiated(stream_id):
                raise ProtocolViolation(f.PROTOCOL_ERROR, "HEADERS on a stream id the peer may not open")
            elif self.is_client:
                raise ProtocolViolation(f.PROTOCOL_ERROR, "a server opened a stream (push is disabled)")
            else:
                self._open_peer_stream(stream_id, headers, end_stream, is_self_dependent)
            return
        if stream.is_remote_closed:
            self._stream_error(stream, f.STREAM_CLOSED)
            return
        if is_self_dependent:
            self._stream_error(stream, f.PROTOCOL_ERROR)
            return
        try:
            if stream.is_headers_received:
                if not end_stream:
                    raise MalformedHeaders("a field block after the headers without END_STREAM")
                self._check(check_trailers, headers)
                if stream.content_length:
                    raise MalformedHeaders("content-length larger than the DATA")
            else:
                status, content_length = self._check(check_response, headers)
                if status < 200:  # interim (1xx): the final response follows
                    if end_stream:
                        raise MalformedHeaders("an interim response ends the stream")
                    return
                if end_stream and content_length:
                    raise MalformedHeaders("content-length larger than the DATA")
                stream.is_headers_received = True
                stream.content_length = content_length
        except (MalformedHeaders, HeadersTooLarge) as error:
            if self.is_client:
                logger.warning("resetting stream %d: its response breaks RFC 9113 (%s)", stream_id, error)
            self._stream_error(stream, f.PROTOCOL_ERROR)
            return
        if end_stream:
            stream.is_remote_closed = True
        stream.on_headers(headers, end_stream)
        if end_stream and stream.is_local_closed:
            self._remove(stream_id)

    def _check(self, rule: Callable[[Headers, int], _Verdict], headers: Headers) -> _Verdict:
        """`rule(headers, limit)` (one of header_rules' checks) for the block just decoded; when the
        decoder remembers that block, what the rule said of it the first time. The rules are pure
        functions of the fields and this connection's fixed limit, and a remembered block's bytes
        stand for the same fields until the decoder forgets it (with its verdicts). A block the
        rules refuse is refused each time: an exception is never remembered. The request rules
        were the gateway's costliest function per unary call (3.6 us for a gRPC client's nine
        fields: issue 27)."""
        verdicts = self._decoder.verdicts
        if verdicts is None:
            return rule(headers, self.limits.max_header_list_size)
        verdict = verdicts.get(rule, _UNCHECKED)
        if verdict is _UNCHECKED:
            verdict = verdicts[rule] = rule(headers, self.limits.max_header_list_size)
        return verdict  # type: ignore[return-value]

    def _open_peer_stream(self, stream_id: int, headers: Headers, end_stream: bool, is_self_dependent: bool) -> None:
        """A request's HEADERS on a new stream id (server role): the stream opens, or is reset at once."""
        self.ids.opened_by_peer(stream_id)
        limit = self.limits.max_concurrent_streams
        content_length = None
        try:
            if is_self_dependent:
                raise MalformedHeaders("a stream cannot depend on itself")
            content_length = self._check(check_request, headers)
            if end_stream and content_length:
                raise MalformedHeaders("content-length larger than the DATA")
        except MalformedHeaders as error:
            logger.debug("malformed request on stream %d: %s", stream_id, error)
            self._send_reset(stream_id, f.PROTOCOL_ERROR)
            self._peer_caused_reset()
            return
        except HeadersTooLarge as too_large:  # (its own name: compiled, one name holds one type)
            self.on_oversized_request(stream_id, end_stream, too_large.size)
            return
        if limit is not None and len(self.streams) >= limit:
            self._send_reset(stream_id, f.REFUSED_STREAM)
            self._peer_caused_reset()
            return
        self.on_new_stream(stream_id, headers, end_stream)
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.content_length = content_length
            stream.opened_at = self.last_frame_time

    def _on_priority(self, flags: int, stream_id: int, payload: bytes) -> None:
        # RFC 9113 deprecates the priority scheme: PRIORITY is checked, then ignored.
        if stream_id == 0:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != f.PRIORITY_SIZE:
            self._stream_error_on(stream_id, f.FRAME_SIZE_ERROR, "PRIORITY length is not 5")
        elif f.unpack_u32(payload) == stream_id:
            self._stream_error_on(stream_id, f.PROTOCOL_ERROR, "a stream cannot depend on itself")

    def _on_rst_stream(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != f.RST_STREAM_SIZE:
            raise ProtocolViolation(f.FRAME_SIZE_ERROR, "RST_STREAM length is not 4")
        stream = self.streams.get(stream_id)
        if stream is None:
            if self.ids.is_idle(stream_id):
                raise ProtocolViolation(f.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
            return  # closed already: nothing to do
        # A rapid reset (CVE-2023-44487) cancels work just begun; a user stopping a long
        # generation is no abuse, so only streams younger than a second count (as Envoy's do).
        is_premature = not stream.is_local_closed and self.last_frame_time - stream.opened_at < _PREMATURE_RESET_S
        self._remove(stream_id)
        self._forget(stream)
        stream.on_reset(f.unpack_error_code(payload))
        if is_premature:
            self._peer_caused_reset()

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & f.ACK:
            if payload:
                raise ProtocolViolation(f.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            if self._num_unacked_settings:
                self._num_unacked_settings -= 1
                # The peer's encoder now knows the table size we advertised; hpack holds it to it.
                self._decoder.max_allowed_table_size = self.limits.header_table_size
            return
        for key, value in f.parse_settings(payload, self.is_client):
            if key == f.SETTINGS_INITIAL_WINDOW_SIZE:
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > f.MAX_WINDOW:
                        raise ProtocolViolation(f.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE overflows a window")
            elif key == f.SETTINGS_MAX_FRAME_SIZE:
                self.peer_max_frame = value
            elif key == f.SETTINGS_MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
        self._reply(f.pack_frame(f.SETTINGS, f.ACK, 0))
        self._unblock()

    def _on_push_promise(self, flags: int, stream_id: int, payload: bytes) -> None:
        raise ProtocolViolation(f.PROTOCOL_ERROR, "PUSH_PROMISE: push is disabled")

    def _on_ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != f.PING_SIZE:
            raise ProtocolViolation(f.FRAME_SIZE_ERROR, "PING length is not 8")
        if flags & f.ACK:
            self.on_ping_ack(payload)
            return
        self.on_ping()
        if not self.is_closed:
            self._reply(f.pack_frame(f.PING, f.ACK, 0, payload))

    def _on_goaway(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < f.GOAWAY_MIN_SIZE:
            raise ProtocolViolation(f.FRAME_SIZE_ERROR, "GOAWAY shorter than 8")
        last_stream_id, error_code = f.unpack_goaway(payload)
        if self._peer_goaway_last_id is not None and last_stream_id > self._peer_goaway_last_id:
            raise ProtocolViolation(f.PROTOCOL_ERROR, "GOAWAY raised its last stream id")
        self._peer_goaway_last_id = last_stream_id
        self.goaway_received = True
        self.on_goaway(last_stream_id, error_code)

    def _on_window_update(self, flags: int, stream_id: int, payload: bytes) -> None:
        if len(payload) != f.WINDOW_UPDATE_SIZE:
            raise ProtocolViolation(f.FRAME_SIZE_ERROR, "WINDOW_UPDATE length is not 4")
        increment = _U32_UNPACK(payload)[0] & 0x7FFF_FFFF  # (f.unpack_u32 without its call: 2 a unary call)
        if stream_id == 0:
            if increment == 0:
                raise ProtocolViolation(f.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > f.MAX_WINDOW:
                raise ProtocolViolation(f.FLOW_CONTROL_ERROR, "connection window above 2^31-1")
            if self._blocked:
                self._unblock()
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            if self.ids.is_idle(stream_id):
                raise ProtocolViolation(f.PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return  # closed: an update sent before the peer learned it, ignored
        if increment == 0:
            self._stream_error(stream, f.PROTOCOL_ERROR)
            return
        stream.send_window += increment
        if stream.send_window > f.MAX_WINDOW:
            self._stream_error(stream, f.FLOW_CONTROL_ERROR)
            return
        if stream.pending:
            self._drain(stream)

    def release(self, stream: Stream, num_bytes: int) -> None:
        """Give the peer back `num_bytes` of the stream's window (batched into half-window updates)."""
        if stream.is_remote_closed:
            return
        stream._recv_unacked += num_bytes
        if stream._recv_unacked >= LOCAL_STREAM_WINDOW // 2:
            self.write(f.pack_window_update(stream.stream_id, stream._recv_unacked))
            stream.recv_window += stream._recv_unacked
            stream._recv_unacked = 0

    # --- hooks for subclasses -----------------------------------------------------------------

    def on_new_stream(self, stream_id: int, headers: Headers, end_stream: bool) -> None:
        """A peer opened a stream with well-formed request headers (server role).

        The subclass registers a Stream (`add_stream`) or refuses it.
        """
        self._send_reset(stream_id, f.REFUSED_STREAM)

    def on_oversized_request(self, stream_id: int, end_stream: bool, size: int) -> None:
        """Request headers over SETTINGS_MAX_HEADER_LIST_SIZE (still well-formed); the stream is refused."""
        self._send_reset(stream_id, f.PROTOCOL_ERROR)
        self._peer_caused_reset()

    def on_field_block_started(self) -> None:
        """A field block did not fit one frame; CONTINUATION frames are expected."""

    def on_goaway(self, last_stream_id: int, error_code: int) -> None:
        """The peer will process none of our streams above `last_stream_id`; those are reset as refused."""
        ids = self.ids
        refused = [sid for sid in self.streams if sid > last_stream_id and not ids.is_peer_initiated(sid)]
        for stream_id in refused:
            stream = self.streams[stream_id]
            self._remove(stream_id)
            self._forget(stream)
            stream.on_reset(f.REFUSED_STREAM)

    def on_ping(self) -> None:
        """A peer's ping arrived (its ack is written by the connection)."""

    def on_ping_ack(self, payload: bytes) -> None:
        """An ack of one of our pings arrived."""
