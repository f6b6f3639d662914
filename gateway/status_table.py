"""The one table from gateway errors to gRPC status codes (which outcomes count against an engine's
circuit breaker is `gateway.health_state.BREAKER_BLAME`).

Every place that turns an exception into a status goes through `status_for`, so a new error class
gets its code here or nowhere (an unknown exception becomes INTERNAL with a fixed message: never a
Python traceback to the client).
"""

from __future__ import annotations

from typing import Final

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

STATUS_FOR_ERROR: Final[dict[type[GatewayError], grpc.StatusCode]] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
}

INTERNAL_ERROR_MESSAGE: Final = "internal gateway error"


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
