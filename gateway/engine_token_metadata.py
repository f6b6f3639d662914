"""The engine token on the gateway's control channel (grpc.aio) to each engine: every call carries
metadata `x-dpgate-engine-token` (dpgate/engine_token.py); the relayed data path adds the same
header in `UpstreamLink`. One interceptor per call shape the channel makes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grpc import aio

from dpgate.engine_token import ENGINE_TOKEN_KEY


def _with_token(details: aio.ClientCallDetails, token: str) -> aio.ClientCallDetails:
    metadata = aio.Metadata(*(details.metadata or ()))
    metadata.add(ENGINE_TOKEN_KEY, token)
    return aio.ClientCallDetails(details.method, details.timeout, metadata, details.credentials, details.wait_for_ready)


class _UnaryUnary(aio.UnaryUnaryClientInterceptor):
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_unary_unary(self, continuation: Callable, details: aio.ClientCallDetails, request: Any):
        return await continuation(_with_token(details, self._token), request)


class _UnaryStream(aio.UnaryStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_unary_stream(self, continuation: Callable, details: aio.ClientCallDetails, request: Any):
        return await continuation(_with_token(details, self._token), request)


def engine_token_interceptors(token: str | None) -> list[aio.ClientInterceptor] | None:
    """Interceptors that add the token to every call, or None without a token."""
    if token is None:
        return None
    return [_UnaryUnary(token), _UnaryStream(token)]
