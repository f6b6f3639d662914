"""Helpers shared by the interceptors: which calls they cover, and handlers that refuse a call.

A refusing handler is built once per (cardinality, code, message) and reused, so refusing a call
allocates nothing; it aborts before the servicer runs, so no engine is contacted and no stream
opens.
"""

from __future__ import annotations

import functools

import grpc
from grpc import aio

DPGATE_PREFIX = "/dpgate.v1."
HEALTH_PREFIX = "/grpc.health.v1.Health/"


def is_dpgate_method(method: str) -> bool:
    return method.startswith(DPGATE_PREFIX)


@functools.cache
def refusing_handler(response_streaming: bool, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler that ends the call with `code` and `message`, of the given response cardinality."""

    async def refuse(request: bytes, context: aio.ServicerContext) -> None:
        await context.abort(code, message)

    if response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)
