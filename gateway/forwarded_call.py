"""One dpgate.v1 call relayed to one engine.

A `ForwardedCall` is driven by callbacks, not a task: the request body is collected (one
message), an engine is chosen, the request goes upstream, and each response DATA frame is
relayed the moment it arrives, counted by its message prefixes but never parsed. Unpinned calls
that fail with UNAVAILABLE before anything reached the client are retried once on another
engine; nothing is retried once bytes were relayed. The client's deadline becomes the upstream
`grpc-timeout`. However the call ends (the engine's status, a transport failure, the client's
reset or disconnect, its deadline, the gateway's shutdown), the upstream stream is reset if it is
still open, so the engine stops the request.

Each attempt's outcome (the engine's status code, or a `CallEvent`) goes to
`Forwarder.record_outcome`, which applies the breaker's one table (`health_state.BREAKER_BLAME`).
What the engine sends back besides its status is relayed: custom initial and trailing metadata,
and `grpc-status-details-bin` when the gateway relays the engine's code and message unchanged.
The serving rank goes back in trailing metadata `x-data-parallel-rank`, and the call's
`x-request-id` (sent to the engine with the request) in trailing metadata however the call ends;
the engine's own echo of that id is not relayed, so the client sees it once.

The gateway refuses, before any engine sees them, request bodies whose compression is wrong
(a grpc-encoding gRPC does not know, a compressed message that does not inflate): an engine
answers those with INTERNAL, which the breaker would have to count as the engine's failure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Final, Protocol

import grpc

from dpgate.v1 import control_pb2, generate_pb2
from gateway.call_headers import REQUEST_ID_KEY, CallHeaders, request_id_field
from gateway.call_host import CallHost
from gateway.engine_client import EngineClient
from gateway.errors import EngineFailed, GatewayError, Unavailable
from gateway.front_door import CallHandler, rank_trailer
from gateway.grpc_wire import (
    MessageScanner,
    Refusal,
    ResponseStatus,
    frame_message,
    read_request,
    relayed_metadata,
    reset_status,
    status_trailers,
)
from gateway.health_state import CallEvent
from gateway.http2 import frames as f
from gateway.http2.connection import Headers
from gateway.http2.header_codec import encode_literal
from gateway.routing.filters import PromptBlocks
from gateway.status_table import status_for
from gateway.upstream import UpstreamConnection, UpstreamStream

logger = logging.getLogger("dpgate.gateway.forwarding")

DEADLINE_MESSAGE: Final = "Deadline Exceeded"
_NO_STATUS_MESSAGE: Final = "the engine ended the call without a status"
# The tag byte of a GenerateStreamResponse (or ChatStreamResponse) carrying a token: field 2 (delta), wire type 2.
_DELTA_TAG: Final = 0x12
_SERVICES: Final = (
    generate_pb2.DESCRIPTOR.services_by_name["InferenceService"],
    control_pb2.DESCRIPTOR.services_by_name["ControlService"],
)
# rpc name -> full name of its request message, for the messages that refuse a body.
REQUEST_TYPES: Final[dict[str, str]] = {
    method.name: method.input_type.full_name for service in _SERVICES for method in service.methods
}
# How an engine's RST_STREAM (or lost connection, None) ended a call.
_RESET_EVENTS: Final[dict[int | None, CallEvent]] = {
    None: CallEvent.CONNECTION_LOST,
    f.REFUSED_STREAM: CallEvent.STREAM_REFUSED,
    f.CANCEL: CallEvent.STREAM_CANCELLED,
    f.ENHANCE_YOUR_CALM: CallEvent.ENHANCE_YOUR_CALM,
}


# A stream that fails this way after messages were relayed ends with INTERNAL (DESIGN.md, rule 7).
_FAILED_AFTER_MESSAGES: Final = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS}
)


def engine_failure(engine: EngineClient, code: grpc.StatusCode, details: str, num_sent: int) -> EngineFailed:
    """The status the client gets for an engine's failure; never internal addresses or tracebacks."""
    if num_sent and code in _FAILED_AFTER_MESSAGES:
        return EngineFailed("INTERNAL", f"data parallel rank {engine.rank} failed after {num_sent} messages were sent")
    if code is grpc.StatusCode.UNAVAILABLE:
        return EngineFailed("UNAVAILABLE", f"data parallel rank {engine.rank} is unavailable")
    return EngineFailed(code.name, details or code.name)


def merge_abort_results(engines: list[EngineClient], results: list[bytes | BaseException]) -> list[str]:
    """The request ids every engine aborted; raises the first engine's failure as GatewayError.
    An Abort cancelled because its engine's channel closed under it (the health watcher drops an
    engine it cannot reach) is that engine being unavailable: CancelledError is a BaseException,
    and letting it escape left the client's call hanging (issue 22)."""
    aborted: list[str] = []
    for engine, result in zip(engines, results, strict=True):
        if isinstance(result, grpc.aio.AioRpcError):
            raise engine_failure(engine, result.code(), result.details() or "", 0)
        if isinstance(result, asyncio.CancelledError):
            raise engine_failure(engine, grpc.StatusCode.UNAVAILABLE, "", 0)
        if isinstance(result, BaseException):
            raise EngineFailed("INTERNAL", f"data parallel rank {engine.rank} failed to answer Abort")
        aborted.extend(control_pb2.AbortResponse.FromString(result).aborted_request_ids)
    return aborted


class RelayedCall(Protocol):
    """The client's side of a relayed call: the front door's `ServerCall`, or the HTTP API's
    `EngineCall` (gateway/openai/bridge.py). A protocol rather than `ServerCall`: compiled
    (gateway/compiled.py), an argument annotated with a class is checked to be one at run time."""

    handler: CallHandler | None
    is_response_started: bool
    loop: asyncio.AbstractEventLoop
    peer: str

    @property
    def received_at(self) -> float: ...
    def after_read(self, callback: Callable[[], None]) -> None: ...
    def start_response(self, extra: bytes = b"") -> None: ...
    def send(self, data: bytes) -> None: ...
    def finish(self, trailers: bytes) -> None: ...


class OpenedCall(RelayedCall, Protocol):
    """A call as the forwarder admits it (`Forwarder.open_call`): a relayed call, its request
    headers, and the front door's way to refuse it before it is relayed."""

    headers: Headers

    def refuse(self, code: grpc.StatusCode, message: str) -> None: ...


class ForwardedCall:
    """One dpgate.v1 call relayed to one engine (see the module docstring)."""

    __slots__ = (
        "_attempts_left",
        "_body",
        "_body_timer",
        "_call",
        "_deadline",
        "_dispatched_at",
        "_engine",
        "_engine_time",
        "_excluded",
        "_forwarder",
        "_headers",
        "_is_answered",
        "_is_done",
        "_is_request_complete",
        "_loop",
        "_max_message_bytes",
        "_num_sent",
        "_opened_at",
        "_peer",
        "_pending_prefill",
        "_prompt",
        "_rank",
        "_received_at",
        "_request",
        "_request_id",
        "_request_id_field",
        "_response_headers",
        "_rpc",
        "_scanner",
        "_served_rank",
        "_start",
        "_streaming",
        "_task",
        "_timer",
        "_ttft_pending",
        "_upstream",
    )  # fmt: skip

    def __init__(
        self,
        forwarder: CallHost,
        call: RelayedCall,
        headers: CallHeaders,
        rpc: str,
        streaming: bool,
        rank: int | None,
        end_stream: bool,
        request_id: str,
    ) -> None:
        self._forwarder = forwarder
        self._max_message_bytes = forwarder.max_message_bytes  # (read for every relayed frame)
        self._call = call
        self._headers = headers
        self._rpc = rpc
        self._streaming = streaming
        self._rank = rank
        self._served_rank: int | None = None  # the rank of the last engine tried, for the access line
        self._request_id = request_id
        self._request_id_field = request_id_field(request_id)
        self._start = time.perf_counter()
        self._body: bytes | bytearray = bytearray()  # appended per DATA frame: bytes += bytes copied it all each time
        self._request = b""  # the request message, uncompressed (for the Abort fan-out)
        # The engine's response headers to relay (grpc-encoding, custom metadata): sent with the
        # first message or the status, so an attempt that fails before any message can be retried.
        self._response_headers = b""
        self._excluded: frozenset[str] = frozenset()
        self._attempts_left = 1 if rank is not None else 2
        self._engine: EngineClient | None = None
        self._upstream: UpstreamStream | None = None
        self._scanner = MessageScanner(_DELTA_TAG if streaming else -1)
        self._num_sent = 0
        self._prompt: PromptBlocks | None = None  # what cache-aware routing read from the prompt
        self._pending_prefill = 0  # prompt tokens counted in the engine's pending_prefill_tokens
        self._dispatched_at = 0  # the engine's GetLoad asks when this call was sent there
        self._is_done = False
        self._is_request_complete = False  # the request's end (END_STREAM) has come
        # What the gateway adds to the call's latency (dpgate_gateway_added_latency_seconds): from
        # the read that completed the request to its end, less the engine's part (each attempt's
        # request queued upstream to its end read back); measured once an engine ended an attempt.
        self._received_at = 0.0
        self._opened_at = 0.0
        self._engine_time = 0.0
        self._is_answered = False
        self._ttft_pending = streaming
        self._task: asyncio.Future | None = None
        self._loop = loop = call.loop
        self._timer: asyncio.TimerHandle | None = None
        self._deadline: float | None = None
        if headers.timeout is not None:
            self._deadline = loop.time() + headers.timeout
            self._timer = loop.call_at(self._deadline, self._deadline_passed)
        forwarder.num_in_flight += 1
        self._peer = call.peer
        forwarder.in_flight_by_peer[self._peer] = forwarder.in_flight_by_peer.get(self._peer, 0) + 1
        self._body_timer: asyncio.TimerHandle | None = None
        if not end_stream:  # a headers-only stream must not hold its slot for ever
            call.after_read(self._await_body)
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
            if len(self._body) > self._max_message_bytes + 5:
                self._too_large(len(self._body) - 5)
                return
        if end_stream:
            self._request_complete()

    def _await_body(self) -> None:
        """Arm the request-body timer, unless the body came in the read that brought the headers."""
        if not self._is_done and not self._is_request_complete:
            self._body_timer = self._loop.call_later(self._forwarder.config.request_body_timeout_s, self._body_late)

    def _body_late(self) -> None:
        self._body_timer = None
        if not self._is_done:
            timeout = self._forwarder.config.request_body_timeout_s
            message = f"the request message did not arrive within {timeout:g} s (--request-body-timeout)"
            self._finish(grpc.StatusCode.DEADLINE_EXCEEDED, message)

    def _too_large(self, length: int) -> None:
        limit = self._max_message_bytes
        message = f"request message of {length} bytes is larger than the gateway's limit of {limit} bytes"
        self._finish(grpc.StatusCode.RESOURCE_EXHAUSTED, message)

    def _request_complete(self) -> None:
        self._is_request_complete = True
        self._received_at = self._call.received_at
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        body = self._body = bytes(self._body)  # complete: one copy, then shared read-only with every attempt
        request = read_request(
            body, self._rpc, REQUEST_TYPES[self._rpc], self._headers.encoding, self._max_message_bytes
        )
        if isinstance(request, Refusal):
            self._finish(request.code, request.message)
            return
        self._request = request
        if self._rpc == "Abort" and self._rank is None:
            self._task = asyncio.ensure_future(self._abort_everywhere())
            return
        prompts = self._forwarder.prompts
        if prompts.applies(self._rpc, self._rank):
            authorization = self._headers.authorization[0] if self._headers.authorization else None
            self._task = asyncio.ensure_future(prompts.prompt_blocks(self._rpc, request, authorization))
            self._task.add_done_callback(self._prompt_read)
            return
        self._attempt()

    def _prompt_read(self, task: asyncio.Future) -> None:
        """The prompt is tokenized and hashed (off the loop): now choose with it."""
        if self._is_done or task.cancelled():
            return
        self._task = None
        error = task.exception()
        if error is not None:  # a bug in reading the prompt must not fail the call: route by load
            logger.error("reading the prompt for routing failed", exc_info=error)
        else:
            self._prompt = task.result()
        self._attempt()

    # --- choosing and opening upstream --------------------------------------------------------

    def _attempt(self) -> None:
        self._attempts_left -= 1
        try:
            engine = self._forwarder.choose(self._rank, self._excluded, prompt=self._prompt)
        except GatewayError as error:
            code, message = status_for(error)
            self._finish(code, message)
            return
        self._engine = engine
        self._served_rank = engine.rank
        engine.num_in_flight += 1
        self._dispatched_at = engine.reported.num_asks
        if self._prompt is not None:
            prompt = self._prompt
            self._pending_prefill = prompt.num_prompt_tokens - prompt.matched_tokens.get(engine.address, 0)
            engine.pending_prefill_tokens += self._pending_prefill
            self._forwarder.prompts.opened(engine.address, prompt)
        connection = engine.link.ready_connection()
        if connection is not None:
            self._open(connection)
            return
        # An engine that accepts no connection within the time it has to answer a health probe
        # is failing (a black-holed host would otherwise hold the call until the OS gives up).
        connecting = asyncio.wait_for(engine.link.connect(), self._forwarder.config.health_timeout_s)
        self._task = asyncio.ensure_future(connecting)
        self._task.add_done_callback(self._connected)

    def _connected(self, task: asyncio.Future) -> None:
        if self._is_done or task.cancelled():
            return
        self._task = None
        error = task.exception()
        if isinstance(error, TimeoutError):
            self._engine_ended(CallEvent.CONNECT_TIMEOUT, grpc.StatusCode.UNAVAILABLE, "connecting timed out")
        elif error is not None:
            self._engine_ended(CallEvent.CONNECT_FAILED, grpc.StatusCode.UNAVAILABLE, "connecting failed")
        else:
            self._open(task.result())

    def _open(self, connection: UpstreamConnection) -> None:
        timeout = None
        if self._deadline is not None:
            timeout = max(0.0, self._deadline - self._loop.time())
        assert self._engine is not None
        extra = self._headers.passed + self._headers.tenant_field + self._request_id_field
        block = self._engine.link.request_headers(self._headers.path, timeout, extra)
        body = self._body
        assert isinstance(body, bytes)  # (the request is complete: see _request_complete)
        self._upstream = connection.open_stream(self, block, body, end_stream=True)
        self._opened_at = time.perf_counter()

    # --- upstream events ----------------------------------------------------------------------

    def upstream_headers(self, headers: Headers, end_stream: bool) -> None:
        if self._is_done:
            return
        if end_stream:
            self._engine_stopped(self._read_at())
            status = ResponseStatus.read(headers)
            if status.code is None:
                self._engine_ended(CallEvent.NO_STATUS, grpc.StatusCode.INTERNAL, _NO_STATUS_MESSAGE)
            else:
                self._engine_answered(status)
            return
        extra = relayed_metadata(headers)
        for name, value in headers:
            if name == b"grpc-encoding":
                self._scanner.encoding = value
                extra += encode_literal(name, value)
        self._response_headers = extra

    def upstream_data(self, data: bytes, end_stream: bool) -> None:
        if self._is_done:
            return
        scanner = self._scanner
        completed = scanner.feed(data)
        if scanner.max_length > self._max_message_bytes:
            limit = self._max_message_bytes
            message = f"response message of {scanner.max_length} bytes is larger than the limit of {limit}"
            self._end(CallEvent.RESPONSE_TOO_LARGE, grpc.StatusCode.RESOURCE_EXHAUSTED, message)
            return
        if self._ttft_pending and scanner.watch_seen:
            self._ttft_pending = False
            self._forwarder.metrics.ttft.observe(time.perf_counter() - self._start)
        if self._response_headers:
            self._call.start_response(self._response_headers)
            self._response_headers = b""
        self._call.send(data)
        self._num_sent += completed
        if end_stream:  # DATA ending a response without trailers breaks the gRPC protocol
            self._engine_stopped(self._read_at())
            self._engine_ended(CallEvent.NO_STATUS, grpc.StatusCode.INTERNAL, _NO_STATUS_MESSAGE)

    def upstream_reset(self, error_code: int | None) -> None:
        if not self._is_done:
            # A lost connection is noticed now; a reset frame was read with the connection's latest bytes.
            self._engine_stopped(time.perf_counter() if error_code is None else self._read_at())
            event = _RESET_EVENTS.get(error_code, CallEvent.STREAM_RESET)
            self._engine_ended(event, *reset_status(error_code))

    def _read_at(self) -> float:
        """When the upstream connection's latest bytes (the frame being handled) were read."""
        upstream = self._upstream
        return upstream.connection.last_read_at if upstream is not None else time.perf_counter()

    def _engine_stopped(self, read_at: float) -> None:
        """The engine's end of this attempt was read: the time since its request was queued was the engine's."""
        self._engine_time += max(0.0, read_at - self._opened_at)
        self._is_answered = True

    def _release_engine(self) -> EngineClient | None:
        engine = self._engine
        self._upstream = None
        if engine is not None:
            engine.num_in_flight -= 1
            engine.pending_prefill_tokens -= self._pending_prefill
            self._pending_prefill = 0
            prompt = self._prompt
            if prompt is not None:
                self._forwarder.prompts.closed(engine.address, prompt)
            engine.reported.released(self._dispatched_at, prompt.num_prompt_tokens if prompt is not None else 0)
            self._engine = None
        return engine

    def _engine_answered(self, status: ResponseStatus) -> None:
        """The engine ended the call with a status (its trailers)."""
        assert status.code is not None
        if status.code is not grpc.StatusCode.OK:
            self._engine_ended(status.code.name, status.code, status.message, status)
            return
        engine = self._release_engine()
        if engine is None:
            return
        self._forwarder.record_outcome(engine, "OK")
        trailer = status.details_field + rank_trailer(engine.rank or 0) + status.metadata
        self._finish(grpc.StatusCode.OK, status.message, trailer)

    def _engine_ended(
        self, outcome: str | CallEvent, code: grpc.StatusCode, details: str, status: ResponseStatus | None = None
    ) -> None:
        """The attempt on the engine ended without success: record it, then retry or end the call.

        `code` and `details` are the engine's status, or what a transport event means; an
        UNAVAILABLE before any byte reached the client is retried once on another engine
        (unpinned calls only). `status` carries the engine's own trailers, when it sent some.
        """
        engine = self._release_engine()
        if self._is_done or engine is None:
            return
        forwarder = self._forwarder
        forwarder.record_outcome(engine, outcome)
        if code is grpc.StatusCode.UNAVAILABLE and self._attempts_left and not self._call.is_response_started:
            self._response_headers = b""  # that attempt's: the next engine sends its own
            self._excluded |= {engine.address}
            forwarder.metrics.retries.labels(rpc=self._rpc).inc()
            self._attempt()
            return
        failure = engine_failure(engine, code, details, self._num_sent)
        trailer = rank_trailer(engine.rank or 0)
        if status is not None:
            trailer += status.metadata
            if failure.code_name == code.name and failure.message == (details or code.name):
                trailer = status.details_field + trailer  # relayed as the engine said it: the details still match
        self._finish(grpc.StatusCode[failure.code_name], failure.message, trailer)

    # --- endings ------------------------------------------------------------------------------

    def _deadline_passed(self) -> None:
        self._timer = None
        self._end(CallEvent.CLIENT_DEADLINE, grpc.StatusCode.DEADLINE_EXCEEDED, DEADLINE_MESSAGE)

    def on_response_sent(self, num_bytes: int) -> None:
        """Relayed bytes reached the client's connection: the engine may send that many more."""
        if self._upstream is not None:
            self._upstream.release(num_bytes)

    def on_cancelled(self) -> None:
        """The client reset the stream or went away: stop the engine's work too."""
        if self._is_done:
            return
        self._stop_upstream(CallEvent.CLIENT_CANCELLED)
        self._done(grpc.StatusCode.CANCELLED)

    def cancel(self, code: grpc.StatusCode, message: str) -> None:
        """End the call from the gateway's side (shutdown), resetting upstream."""
        self._end(CallEvent.GATEWAY_ENDED, code, message)

    def _end(self, event: CallEvent, code: grpc.StatusCode, message: str) -> None:
        """End the call on the gateway's initiative, resetting the upstream stream."""
        if self._is_done:
            return
        self._stop_upstream(event)
        self._finish(code, message)

    def _stop_upstream(self, event: CallEvent) -> None:
        """Reset the upstream stream (RST_STREAM CANCEL) and stop connecting, if either is under way."""
        upstream = self._upstream
        if upstream is not None:
            upstream.cancel()
        engine = self._release_engine()
        if engine is not None:
            self._forwarder.record_outcome(engine, event)
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def _finish(self, code: grpc.StatusCode, message: str, extra: bytes = b"") -> None:
        if self._is_done:
            return
        if self._response_headers:
            self._call.start_response(self._response_headers)
        self._call.finish(status_trailers(code, message, extra + self._request_id_field))
        self._done(code)

    def _done(self, code: grpc.StatusCode) -> None:
        self._is_done = True
        if self._upstream is not None:  # whatever ended the call, the engine's stream ends with it
            self._stop_upstream(CallEvent.GATEWAY_ENDED)
        self._call.handler = None  # break the call <-> handler cycle: freed at once, not by the GC
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        forwarder = self._forwarder
        forwarder.num_in_flight -= 1
        left = forwarder.in_flight_by_peer.get(self._peer, 1) - 1
        if left:
            forwarder.in_flight_by_peer[self._peer] = left
        else:
            forwarder.in_flight_by_peer.pop(self._peer, None)
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        forwarder.calls.discard(self)
        added_from = self._received_at + self._engine_time if self._is_answered else None
        forwarder.call_ended(self._rpc, code, self._served_rank, self._start, self._request_id, added_from)

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
            request = self._request
            metadata = ((REQUEST_ID_KEY.decode(), self._request_id),)
            timeout = None
            if self._deadline is not None:
                timeout = max(0.0, self._deadline - self._loop.time())
            results = await asyncio.gather(
                *(engine.abort(request, timeout=timeout, metadata=metadata) for engine in engines),
                return_exceptions=True,
            )
            aborted = merge_abort_results(engines, results)
        except GatewayError as error:
            self._finish(*status_for(error))
            return
        except asyncio.CancelledError:  # this task itself was cancelled (shutdown): still end the call
            self._finish(*status_for(Unavailable("the gateway stopped while the Abort was in flight")))
            raise
        except Exception:
            logger.exception("unexpected error while fanning out Abort")
            self._finish(*status_for(RuntimeError()))
            return
        response = control_pb2.AbortResponse(aborted_request_ids=aborted).SerializeToString()
        if not self._is_done:
            self._call.send(frame_message(response))
            self._finish(grpc.StatusCode.OK, "")
