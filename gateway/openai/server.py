"""The OpenAI-compatible HTTP API: aiohttp's low-level server on the gateway's loop, every call
through the forwarder.

Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health.
A request body is translated (gateway/openai/translate.py) into one dpgate.v1 request per choice,
each made as an `EngineCall` (gateway/openai/bridge.py) through the same `Forwarder` gRPC calls
take: the API key, draining, the in-flight limit, `x-data-parallel-rank` (the header, with the
gRPC rule and sentence), routing, retry before the first byte, the breaker, metrics and the access
log are the gRPC path's own. Statuses become OpenAI error objects (gateway/openai/errors.py).

Streams are server-sent events: `data: {chunk}` lines and `data: [DONE]`. The 200 and its headers
wait until every choice's call has sent its first message, so a refusal (a bad field the engine
names, no engine) is still an HTTP error status; a failure after that is an `error` event.
A client that disconnects cancels the request handler (aiohttp's handler cancellation), which
cancels every choice's call: the relay resets the engine's stream and the engine frees the KV.

Dispatch is a table of path and method (`_routes`), not aiohttp's Application: its router and
middleware chain cost a small request a fifth of its CPU (docs/gateway.md). This module is
compiled with the data path (gateway/compiled.py). An unknown path is a 404 naming the endpoints,
a wrong method a 405 with `Allow`, both OpenAI error objects.

Limits (flags): request body size, request line and header field size, open connections (one
more is answered 503 and closed) and keep-alive idle time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import grpc
from aiohttp import web

from dpgate.request_id import REQUEST_ID_KEY, resolve_request_id
from dpgate.v1 import generate_pb2
from gateway.config import GatewayConfig
from gateway.engine_pool import EnginePool
from gateway.forwarding import UNAUTHENTICATED_MESSAGE, Forwarder
from gateway.grpc_wire import format_timeout
from gateway.metadata import RANK_BIN_KEY, RANK_KEY
from gateway.openai import responses
from gateway.openai.bridge import EngineCall
from gateway.openai.connection_limit import RefusedConnection
from gateway.openai.errors import HttpError, RequestError, error, error_for_request, error_for_status
from gateway.openai.streaming import stream_choices
from gateway.openai.translate import Plan, chat_plan, completion_plan

logger = logging.getLogger("dpgate.gateway.http")
TIMEOUT_HEADER: Final = "x-request-timeout"
HTTP_UNAUTHENTICATED_MESSAGE: Final = UNAUTHENTICATED_MESSAGE.replace("metadata", "header")
Route = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=responses.json_bytes(body),
        status=status,
        content_type="application/json",
        charset="utf-8",
        headers=headers,
    )


def error_response(answer: HttpError, request_id: str | None = None) -> web.Response:
    headers = answer.headers()
    if request_id is not None:
        headers[REQUEST_ID_KEY] = request_id
    return json_response(answer.body(), answer.status, headers)


class OpenAIServer:
    """The HTTP listener; `start()` returns the bound port, `stop()` closes it."""

    def __init__(
        self, forwarder: Forwarder, pool: EnginePool, config: GatewayConfig, is_ready: Callable[[], bool]
    ) -> None:
        self._forwarder = forwarder
        self._pool = pool
        self._config = config
        self._is_ready = is_ready
        self._started = int(time.time())
        self._runner: web.ServerRunner | None = None
        # uvloop's Server is no asyncio.Server (and its `sockets` a list, not the tuple typeshed
        # says): compiled, a declared class is checked at run time, so it is held as Any.
        self._server: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop it serves on, once started
        self.port = 0
        self._endpoints = self._routes()

    def _routes(self) -> dict[str, dict[str, Route]]:
        """Each path's handler by method (a GET answers HEAD too, as an HTTP server should)."""
        return {
            "/v1/chat/completions": {"POST": self._chat},
            "/v1/completions": {"POST": self._completions},
            "/v1/models": {"GET": self._models, "HEAD": self._models},
            "/health": {"GET": self._health, "HEAD": self._health},
        }

    def _request(self, message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> web.BaseRequest:
        """aiohttp's low-level request, with the gateway's body limit (`--http-max-body-bytes`).
        The arguments are aiohttp's own objects, passed through untouched (typed Any: compiled,
        a declared type is checked at run time, and aiohttp's C parser makes some of them)."""
        assert self._loop is not None
        limit = self._config.http_max_body_bytes
        return web.BaseRequest(message, payload, protocol, writer, task, self._loop, client_max_size=limit)

    async def start(self) -> int:
        config = self._config
        loop = self._loop = asyncio.get_running_loop()
        factory = web.Server(
            self._handle,
            request_factory=self._request,
            handler_cancellation=True,
            access_log=None,  # the forwarder logs each call with its x-request-id
            keepalive_timeout=config.http_idle_timeout_s,
            max_line_size=config.http_max_header_bytes,
            max_field_size=config.http_max_header_bytes,
        )
        runner = web.ServerRunner(factory)
        await runner.setup()
        self._runner = runner
        limit = config.http_max_connections

        def protocol() -> asyncio.Protocol:
            return factory() if len(factory.connections) < limit else RefusedConnection(limit)

        host = config.host.strip("[]")
        self._server = await loop.create_server(protocol, host, config.http_port, reuse_address=True, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._runner is not None:
            await self._runner.shutdown()
            await self._runner.cleanup()

    # --- dispatch: every error is an OpenAI error object ---------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Answer one request: its endpoint by path and method, every error an OpenAI error object."""
        methods = self._endpoints.get(request.path)
        if methods is None:
            known = ", ".join(self._endpoints)
            return error_response(error(404, f"{request.path} is not an endpoint of this gateway (it serves {known})"))
        endpoint = methods.get(request.method)
        if endpoint is None:
            allowed = ", ".join(methods)
            answer = error_response(error(405, f"{request.path} takes {allowed}, not {request.method}"))
            answer.headers["Allow"] = allowed
            return answer
        try:
            return await endpoint(request)
        except web.HTTPRequestEntityTooLarge:
            limit = self._config.http_max_body_bytes
            return error_response(error(413, f"the request body is larger than the gateway's limit of {limit} bytes"))
        except web.HTTPException as exception:
            if exception.status < 400:
                raise
            return error_response(error(exception.status, exception.reason))

    # --- endpoints ----------------------------------------------------------------------------

    async def _health(self, request: web.BaseRequest) -> web.Response:
        if self._is_ready():
            return json_response({"status": "ok"})
        return error_response(error(503, "no engine is ready", "server_error", "unavailable"))

    async def _models(self, request: web.BaseRequest) -> web.Response:
        refusal = self._check_key(request)
        if refusal is not None:
            return refusal
        names = sorted({view.model for view in self._pool.snapshot()})
        data = [{"id": name, "object": "model", "created": self._started, "owned_by": "dpgate"} for name in names]
        return json_response({"object": "list", "data": data})

    async def _chat(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._serve(request, chat_plan, "chat")

    async def _completions(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._serve(request, completion_plan, "completion")

    async def _serve(self, request: web.BaseRequest, make_plan: Callable[[Any], Plan], kind: str) -> web.StreamResponse:
        request_id, _ = resolve_request_id(request.headers.getall(REQUEST_ID_KEY, []))
        refusal = self._check_key(request)
        if refusal is not None:
            return refusal
        try:
            body = await self._read_json(request)
            plan = make_plan(body)
            headers = self._call_headers(request, plan, request_id)
        except RequestError as problem:
            return error_response(error_for_request(problem), request_id)
        limit = self._config.max_message_bytes
        if any(len(payload) > limit for payload in plan.requests):
            # The relay would answer RESOURCE_EXHAUSTED, which reads as 429 (retry later): it is too large.
            message = f"the request is larger than the gateway's message limit of {limit} bytes (--max-message-bytes)"
            return error_response(error(413, message), request_id)
        model = plan.model or self._default_model()
        calls = [EngineCall(headers, request.remote or "", self._loop) for _ in plan.requests]
        try:
            for call, payload in zip(calls, plan.requests, strict=True):
                call.start(self._forwarder, payload)
            if plan.stream:
                return await stream_choices(request, calls, plan, kind, request_id, model)
            return await self._unary(calls, plan, kind, request_id, model)
        finally:
            for call in calls:
                call.cancel()  # a no-op for calls that ended; the rest were abandoned (a client gone)

    async def _unary(self, calls: list[EngineCall], plan: Plan, kind: str, request_id: str, model: str) -> web.Response:
        answer_type = generate_pb2.ChatResponse if kind == "chat" else generate_pb2.GenerateResponse
        answers: list[Any] = []
        for call in calls:  # all run at once; awaiting them in order is enough
            payloads = await call.collect()
            status = call.status
            if status.code is not grpc.StatusCode.OK:
                return error_response(error_for_status(status.code, status.message), request_id)
            answers.append(answer_type.FromString(payloads[-1]) if payloads else answer_type())
        if kind == "chat":
            body = responses.chat_completion(request_id, model, plan.created, answers, plan.logprobs)
        else:
            body = responses.text_completion(request_id, model, plan.created, answers, plan.n, plan.logprobs)
        return json_response(body, headers={REQUEST_ID_KEY: request_id})

    # --- request reading ----------------------------------------------------------------------

    def _check_key(self, request: web.BaseRequest) -> web.Response | None:
        forwarder = self._forwarder
        if not forwarder.requires_api_key:
            return None
        values = [value.encode("latin-1") for value in request.headers.getall("Authorization", [])]
        if forwarder.accepts_authorization(values):
            return None
        return error_response(error(401, HTTP_UNAUTHENTICATED_MESSAGE, "authentication_error", "invalid_api_key"))

    @staticmethod
    async def _read_json(request: web.BaseRequest) -> Any:
        raw = await request.read()
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise RequestError("the request body is not valid JSON") from None

    @staticmethod
    def _call_headers(request: web.BaseRequest, plan: Plan, request_id: str) -> list[tuple[bytes, bytes]]:
        """What a gRPC client would have sent: the front door reads these exactly as it reads theirs."""
        headers = [(b":path", plan.path), (REQUEST_ID_KEY.encode(), request_id.encode())]
        for name in ("Authorization", RANK_KEY, RANK_BIN_KEY):
            for value in request.headers.getall(name, []):
                headers.append((name.lower().encode(), value.encode("latin-1")))
        timeouts = request.headers.getall(TIMEOUT_HEADER, [])
        if timeouts:
            try:
                seconds = float(timeouts[0])
            except ValueError:
                seconds = -1.0
            if len(timeouts) != 1 or not 0 < seconds < 1e8:
                raise RequestError(f"the {TIMEOUT_HEADER} header must be one positive number of seconds")
            headers.append((b"grpc-timeout", format_timeout(seconds)))
        return headers

    def _default_model(self) -> str:
        """The first connected engine's model (without a routing view of every engine: issue 27)."""
        for engine in self._pool.engines:
            if engine.identity is not None:
                return engine.identity.model
        return ""
