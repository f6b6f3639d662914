"""Calls for the gateway's own services (health, reflection), relayed untouched to them."""

from __future__ import annotations

import asyncio

import grpc

from gateway.call_headers import CallHeaders
from gateway.call_host import CallHost
from gateway.front_door import ServerCall
from gateway.grpc_wire import reset_status, status_trailers
from gateway.http2.connection import Headers
from gateway.http2.header_codec import encode_block
from gateway.upstream import UpstreamConnection, UpstreamStream


class PassThroughCall:
    """A call for the gateway's own services (health, reflection), relayed to them untouched.

    Request and response bytes stream both ways as they come, so bidirectional reflection
    streams work; the status trailers are passed on as the local server wrote them. However the
    call ends (its status, the client's reset or disconnect), the upstream stream is reset if it
    is still open, so the local service stops serving it.
    """

    __slots__ = ("_call", "_is_done", "_link", "_upstream", "_waiting")

    def __init__(self, forwarder: CallHost, call: ServerCall, headers: CallHeaders, end_stream: bool) -> None:
        self._call = call
        self._upstream: UpstreamStream | None = None
        self._waiting: list[tuple[bytes, bool]] = []  # request data that came before the upstream opened
        self._is_done = False
        link = forwarder.local_services
        if link is None:
            call.refuse(grpc.StatusCode.UNAVAILABLE, "the gateway is starting")
            self._is_done = True
            return
        self._link = link
        call.handler = self
        block = link.request_headers(headers.path, headers.timeout, headers.passed)
        if end_stream:
            self._waiting.append((b"", True))
        connection = link.ready_connection()
        if connection is not None:
            self._open(connection, block)
        else:
            asyncio.ensure_future(link.connect()).add_done_callback(lambda task: self._connected(task, block))

    def _connected(self, task: asyncio.Future, block: bytes) -> None:
        if self._is_done:
            return
        if task.cancelled() or task.exception() is not None:
            self.upstream_reset(None)
            return
        self._open(task.result(), block)

    def _open(self, connection: UpstreamConnection, block: bytes) -> None:
        waiting, self._waiting = self._waiting, []
        body = b"".join(data for data, _ in waiting)
        end_stream = any(end for _, end in waiting)
        self._upstream = connection.open_stream(self, block, body, end_stream)

    def on_request_data(self, data: bytes, end_stream: bool) -> None:
        if self._is_done:
            return
        upstream = self._upstream
        if upstream is None:
            self._waiting.append((data, end_stream))
        else:
            upstream.connection.send_data(upstream, data, end_stream)

    def on_response_sent(self, num_bytes: int) -> None:
        if self._upstream is not None:
            self._upstream.release(num_bytes)

    def on_cancelled(self) -> None:
        """The client reset the stream or went away: the local service's stream is reset too."""
        self._end()

    def upstream_headers(self, headers: Headers, end_stream: bool) -> None:
        if self._is_done:
            return
        fields = [(name, value) for name, value in headers if not name.startswith(b":") and name != b"content-type"]
        if end_stream:
            self._call.finish(encode_block(fields))
            self._end()
        else:
            self._call.start_response(encode_block(fields))

    def upstream_data(self, data: bytes, end_stream: bool) -> None:
        if self._is_done:
            return
        self._call.send(data)
        if end_stream:  # DATA ending a response without trailers breaks the gRPC protocol
            self._call.finish(status_trailers(grpc.StatusCode.INTERNAL, "the call ended without a status"))
            self._end()

    def upstream_reset(self, error_code: int | None) -> None:
        if not self._is_done:
            self._call.refuse(*reset_status(error_code))
            self._end()

    def _end(self) -> None:
        """However the call ended, its stream to the local service ends too (RST_STREAM CANCEL
        unless it already closed both ways: a bidirectional call may still be open our way)."""
        self._is_done = True
        self._call.handler = None  # break the call <-> handler cycle
        self._waiting = []
        upstream, self._upstream = self._upstream, None
        if upstream is not None:
            upstream.cancel()
