"""Webhook mode: verify ``X-Hub-Signature-256`` and hand verified events to the dispatcher.

The Actions workflow needs none of this (GitHub itself delivers the event there). It exists
for running the commands as a small service that receives GitHub webhooks directly; then the
HMAC signature is the only thing standing between the internet and our Buildkite token, so it
is checked before the body is parsed, in constant time, and an empty secret never verifies.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Final

SIGNATURE_HEADER: Final = "X-Hub-Signature-256"
EVENT_HEADER: Final = "X-GitHub-Event"
MAX_BODY: Final = 1 << 20
"""GitHub caps webhook payloads at 25 MB, but comment events are small; refuse anything big."""


def sign(secret: bytes, body: bytes) -> str:
    """The header value GitHub sends for ``body``: ``sha256=`` and the hex HMAC-SHA256."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify_signature(secret: bytes, body: bytes, header: str | None) -> bool:
    """True only for a non-empty secret and a header equal to `sign` (constant-time compare)."""
    if not secret or not header or not header.startswith("sha256="):
        return False
    return hmac.compare_digest(sign(secret, body).encode(), header.encode())


def make_receiver(
    secret: bytes,
    handle: Callable[[Mapping[str, object]], object],
    host: str = "127.0.0.1",
    port: int = 0,
) -> ThreadingHTTPServer:
    """A threading HTTP server that passes verified ``issue_comment`` payloads to ``handle``.

    The caller owns the server's lifetime (``serve_forever`` / ``shutdown``). Deliveries of
    other event kinds are acknowledged and dropped, so GitHub does not retry them.
    """
    if not secret:
        raise ValueError("a webhook receiver needs a non-empty secret")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length <= 0 or length > MAX_BODY:
                self._reply(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE if length > MAX_BODY else HTTPStatus.BAD_REQUEST
                )
                return
            body = self.rfile.read(length)
            if not verify_signature(secret, body, self.headers.get(SIGNATURE_HEADER)):
                self._reply(HTTPStatus.UNAUTHORIZED)
                return
            if self.headers.get(EVENT_HEADER) != "issue_comment":
                self._reply(HTTPStatus.NO_CONTENT)
                return
            try:
                payload = json.loads(body)
            except ValueError:
                self._reply(HTTPStatus.BAD_REQUEST)
                return
            if not isinstance(payload, Mapping):
                self._reply(HTTPStatus.BAD_REQUEST)
                return
            try:
                outcome = handle(payload)
            except Exception as error:  # the server must answer; GitHub shows the status
                self.log_error("handling delivery failed: %r", error)
                self._reply(HTTPStatus.INTERNAL_SERVER_ERROR)
                return
            self._reply(HTTPStatus.OK, str(getattr(outcome, "name", outcome)).encode())

        def _reply(self, status: HTTPStatus, body: bytes = b"") -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body:
                self.wfile.write(body)

    return ThreadingHTTPServer((host, port), Handler)
