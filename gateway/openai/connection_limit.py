"""A connection past the HTTP API's limit (`--http-max-connections`): one 503 and close.

Answered here, before aiohttp sees it, so the client can read why rather than meet a reset. A
module of its own: the server module is compiled by mypyc (gateway/compiled.py), which cannot
compile a subclass of asyncio's Python classes.
"""

from __future__ import annotations

import asyncio
import json

from gateway.openai.errors import error


class RefusedConnection(asyncio.Protocol):
    """A connection past the limit: one 503 and close (the client can read why)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        answer = error(503, f"the gateway is at its limit of {self._limit} HTTP connections", "server_error")
        body = json.dumps(answer.body()).encode()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
            f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        transport.write(head.encode() + body)  # type: ignore[attr-defined]  (uvloop's TCP transport)
        transport.close()
