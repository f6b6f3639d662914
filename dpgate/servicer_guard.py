"""What every dpgate grpc.aio server promises its clients, for every method it serves.

Two rules, kept by one server interceptor (`ServicerGuard`) on the engine's server and on the
gateway's local services, so they hold for dpgate.v1, grpc.health.v1 and reflection alike:

- A request body that is not a valid message of the method's request type is refused with
  INVALID_ARGUMENT `request body is not a valid <full message name> message`, before the
  handler runs. gRPC itself deserializes before the handler and answers a failure with UNKNOWN
  `Unexpected <class 'google.protobuf.message.DecodeError'>: ...`: the wrong code, and Python in
  the message. So the guard registers each method without a request deserializer (it receives
  the raw bytes) and parses them itself, where it has the call's context to answer with.
- An exception a handler did not turn into a status becomes INTERNAL with a fixed message (the
  exception is logged): never a Python type name, text or traceback.

The guard wraps each method's handler once and reuses it. It lives in `dpgate` because both the
engine and the gateway use it and neither may import the other.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from grpc import aio

logger = logging.getLogger("dpgate.servicer_guard")


def invalid_body_message(type_name: str) -> str:
    return f"request body is not a valid {type_name} message"


def request_type_name(method: str, deserializer: Callable[[bytes], Any]) -> str:
    """The full protobuf name of `method`'s request type (`method` is `/package.Service/Method`)."""
    service, _, name = method.lstrip("/").rpartition("/")
    try:
        return descriptor_pool.Default().FindMethodByName(f"{service}.{name}").input_type.full_name
    except KeyError:
        pass
    descriptor = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    return getattr(descriptor, "full_name", "request")


class ServicerGuard(aio.ServerInterceptor):
    """See the module docstring. `internal_message` is the text of the INTERNAL fallback;
    `on_invalid_body(method)` is called for each refused body (e.g. to count it)."""

    def __init__(self, internal_message: str, on_invalid_body: Callable[[str], None] | None = None) -> None:
        self._internal_message = internal_message
        self._on_invalid_body = on_invalid_body
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = _MethodGuard(self, method, handler).handler()
        self._wrapped[method] = (handler, wrapped)
        return wrapped


class _MethodGuard:
    """The guarded behaviour of one method: parse the body, run the handler, catch the unexpected."""

    def __init__(self, guard: ServicerGuard, method: str, handler: grpc.RpcMethodHandler) -> None:
        self._guard = guard
        self._method = method
        self._handler = handler
        self._parse = handler.request_deserializer
        self._invalid = invalid_body_message(request_type_name(method, self._parse)) if self._parse else ""

    def handler(self) -> grpc.RpcMethodHandler:
        h = self._handler
        if h.unary_unary is not None:
            return h._replace(request_deserializer=None, unary_unary=self._unary(h.unary_unary))
        if h.unary_stream is not None:
            return h._replace(request_deserializer=None, unary_stream=self._streaming(h.unary_stream, False))
        if h.stream_unary is not None:
            return h._replace(request_deserializer=None, stream_unary=self._unary(h.stream_unary, True))
        return h._replace(request_deserializer=None, stream_stream=self._streaming(h.stream_stream, True))

    async def _request(self, raw: Any, context: aio.ServicerContext) -> Any:
        if self._parse is None:
            return raw
        try:
            return self._parse(raw)
        except Exception:
            if self._guard._on_invalid_body is not None:
                self._guard._on_invalid_body(self._method)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, self._invalid)

    def _requests(self, raw_requests: AsyncIterator[Any], context: aio.ServicerContext) -> AsyncIterator[Any]:
        async def parsed() -> AsyncIterator[Any]:
            async for raw in raw_requests:
                yield await self._request(raw, context)

        return parsed()

    async def _failed(self, context: aio.ServicerContext) -> None:
        logger.exception("%s raised", self._method)
        code = context.code()
        if code is not None and code is not grpc.StatusCode.OK:
            # The handler chose a status before it raised: keep it, as gRPC would.
            await context.abort(code, context.details() or code.name)
        await context.abort(grpc.StatusCode.INTERNAL, self._guard._internal_message)

    def _unary(self, behaviour: Callable, request_streaming: bool = False) -> Callable:
        async def guarded(request: Any, context: aio.ServicerContext) -> Any:
            if request_streaming:
                request = self._requests(request, context)
            else:
                request = await self._request(request, context)
            try:
                result = behaviour(request, context)
                return await result if inspect.isawaitable(result) else result
            except aio.AbortError:
                raise
            except Exception:
                await self._failed(context)

        return guarded

    def _streaming(self, behaviour: Callable, request_streaming: bool) -> Callable:
        if not inspect.isasyncgenfunction(behaviour):
            # A coroutine that answers with `context.write` (or a plain function): same as unary.
            return self._unary(behaviour, request_streaming)

        async def guarded(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
            if request_streaming:
                request = self._requests(request, context)
            else:
                request = await self._request(request, context)
            try:
                # Closed at once when this generator is (the client went away), not by the GC.
                async with contextlib.aclosing(behaviour(request, context)) as responses:
                    async for response in responses:
                        yield response
            except aio.AbortError:
                raise
            except Exception:
                await self._failed(context)

        return guarded
