"""Errors the gateway raises for a call, one class per gRPC status code.

The pure core raises these without importing grpc; `gateway.status_table` maps each class to its
StatusCode in one place, so no module decides status codes on its own. The message is the exact
text the client receives, so it must never contain a traceback or internal detail.
"""

from __future__ import annotations


class GatewayError(Exception):
    """A call-level failure whose message is safe to send to the client."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(GatewayError):
    """The client sent something malformed (bad metadata, a rank no engine owns)."""


class NotFound(GatewayError):
    """The client asked for a model no engine serves."""


class Unavailable(GatewayError):
    """No engine can take the call right now (unhealthy, circuit open, draining)."""


class ResourceExhausted(GatewayError):
    """The call is too large or the gateway is full."""


class Unauthenticated(GatewayError):
    """The API key is missing or wrong."""


class EngineFailed(GatewayError):
    """An engine ended the call with a status; the gateway relays it (`code_name` is its name).

    Kept as a name rather than a grpc.StatusCode so this module stays free of grpc.
    """

    def __init__(self, code_name: str, message: str) -> None:
        super().__init__(message)
        self.code_name = code_name
