"""One dpgate.v1 call relayed to one engine.

A `ForwardedCall` is driven by callbacks, not a task: the request body is collected (one
message), an engine is chosen, the request goes upstream, and each response DATA frame is
relayed the moment it arrives, counted by its message prefixes but never parsed. Unpinned calls
that fail with UNAVAILABLE before anything reached the client are retried once on another
engine; nothing is retried once bytes were relayed. The client's deadline becomes the upstream
`grpc-timeout`, and a client reset or disconnect resets the upstream stream, so the engine
stops the request. The serving rank goes back in trailing metadata.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import grpc

from dpgate.v1 import control_pb2
from gateway.engine_client import EngineClient
from gateway.errors import EngineFailed, GatewayError, Unavailable
from gateway.front_door import ServerCall, rank_trailer
from gateway.grpc_wire import (
    MessageScanner,
    frame_message,
    reset_status,
    status_trailers,
    trailer_status,
    unframe_single_message,
)
from gateway.http2.connection import Headers
from gateway.http2.header_codec import encode_literal
from gateway.status_table import ENGINE_FAILURE_CODES, status_for
from gateway.upstream import UpstreamConnection, UpstreamStream

if TYPE_CHECKING:
    from gateway.forwarding import CallHeaders, Forwarder

logger = logging.getLogger("dpgate.gateway.forwarding")

DEADLINE_MESSAGE = "Deadline Exceeded"
# The tag byte of a GenerateStreamResponse carrying a token: field 2 (delta), wire type 2.
_DELTA_TAG = 0x12


def engine_failure(engine: EngineClient, code: grpc.StatusCode, details: str, num_sent: int) -> EngineFailed:
    """The status the client gets for an engine's failure; never internal addresses or tracebacks."""
    if num_sent and code in ENGINE_FAILURE_CODES:
        return EngineFailed("INTERNAL", f"data parallel rank {engine.rank} failed after {num_sent} messages were sent")
    if code is grpc.StatusCode.UNAVAILABLE:
        return EngineFailed("UNAVAILABLE", f"data parallel rank {engine.rank} is unavailable")
    return EngineFailed(code.name, details or code.name)


class ForwardedCall:
    """One dpgate.v1 call relayed to one engine (see the module docstring)."""

    __slots__ = (
        "_attempts_left",
        "_body",
        "_call",
        "_deadline",
        "_engine",
        "_excluded",
        "_forwarder",
        "_headers",
        "_is_done",
        "_num_sent",
        "_rank",
        "_rpc",
        "_scanner",
        "_start",
        "_streaming",
        "_task",
        "_timer",
        "_ttft_pending",
        "_upstream",
    )  # fmt: skip

    def __init__(
        self,
        forwarder: Forwarder,
        call: ServerCall,
        headers: CallHeaders,
        rpc: str,
        streaming: bool,
        rank: int | None,
        end_stream: bool,
    ) -> None:
        self._forwarder = forwarder
        self._call = call
        self._headers = headers
        self._rpc = rpc
        self._streaming = streaming
        self._rank = rank
        self._start = time.perf_counter()
        self._body = b""
        self._excluded: frozenset[str] = frozenset()
        self._attempts_left = 1 if rank is not None else 2
        self._engine: EngineClient | None = None
        self._upstream: UpstreamStream | None = None
        self._scanner = MessageScanner(_DELTA_TAG if streaming else -1)
        self._num_sent = 0
        self._is_done = False
        self._ttft_pending = streaming
        self._task: asyncio.Future | None = None
        loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._deadline: float | None = None
        if headers.timeout is not None:
            self._deadline = loop.time() + headers.timeout
            self._timer = loop.call_at(self._deadline, self._deadline_passed)
        forwarder.num_in_flight += 1
        forwarder.metrics.in_flight.inc()
        forwarder.calls.add(self)
        call.handler = self
        if end_stream:
            self.on_request_data(b"", True)

    # --- the request --------------------------------------------------------------------------

    def on_request_data(self, data: bytes, end_stream: bool) -> None:
        if self._is_done:
            return
        if data:
            self._body += data
            if len(self._body) > self._forwarder.max_message_bytes + 5:
                self._too_large(len(self._body) - 5)
                return
        if end_stream:
            self._request_complete()

    def _too_large(self, length: int) -> None:
        limit = self._forwarder.max_message_bytes
        message = f"request message of {length} bytes is larger than the gateway's limit of {limit} bytes"
        self._finish(grpc.StatusCode.RESOURCE_EXHAUSTED, message)

    def _request_complete(self) -> None:
        framed = unframe_single_message(self._body)
        if framed is None:
            self._finish(grpc.StatusCode.INVALID_ARGUMENT, f"{self._rpc} takes exactly one request message")
            return
        if framed[1] > self._forwarder.max_message_bytes:
            self._too_large(framed[1])
            return
        if self._rpc == "Abort" and self._rank is None:
            self._task = asyncio.ensure_future(self._abort_everywhere())
            return
        self._attempt()

    # --- choosing and opening upstream --------------------------------------------------------

    def _attempt(self) -> None:
        self._attempts_left -= 1
        try:
            engine = self._forwarder.choose(self._rank, self._excluded)
        except GatewayError as error:
            code, message = status_for(error)
            self._finish(code, message)
            return
        self._engine = engine
        engine.num_in_flight += 1
        connection = engine.link.ready_connection()
        if connection is not None:
            self._open(connection)
            return
        self._task = asyncio.ensure_future(engine.link.connect())
        self._task.add_done_callback(self._connected)

    def _connected(self, task: asyncio.Future) -> None:
        if self._is_done or task.cancelled():
            return
        self._task = None
        if task.exception() is not None:
            self.upstream_reset(None)
            return
        self._open(task.result())

    def _open(self, connection: UpstreamConnection) -> None:
        timeout = None
        if self._deadline is not None:
            timeout = max(0.0, self._deadline - asyncio.get_running_loop().time())
        assert self._engine is not None
        block = self._engine.link.request_headers(self._headers.path, timeout, self._headers.passed)
        self._upstream = connection.open_stream(self, block, self._body, end_stream=True)

    # --- upstream events ----------------------------------------------------------------------

    def upstream_headers(self, headers: Headers, end_stream: bool) -> None:
        if end_stream:
            self._engine_finished(*trailer_status(headers))
            return
        for name, value in headers:
            if name == b"grpc-encoding":
                self._call.start_response(encode_literal(name, value))

    def upstream_data(self, data: bytes, end_stream: bool) -> None:
        if self._is_done:
            return
        scanner = self._scanner
        completed = scanner.feed(data)
        if scanner.max_length > self._forwarder.max_message_bytes:
            limit = self._forwarder.max_message_bytes
            message = f"response message of {scanner.max_length} bytes is larger than the limit of {limit}"
            self._fail_upstream(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
            return
        if self._ttft_pending and scanner.watch_seen:
            self._ttft_pending = False
            self._forwarder.metrics.ttft.observe(time.perf_counter() - self._start)
        self._call.send(data)
        self._num_sent += completed
        if end_stream:  # DATA ending a response without trailers breaks the gRPC protocol
            self._engine_finished(grpc.StatusCode.INTERNAL, "the engine ended the call without a status")

    def upstream_reset(self, error_code: int | None) -> None:
        if not self._is_done:
            self._engine_finished(*reset_status(error_code))

    def _fail_upstream(self, code: grpc.StatusCode, message: str) -> None:
        if self._upstream is not None:
            self._upstream.cancel()
        self._release_engine()
        self._finish(code, message)

    def _release_engine(self) -> None:
        self._upstream = None
        if self._engine is not None:
            self._engine.num_in_flight -= 1
            self._engine = None

    def _engine_finished(self, code: grpc.StatusCode, details: str) -> None:
        engine = self._engine
        if self._is_done or engine is None:
            return
        self._release_engine()
        forwarder = self._forwarder
        trailer = rank_trailer(engine.rank or 0)
        if code is grpc.StatusCode.OK:
            forwarder.record_success(engine)
            self._finish(code, "", trailer)
            return
        forwarder.record_failure(engine, code)
        if code is grpc.StatusCode.UNAVAILABLE and self._attempts_left and not self._call.is_response_started:
            self._excluded |= {engine.address}
            forwarder.metrics.retries.labels(rpc=self._rpc).inc()
            self._attempt()
            return
        failure = engine_failure(engine, code, details, self._num_sent)
        self._finish(grpc.StatusCode[failure.code_name], failure.message, trailer)

    # --- endings ------------------------------------------------------------------------------

    def _deadline_passed(self) -> None:
        self._timer = None
        self.cancel(grpc.StatusCode.DEADLINE_EXCEEDED, DEADLINE_MESSAGE)

    def on_response_sent(self, num_bytes: int) -> None:
        """Relayed bytes reached the client's connection: the engine may send that many more."""
        if self._upstream is not None:
            self._upstream.release(num_bytes)

    def on_cancelled(self) -> None:
        """The client reset the stream or went away: stop the engine's work too."""
        if self._is_done:
            return
        self._stop_upstream()
        self._done(grpc.StatusCode.CANCELLED)

    def cancel(self, code: grpc.StatusCode, message: str) -> None:
        """End the call from the gateway's side (deadline, shutdown), resetting upstream."""
        if self._is_done:
            return
        self._stop_upstream()
        self._finish(code, message)

    def _stop_upstream(self) -> None:
        if self._upstream is not None:
            self._upstream.cancel()
        self._release_engine()
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def _finish(self, code: grpc.StatusCode, message: str, extra: bytes = b"") -> None:
        if self._is_done:
            return
        self._call.finish(status_trailers(code, message, extra))
        self._done(code)

    def _done(self, code: grpc.StatusCode) -> None:
        self._is_done = True
        self._call.handler = None  # break the call <-> handler cycle: freed at once, not by the GC
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        forwarder = self._forwarder
        forwarder.num_in_flight -= 1
        forwarder.metrics.in_flight.dec()
        forwarder.calls.discard(self)
        forwarder.record(self._rpc, code, self._start)

    # --- Abort fans out -----------------------------------------------------------------------

    async def _abort_everywhere(self) -> None:
        """Unpinned Abort goes to every usable engine and the answers are merged.

        The gateway does not remember which engine serves which request id, so an unpinned
        Abort asks them all; engines ignore ids they do not know.
        """
        try:
            engines = self._forwarder.usable_engines()
            if not engines:
                raise Unavailable("no engine can serve the request: every candidate is not healthy")
            request = self._body[5:]
            timeout = None
            if self._deadline is not None:
                timeout = max(0.0, self._deadline - asyncio.get_running_loop().time())
            results = await asyncio.gather(
                *(engine.abort(request, timeout=timeout) for engine in engines), return_exceptions=True
            )
            aborted: list[str] = []
            for engine, result in zip(engines, results, strict=True):
                if isinstance(result, grpc.aio.AioRpcError):
                    raise engine_failure(engine, result.code(), result.details() or "", 0)
                if isinstance(result, BaseException):
                    raise result
                aborted.extend(control_pb2.AbortResponse.FromString(result).aborted_request_ids)
        except GatewayError as error:
            self._finish(*status_for(error))
            return
        except Exception:
            logger.exception("unexpected error while fanning out Abort")
            self._finish(*status_for(RuntimeError()))
            return
        response = control_pb2.AbortResponse(aborted_request_ids=aborted).SerializeToString()
        if not self._is_done:
            self._call.send(frame_message(response))
            self._finish(grpc.StatusCode.OK, "")
