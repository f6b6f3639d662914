"""The forwarder: the front door's checks, then one engine per call, with bytes relayed both ways.

Every client stream reaches `Forwarder.open_call`. The checks run in the order DESIGN.md gives
them, before any engine is contacted: API key (health exempt), admission (draining, in-flight
limit), then `x-data-parallel-rank`. A dpgate.v1 call that passes becomes a `ForwardedCall`;
anything else (health, reflection) is relayed untouched to the gateway's own local services.

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
import hmac
import logging
import time

import grpc
from prometheus_client import Counter, Histogram

from dpgate.v1 import control_pb2
from gateway.config import GatewayConfig
from gateway.engine_client import CONTROL_SERVICE, INFERENCE_SERVICE, EngineClient
from gateway.engine_pool import EnginePool
from gateway.errors import EngineFailed, GatewayError, InvalidArgument, Unavailable
from gateway.front_door import ServerCall, rank_trailer
from gateway.grpc_wire import (
    CODE_BY_VALUE,
    MessageScanner,
    decode_message,
    frame_message,
    parse_timeout,
    status_trailers,
    unframe_single_message,
)
from gateway.http2 import frames as f
from gateway.http2.connection import Headers
from gateway.http2.header_codec import encode_block, encode_literal
from gateway.metadata import RANK_BIN_KEY, RANK_KEY, parse_data_parallel_rank
from gateway.metrics import GatewayMetrics
from gateway.routing import RouteRequest, RoutingPolicy, choose_engine_for_request
from gateway.status_table import ENGINE_FAILURE_CODES, status_for
from gateway.upstream import UpstreamConnection, UpstreamLink, UpstreamStream

logger = logging.getLogger("dpgate.gateway.forwarding")

DRAINING_MESSAGE = "gateway is shutting down; retry on another gateway"
UNAUTHENTICATED_MESSAGE = "missing or invalid API key: send metadata `authorization: Bearer KEY`"
DEADLINE_MESSAGE = "Deadline Exceeded"

HEALTH_PREFIX = b"/grpc.health.v1.Health/"
# path -> (rpc name, response streaming)
DPGATE_METHODS: dict[bytes, tuple[str, bool]] = {
    f"/{INFERENCE_SERVICE}/Generate".encode(): ("Generate", False),
    f"/{INFERENCE_SERVICE}/GenerateStream".encode(): ("GenerateStream", True),
    **{
        f"/{CONTROL_SERVICE}/{name}".encode(): (name, False)
        for name in ("GetServerInfo", "GetModelInfo", "GetLoad", "Abort")
    },
}
_DPGATE_PREFIX = b"/dpgate.v1."
_RANK_KEYS = (RANK_KEY.encode(), RANK_BIN_KEY.encode())
# The tag byte of a GenerateStreamResponse carrying a token: field 2 (delta), wire type 2.
_DELTA_TAG = 0x12
_PASSED_HEADERS = (b"grpc-encoding", b"grpc-accept-encoding")


class CallHeaders:
    """What the front door reads from a call's request headers, in one pass."""

    __slots__ = ("authorization", "passed", "path", "rank_fields", "timeout")

    def __init__(self, headers: Headers) -> None:
        self.path = b""
        self.timeout: float | None = None
        self.authorization: list[bytes] = []
        self.rank_fields: list[tuple[str, bytes]] = []
        passed = b""
        for name, value in headers:
            if name == b":path":
                self.path = value
            elif name == b"grpc-timeout":
                self.timeout = parse_timeout(value)
            elif name == b"authorization":
                self.authorization.append(value)
            elif name in _RANK_KEYS:
                self.rank_fields.append((name.decode(), value))
            elif name in _PASSED_HEADERS:
                passed += encode_literal(name, value)
        self.passed = passed


class Forwarder:
    """Admits each client call and forwards it (see the module docstring)."""

    def __init__(self, pool: EnginePool, policy: RoutingPolicy, metrics: GatewayMetrics, config: GatewayConfig) -> None:
        self._pool = pool
        self._policy = policy
        self.metrics = metrics
        self.config = config
        self.max_message_bytes = config.max_message_bytes
        self._accepted_keys = tuple(f"Bearer {key}".encode() for key in config.api_keys)
        self.local_services: UpstreamLink | None = None  # set by the server once they listen
        self.is_refusing = False
        self.num_in_flight = 0
        self.calls: set[ForwardedCall] = set()
        self._rejected_metadata = metrics.rejected_metadata.labels(key=RANK_KEY)
        self._routed: dict[int, Counter] = {}
        self._requests: dict[tuple[str, str], Counter] = {}
        self._durations: dict[str, Histogram] = {}
        if config.max_in_flight is not None:
            self._full_message = f"gateway is at its limit of {config.max_in_flight} calls in flight"

    # --- admission ----------------------------------------------------------------------------

    def open_call(self, call: ServerCall, end_stream: bool) -> None:
        headers = CallHeaders(call.headers)
        path = headers.path
        if self._accepted_keys and not path.startswith(HEALTH_PREFIX) and not self._is_authorized(headers):
            self._refuse(call, path, grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
            return
        method = DPGATE_METHODS.get(path)
        if method is None:
            if path.startswith(_DPGATE_PREFIX):
                message = f"method {path.decode(errors='replace')} is not served by this gateway"
                call.refuse(grpc.StatusCode.UNIMPLEMENTED, message)
            else:
                PassThroughCall(self, call, headers, end_stream)
            return
        rpc, streaming = method
        if self.is_refusing:
            self._refuse(call, path, grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)
            return
        if self.config.max_in_flight is not None and self.num_in_flight >= self.config.max_in_flight:
            self._refuse(call, path, grpc.StatusCode.RESOURCE_EXHAUSTED, self._full_message)
            return
        try:
            rank = parse_data_parallel_rank(headers.rank_fields)
        except InvalidArgument as error:
            self._rejected_metadata.inc()
            self._refuse(call, path, grpc.StatusCode.INVALID_ARGUMENT, error.message)
            return
        ForwardedCall(self, call, headers, rpc, streaming, rank, end_stream)

    def _is_authorized(self, headers: CallHeaders) -> bool:
        if len(headers.authorization) != 1:
            return False
        offered = headers.authorization[0]
        # Compare against every key (no early exit) so timing does not reveal which key matched.
        matches = [hmac.compare_digest(offered, accepted) for accepted in self._accepted_keys]
        return any(matches)

    def _refuse(self, call: ServerCall, path: bytes, code: grpc.StatusCode, message: str) -> None:
        call.refuse(code, message)
        method = DPGATE_METHODS.get(path)
        if method is not None:
            self.record(method[0], code, time.perf_counter())

    # --- shared by the calls ------------------------------------------------------------------

    def choose(self, rank: int | None, excluded: frozenset[str]) -> EngineClient:
        request = RouteRequest(rank=rank, excluded_addresses=excluded)
        pool = self._pool
        view = choose_engine_for_request(
            pool.snapshot(), request, self._policy, data_parallel_size=pool.data_parallel_size
        )
        return pool.by_address[view.address]

    def record(self, rpc: str, code: grpc.StatusCode, start: float) -> None:
        key = (rpc, code.name)
        counter = self._requests.get(key)
        if counter is None:
            counter = self._requests[key] = self.metrics.requests.labels(rpc=rpc, code=code.name)
        counter.inc()
        duration = self._durations.get(rpc)
        if duration is None:
            duration = self._durations[rpc] = self.metrics.duration.labels(rpc=rpc)
        duration.observe(time.perf_counter() - start)

    def record_success(self, engine: EngineClient) -> None:
        self._pool.record_success(engine)
        rank = engine.rank or 0
        counter = self._routed.get(rank)
        if counter is None:
            counter = self._routed[rank] = self.metrics.routed.labels(rank=str(rank))
        counter.inc()

    def record_failure(self, engine: EngineClient, code: grpc.StatusCode) -> None:
        self._pool.record_failure(engine, code)

    def usable_engines(self) -> list[EngineClient]:
        return [engine for engine in self._pool.connected() if engine.health.is_healthy]

    def cancel_all(self) -> None:
        """End every call in flight (shutdown timeout): upstream streams are reset."""
        for call in list(self.calls):
            call.cancel(grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)


def engine_failure(engine: EngineClient, code: grpc.StatusCode, details: str, num_sent: int) -> EngineFailed:
    """The status the client gets for an engine's failure; never internal addresses or tracebacks."""
    if num_sent and code in ENGINE_FAILURE_CODES:
        return EngineFailed("INTERNAL", f"data parallel rank {engine.rank} failed after {num_sent} messages were sent")
    if code is grpc.StatusCode.UNAVAILABLE:
        return EngineFailed("UNAVAILABLE", f"data parallel rank {engine.rank} is unavailable")
    return EngineFailed(code.name, details or code.name)


def reset_status(error_code: int | None) -> tuple[grpc.StatusCode, str]:
    """What an upstream stream reset means, as gRPC clients map RST_STREAM codes."""
    if error_code is None:
        return grpc.StatusCode.UNAVAILABLE, "connection to the engine was lost"
    if error_code == f.REFUSED_STREAM:
        return grpc.StatusCode.UNAVAILABLE, "the engine refused the stream"
    if error_code == f.CANCEL:
        return grpc.StatusCode.CANCELLED, "the engine cancelled the call"
    if error_code == f.ENHANCE_YOUR_CALM:
        return grpc.StatusCode.RESOURCE_EXHAUSTED, "the engine asked the gateway to slow down"
    return grpc.StatusCode.INTERNAL, f"the engine reset the stream (HTTP/2 error {error_code})"


def trailer_status(headers: Headers) -> tuple[grpc.StatusCode, str]:
    code = grpc.StatusCode.UNKNOWN
    message = ""
    for name, value in headers:
        if name == b"grpc-status":
            code = CODE_BY_VALUE.get(int(value) if value.isdigit() else -1, grpc.StatusCode.UNKNOWN)
        elif name == b"grpc-message":
            message = decode_message(value)
    return code, message


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


class PassThroughCall:
    """A call for the gateway's own services (health, reflection), relayed to them untouched.

    Request and response bytes stream both ways as they come, so bidirectional reflection
    streams work; the status trailers are passed on as the local server wrote them.
    """

    __slots__ = ("_call", "_is_done", "_link", "_upstream", "_waiting")

    def __init__(self, forwarder: Forwarder, call: ServerCall, headers: CallHeaders, end_stream: bool) -> None:
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
        upstream = self._upstream
        if upstream is None:
            self._waiting.append((data, end_stream))
        elif not self._is_done:
            upstream.connection.send_data(upstream, data, end_stream)

    def on_response_sent(self, num_bytes: int) -> None:
        if self._upstream is not None:
            self._upstream.release(num_bytes)

    def on_cancelled(self) -> None:
        self._is_done = True
        if self._upstream is not None:
            self._upstream.cancel()

    def upstream_headers(self, headers: Headers, end_stream: bool) -> None:
        if self._is_done:
            return
        fields = [(name, value) for name, value in headers if not name.startswith(b":") and name != b"content-type"]
        if end_stream:
            self._is_done = True
            self._call.finish(encode_block(fields))
        else:
            self._call.start_response(encode_block(fields))

    def upstream_data(self, data: bytes, end_stream: bool) -> None:
        if not self._is_done:
            self._call.send(data)

    def upstream_reset(self, error_code: int | None) -> None:
        if not self._is_done:
            self._is_done = True
            self._call.refuse(*reset_status(error_code))
