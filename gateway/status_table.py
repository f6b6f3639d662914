"""The one table from gateway errors to gRPC status codes, and which engine codes count as failures.

Every place that turns an exception into a status goes through `status_for`, so a new error class
gets its code here or nowhere (an unknown exception becomes INTERNAL with a fixed message: never a
Python traceback to the client).
"""

from __future__ import annotations

import grpc

from gateway.errors import (
    EngineFailed,
    GatewayError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)

STATUS_FOR_ERROR: dict[type[GatewayError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
}

INTERNAL_ERROR_MESSAGE = "internal gateway error"

# Codes from an engine that say the engine (not the request) failed: they count against its
# circuit breaker. RESOURCE_EXHAUSTED (a full queue) is back-pressure from a working engine, and
# client-side outcomes (CANCELLED, DEADLINE_EXCEEDED, INVALID_ARGUMENT, ...) say nothing about it.
ENGINE_FAILURE_CODES: frozenset[grpc.StatusCode] = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DATA_LOSS,
    }
)


def status_for(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and client-safe message for an exception raised while serving a call."""
    if isinstance(error, EngineFailed):
        return grpc.StatusCode[error.code_name], error.message
    if isinstance(error, GatewayError):
        for error_type in type(error).__mro__:
            code = STATUS_FOR_ERROR.get(error_type)  # type: ignore[arg-type]
            if code is not None:
                return code, error.message
    return grpc.StatusCode.INTERNAL, INTERNAL_ERROR_MESSAGE
