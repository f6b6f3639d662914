"""The seam between the OpenAI HTTP API and the gRPC data path: one HTTP request's dpgate.v1 call.

A `ForwardedCall` (gateway/forwarded_call.py) relays a call between a client's HTTP/2 stream
(`ServerCall`) and an engine. An `EngineCall` stands where that stream stands: it hands the
`Forwarder` the headers a gRPC client would have sent (`:path`, `x-request-id`, `authorization`,
`x-data-parallel-rank`, `grpc-timeout`) and the request message, and reads back what the relay
would have written to the client: length-prefixed response messages, then the status trailers.
So an HTTP request goes through exactly the gRPC path's admission (API key, draining, the
in-flight limit, the rank rule and its sentence), routing, retry before the first byte, breaker
bookkeeping, deadline, metrics and access log: there is no second routing path to keep in step.

Flow control: the upstream stream's window is returned (`on_response_sent`) as the HTTP side
takes each message, so a slow HTTP client slows the engine's stream as a slow gRPC client would.
`cancel()` is the client going away: the relay resets the upstream stream and the engine frees
the request.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import Final, Protocol

import grpc

from gateway.front_door import CallHandler
from gateway.grpc_wire import MESSAGE_PREFIX_SIZE, ResponseStatus, frame_message, status_trailers
from gateway.http2.connection import Headers
from gateway.http2.header_codec import Decoder

_PREFIX: Final = struct.Struct(">BI")
COMPRESSED_MESSAGE: Final = "the engine sent a compressed message, which the HTTP API does not read"
# The relay's trailers are plain literals (never indexed: gateway/http2/header_codec.py), so they
# leave a decoder's dynamic table as it was: one decoder serves every call.
_TRAILERS: Final = Decoder()


class CallOpener(Protocol):
    """What opens a call: `gateway.forwarding.Forwarder`."""

    def open_call(self, call: EngineCall, end_stream: bool) -> None: ...


class EngineCall:
    """One dpgate.v1 call made for an HTTP request; `next_message()` reads its response payloads.

    The attributes and methods up to `refuse` are the part of `ServerCall` the forwarder and the
    relay use; nothing else of it is touched.
    """

    __slots__ = (
        "_after_start", "_buffer", "_items", "_status", "_waiter", "handler", "headers", "is_finished",
        "is_response_started", "loop", "peer", "received_at",
    )  # fmt: skip

    def __init__(self, headers: Headers, peer: str = "", loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.headers = headers
        self.peer = peer  # the HTTP client's address: its calls count toward --max-in-flight-per-peer
        self.handler: CallHandler | None = None  # set by the forwarder when it admits the call
        self.is_response_started = False
        self.is_finished = False
        self.received_at = 0.0  # time.perf_counter() when the request message was handed over (`start`)
        # The loop the call's timers go to: the caller's, when it knows it (get_running_loop()
        # makes a getpid system call on Python 3.11).
        self.loop = loop or asyncio.get_running_loop()
        self._after_start: list[Callable[[], None]] = []
        self._buffer = b""
        # Response payloads (with their relayed size) for `next_message()`, None at the end: a queue
        # with one reader, woken through a future of the call's loop (asyncio.Queue asks for
        # the running loop, a getpid system call, each time its reader waits).
        self._items: deque[tuple[bytes, int] | None] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._status: ResponseStatus | None = None

    # --- the ServerCall side the relay writes to ------------------------------------------------

    def after_read(self, callback: Callable[[], None]) -> None:
        """Run `callback` once the request message is handed over (`start` hands it right after
        opening the call, as one read brings a gRPC call's headers and body)."""
        self._after_start.append(callback)

    def start_response(self, extra: bytes = b"") -> None:
        self.is_response_started = True

    def send(self, data: bytes) -> None:
        """Relayed bytes: whole or partial length-prefixed messages."""
        self.is_response_started = True
        buffer = self._buffer + data
        position = 0
        while len(buffer) - position >= MESSAGE_PREFIX_SIZE:
            flag, length = _PREFIX.unpack_from(buffer, position)
            end = position + MESSAGE_PREFIX_SIZE + length
            if end > len(buffer):
                break
            if flag != 0:
                self._fail(COMPRESSED_MESSAGE)
                return
            self._put((buffer[position + MESSAGE_PREFIX_SIZE : end], end - position))
            position = end
        self._buffer = buffer[position:]

    def finish(self, trailers: bytes) -> None:
        """The call's end: `trailers` is a status block from `grpc_wire.status_trailers`."""
        if self.is_finished:
            return
        self.is_finished = True
        self._status = ResponseStatus.read(_TRAILERS.decode(trailers, raw=True))
        self._put(None)

    def _put(self, item: tuple[bytes, int] | None) -> None:
        self._items.append(item)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def refuse(self, code: grpc.StatusCode, message: str) -> None:
        self.finish(status_trailers(code, message))

    # --- the HTTP side ------------------------------------------------------------------------

    def start(self, opener: CallOpener, request: bytes) -> None:
        """Open the call through the forwarder and send its one request message."""
        self.received_at = time.perf_counter()
        opener.open_call(self, False)
        if self.handler is not None:
            self.handler.on_request_data(frame_message(request), True)
        callbacks, self._after_start = self._after_start, []
        for callback in callbacks:
            callback()

    async def next_message(self) -> bytes | None:
        """The next response message's payload, or None once the call has ended (then see `status`).

        A coroutine rather than an async generator, so this module compiles with the data path
        (mypyc has no async generators) and a unary answer costs no generator per call."""
        while not self._items:
            self._waiter = self.loop.create_future()
            await self._waiter
        item = self._items.popleft()
        if item is None:
            self._items.append(None)  # the end stays the end for any later read
            return None
        payload, num_bytes = item
        if self.handler is not None:
            self.handler.on_response_sent(num_bytes)
        return payload

    async def collect(self) -> list[bytes]:
        """Every response message's payload, once the call has ended (a unary answer)."""
        payloads = []
        while (payload := await self.next_message()) is not None:
            payloads.append(payload)
        return payloads

    @property
    def status(self) -> ResponseStatus:
        """How the call ended; only once `next_message()` has returned None."""
        assert self._status is not None, "the call has not ended"
        return self._status

    def cancel(self) -> None:
        """The HTTP client went away (or another choice failed): reset the engine's stream."""
        if not self.is_finished and self.handler is not None:
            self.is_finished = True
            self.handler.on_cancelled()

    def _fail(self, message: str) -> None:
        handler = self.handler
        self.finish(status_trailers(grpc.StatusCode.INTERNAL, message))
        if handler is not None:
            handler.on_cancelled()
