"""A small JSON-over-HTTP transport on urllib: auth headers, 429 backoff, no redirects.

Both API clients share it so that rate-limit handling and the refusal to follow redirects
(which would carry our tokens to whatever host a response names) are written once. The sleep
function is injected so tests exercise backoff without waiting.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

_LINK = re.compile(r'<([^>]*)>\s*;\s*rel="([^"]*)"')


class HttpError(Exception):
    """A non-2xx answer (after retries), kept with its status so callers can report it."""

    def __init__(self, method: str, url: str, status: int, body: bytes) -> None:
        self.method = method
        self.url = url
        self.status = status
        self.body = body
        super().__init__(f"{method} {url} -> HTTP {status}: {body[:200].decode('utf-8', 'replace')}")


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> object:
        return json.loads(self.body) if self.body else None

    def link(self, rel: str) -> str | None:
        """The URL for ``rel`` in an RFC 8288 ``Link`` header, as GitHub and Buildkite send."""
        for url, name in _LINK.findall(self.headers.get("link", "")):
            if name == rel:
                return url
        return None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long to wait after an HTTP 429 and how many times to try in all."""

    attempts: int = 5
    base_delay: float = 1.0
    max_delay: float = 60.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts counts the first try and must be at least 1")

    def delay(self, retry: int, headers: Mapping[str, str]) -> float:
        """Honour ``Retry-After`` (GitHub) or ``RateLimit-Reset`` (Buildkite), else back off 2^n."""
        for name in ("retry-after", "ratelimit-reset"):
            value = headers.get(name)
            if value is not None:
                try:
                    return min(self.max_delay, max(0.0, float(value)))
                except ValueError:
                    break
        return min(self.max_delay, self.base_delay * (2**retry))


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Turn redirects into errors: a redirect would resend our Authorization header elsewhere."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        return None


@dataclass(slots=True)
class Transport:
    """Sends JSON requests with fixed headers; retries 429 only, everything else is reported."""

    headers: Mapping[str, str]
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    sleep: Callable[[float], None] = time.sleep
    timeout: float = 30.0
    _opener: urllib.request.OpenerDirector = field(
        default_factory=lambda: urllib.request.build_opener(_NoRedirect()), repr=False
    )

    def request(self, method: str, url: str, payload: object = None) -> Response:
        """Send one request; raise `HttpError` for non-2xx answers once retries are spent."""
        if urlsplit(url).scheme not in {"http", "https"}:
            raise ValueError(f"refusing non-HTTP URL {url!r}")
        data = None if payload is None else json.dumps(payload).encode()
        headers = dict(self.headers)
        if data is not None:
            headers["Content-Type"] = "application/json"
        retries = 0
        while True:
            response = self._send(urllib.request.Request(url, data=data, headers=headers, method=method))
            if response.status == 429 and retries + 1 < self.retry.attempts:
                self.sleep(self.retry.delay(retries, response.headers))
                retries += 1
                continue
            if not 200 <= response.status < 300:
                raise HttpError(method, url, response.status, response.body)
            return response

    def _send(self, request: urllib.request.Request) -> Response:
        try:
            with self._opener.open(request, timeout=self.timeout) as reply:
                return Response(reply.status, _lower(reply.headers.items()), reply.read())
        except urllib.error.HTTPError as error:
            with error:
                return Response(error.code, _lower(error.headers.items()), error.read())


def _lower(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Header names are case-insensitive; lower-case them once so lookups are plain dict gets."""
    return {name.lower(): value for name, value in items}


def same_endpoint(url: str, endpoint: str) -> bool:
    """True when ``url`` is ``endpoint`` with only a different query: same scheme, host, path.

    Used before following a pagination link, so an answer cannot send our token (or our next
    cancel) to another host, another pipeline or another API path.
    """
    a, b = urlsplit(url), urlsplit(endpoint)
    return (a.scheme, a.netloc, a.path, a.fragment) == (
        b.scheme,
        b.netloc,
        b.path,
        "",
    ) and "@" not in a.netloc
