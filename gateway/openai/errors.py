"""Errors as OpenAI clients read them: one table from gRPC status to HTTP status and error type.

Every failure of an HTTP request ends here: a field the translation refuses (`RequestError`,
400 naming the field and the rule), or the status a dpgate.v1 call ended with (the front door's
refusal, the engine's answer). The body is OpenAI's error object, `{"error": {"message", "type",
"param", "code"}}`, which the `openai` package turns into its exception types by HTTP status
(400 BadRequestError, 401 AuthenticationError, 404 NotFoundError, 429 RateLimitError, 5xx
InternalServerError). 429 and 503 carry Retry-After, which the package's retries honour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import grpc

RETRY_AFTER_S: Final = 1


class RequestError(ValueError):
    """An HTTP request field breaks a rule (400); the message names the field and the rule."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True, slots=True)
class HttpError:
    """One error answer: HTTP status, OpenAI error type and code, and the message."""

    status: int
    type: str
    code: str | None
    message: str
    param: str | None = None

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(RETRY_AFTER_S)} if self.status in (429, 503) else {}


# gRPC status -> (HTTP status, OpenAI error type, code). INVALID_ARGUMENT covers the engine's
# refusals of a value (a temperature out of range) and the front door's (the rank rule).
_TABLE: Final[dict[grpc.StatusCode, tuple[int, str, str | None]]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error", None),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error", None),
    grpc.StatusCode.FAILED_PRECONDITION: (400, "invalid_request_error", None),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error", "invalid_api_key"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error", None),
    grpc.StatusCode.NOT_FOUND: (404, "invalid_request_error", "model_not_found"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error", "rate_limit_exceeded"),
    grpc.StatusCode.CANCELLED: (499, "invalid_request_error", "cancelled"),
    grpc.StatusCode.UNIMPLEMENTED: (501, "server_error", "not_implemented"),
    grpc.StatusCode.UNAVAILABLE: (503, "server_error", "unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "server_error", "timeout"),
}


def error_for_status(code: grpc.StatusCode, message: str) -> HttpError:
    """The HTTP answer for a call that ended with `code` (anything unlisted is a 500)."""
    status, kind, error_code = _TABLE.get(code, (500, "server_error", "internal_error"))
    param = "model" if code is grpc.StatusCode.NOT_FOUND else None
    return HttpError(status, kind, error_code, message or code.name, param)


def error_for_request(error: RequestError) -> HttpError:
    return HttpError(400, "invalid_request_error", None, error.message, error.param)


def error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> HttpError:
    """An error the HTTP layer decides itself (401 before any call, 404 path, 413 body)."""
    return HttpError(status, kind, code, message)
