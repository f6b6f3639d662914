"""API keys: `authorization: Bearer KEY`; a missing or wrong key is UNAUTHENTICATED.

Health checks are exempt so orchestrators can probe without a key. Keys are compared in constant
time so response timing does not reveal how much of a guess was right.
"""

from __future__ import annotations

import hmac

import grpc
from grpc import aio

from gateway.interceptors.handlers import HEALTH_PREFIX, refusing_handler

UNAUTHENTICATED_MESSAGE = "missing or invalid API key: send metadata `authorization: Bearer KEY`"


class AuthInterceptor(aio.ServerInterceptor):
    def __init__(self, api_keys: tuple[str, ...]) -> None:
        self._accepted = tuple(f"Bearer {key}".encode() for key in api_keys)

    def _is_authorized(self, metadata) -> bool:
        values = [value for key, value in metadata or () if key == "authorization"]
        if len(values) != 1 or not isinstance(values[0], str):
            return False
        offered = values[0].encode()
        # Compare against every key (no early exit) so timing does not reveal which key matched.
        matches = [hmac.compare_digest(offered, accepted) for accepted in self._accepted]
        return any(matches)

    async def intercept_service(self, continuation, handler_call_details: grpc.HandlerCallDetails):
        if handler_call_details.method.startswith(HEALTH_PREFIX) or self._is_authorized(
            handler_call_details.invocation_metadata
        ):
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        streaming = handler is not None and handler.response_streaming
        return refusing_handler(streaming, grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
