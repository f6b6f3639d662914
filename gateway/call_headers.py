"""A call's request headers as the front door reads them, in one pass, and the `x-request-id` field it
sends on: shared by the forwarder that admits a call and the call objects that relay it."""

from __future__ import annotations

from typing import Final

from gateway.grpc_wire import parse_timeout
from gateway.http2.connection import Headers
from gateway.http2.header_codec import encode_literal
from gateway.metadata import RANK_BIN_KEY, RANK_KEY

_RANK_KEYS: Final = (RANK_KEY.encode(), RANK_BIN_KEY.encode())
_PASSED_HEADERS: Final = (b"grpc-encoding", b"grpc-accept-encoding")
REQUEST_ID_KEY: Final = b"x-request-id"


def request_id_field(request_id: str) -> bytes:
    """The encoded `x-request-id` field, for the engine's request headers and the client's trailers."""
    return encode_literal(REQUEST_ID_KEY, request_id.encode())


class CallHeaders:
    """What the front door reads from a call's request headers, in one pass."""

    __slots__ = ("authorization", "encoding", "passed", "path", "rank_fields", "request_ids", "tenant_field", "timeout")

    def __init__(self, headers: Headers) -> None:
        self.path = b""
        self.timeout: float | None = None
        self.authorization: list[bytes] = []
        self.rank_fields: list[tuple[str, bytes]] = []
        self.request_ids: list[bytes] = []
        self.encoding: bytes | None = None  # grpc-encoding of the request messages
        self.tenant_field = b""  # set by the forwarder from the API key; a client's own is never read
        passed = b""
        for name, value in headers:
            if name == b":path":
                self.path = value
            elif name == b"grpc-timeout":
                self.timeout = parse_timeout(value)
            elif name == b"authorization":
                self.authorization.append(value)
            elif name in _RANK_KEYS:
                self.rank_fields.append((name.decode(), value))
            elif name == REQUEST_ID_KEY:
                self.request_ids.append(value)
            elif name in _PASSED_HEADERS:
                passed += encode_literal(name, value)
                if name == b"grpc-encoding":
                    self.encoding = value
        self.passed = passed
