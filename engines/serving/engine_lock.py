"""The engine's lock: with a token, every call but grpc.health.v1 must carry it (dpgate/engine_token.py).

A grpc.aio server interceptor, installed before the servicer guard: a call without the token
never reaches a handler, and its refusal is UNAUTHENTICATED with a fixed sentence (the token is
never logged or echoed).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
from grpc import aio

from dpgate.engine_token import ENGINE_TOKEN_KEY, HEALTH_PREFIX, UNAUTHENTICATED_MESSAGE, token_matches


async def _deny_unary(request: object, context: aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)


async def _deny_stream(request: object, context: aio.ServicerContext):
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
    yield  # an async generator, as a server-streaming handler must be


_DENY = {
    (False, False): grpc.unary_unary_rpc_method_handler(_deny_unary),
    (False, True): grpc.unary_stream_rpc_method_handler(_deny_stream),
    (True, False): grpc.stream_unary_rpc_method_handler(_deny_unary),
    (True, True): grpc.stream_stream_rpc_method_handler(_deny_stream),
}


class EngineLock(aio.ServerInterceptor):
    """Refuses calls without the engine token; grpc.health.v1 stays open for probes."""

    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(HEALTH_PREFIX):
            return handler
        offered = [value for key, value in handler_call_details.invocation_metadata or () if key == ENGINE_TOKEN_KEY]
        if token_matches(offered, self._token):
            return handler
        return _DENY[(handler.request_streaming, handler.response_streaming)]
