"""What a field block must satisfy to be a well-formed HTTP/2 message (RFC 9113 section 8).

Pure functions over decoded `(name, value)` pairs. Each returns what the connection needs
(content-length, :status) or raises `MalformedHeaders` (the stream is reset with PROTOCOL_ERROR)
or `HeadersTooLarge` (over SETTINGS_MAX_HEADER_LIST_SIZE; still a well-formed block).

Rules enforced, in every block: names are lowercase tokens; values hold no NUL, CR or LF;
pseudo-headers come first, once each, only the ones the message kind defines, and never in
trailers; no connection-specific field (`connection`, `keep-alive`, `proxy-connection`,
`transfer-encoding`, `upgrade`); `te` only in requests and only `trailers`; `content-length`
digits, one value. Requests carry :method, :scheme and a non-empty :path (CONNECT: :authority
only) and a `host` that agrees with :authority; responses one three-digit :status, never 101.

Deliberately not enforced: leading or trailing whitespace in values (RFC 9113 8.2.1 asks
implementations to validate it with a SHOULD). gRPC clients send such metadata as given, and
the front door's rule for `x-data-parallel-rank` is to strip it (DESIGN.md rule 1).
"""

from __future__ import annotations

import re
from typing import Final

from gateway.http2.errors import HeadersTooLarge, MalformedHeaders

Headers = list[tuple[bytes, bytes]]

# RFC 9110 section 5.1: a field name is a token; RFC 9113 section 8.2.1 adds: no uppercase.
_NAME: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9a-z]+")
_CONNECTION_SPECIFIC: Final = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade")
)
_METHOD: Final = 1
_SCHEME: Final = 2
_AUTHORITY: Final = 4
_PATH: Final = 8
_REQUEST_PSEUDO: Final = {b":method": _METHOD, b":scheme": _SCHEME, b":authority": _AUTHORITY, b":path": _PATH}
# Regular fields (name and value) already found valid: the same dozen arrive on every call, so
# most fields cost one set lookup. The caps keep a client inventing fields from growing it.
_valid_fields: set[tuple[bytes, bytes]] = set()
_valid_names: set[bytes] = set()  # names alone, for fields whose values change (grpc-timeout)
_MAX_CACHED_FIELDS: Final = 4096
_MAX_CACHED_VALUE: Final = 256
# Never cached: the fields the rules read, and gRPC's deadline (a new value on every call).
_UNCACHED: Final = frozenset((b"te", b"content-length", b"host", b"grpc-timeout"))
_FIELD_OVERHEAD: Final = 32  # RFC 9113 section 6.5.2: each field counts its name, value and 32 bytes


def _check_regular(name: bytes, value: bytes) -> None:
    """A regular field's name and value; valid ones the rules do not read are cached."""
    if name not in _valid_names:
        if _NAME.fullmatch(name) is None:
            raise MalformedHeaders(f"invalid field name {name[:64]!r}")
        if name in _CONNECTION_SPECIFIC:
            raise MalformedHeaders(f"connection-specific field {name.decode()}")
        if len(_valid_names) < _MAX_CACHED_FIELDS:
            _valid_names.add(name)
    _check_value(value)
    if name not in _UNCACHED and len(value) <= _MAX_CACHED_VALUE and len(_valid_fields) < _MAX_CACHED_FIELDS:
        _valid_fields.add((name, value))


def _check_value(value: bytes) -> None:
    if b"\n" in value or b"\r" in value or b"\x00" in value:
        raise MalformedHeaders("field value with NUL, CR or LF")


def _content_length(value: bytes, previous: int | None) -> int:
    if not value.isdigit():  # bytes.isdigit is ASCII only
        raise MalformedHeaders("content-length is not a number")
    length = int(value)
    if previous is not None and previous != length:
        raise MalformedHeaders("two different content-length values")
    return length


def check_request(headers: Headers, max_list_size: int) -> int | None:
    """A request's field block; returns its content-length (None when absent)."""
    seen = 0
    is_regular = False
    method = path = scheme = authority = host = None
    content_length = None
    size = _FIELD_OVERHEAD * len(headers)
    valid = _valid_fields
    for field in headers:
        name, value = field
        size += len(name) + len(value)
        if field in valid:
            is_regular = True
            continue
        if name[:1] == b":":
            if is_regular:
                raise MalformedHeaders(f"pseudo-header {name[:64].decode(errors='replace')} after a regular field")
            bit = _REQUEST_PSEUDO.get(name)
            if bit is None:
                raise MalformedHeaders(f"pseudo-header {name[:64].decode(errors='replace')} is not a request's")
            if seen & bit:
                raise MalformedHeaders(f"pseudo-header {name.decode()} twice")
            seen |= bit
            if b"\n" in value or b"\r" in value or b"\x00" in value:
                raise MalformedHeaders("field value with NUL, CR or LF")
            if bit == _PATH:
                path = value
            elif bit == _METHOD:
                method = value
            elif bit == _SCHEME:
                scheme = value
            else:
                authority = value
            continue
        is_regular = True
        if name == b"te":  # in every gRPC request, and never cached (it means something here)
            if value != b"trailers":
                raise MalformedHeaders("te other than trailers")
            continue
        _check_regular(name, value)
        if name == b"content-length":
            content_length = _content_length(value, content_length)
        elif name == b"host":
            host = value
    if size > max_list_size:
        raise HeadersTooLarge(size)
    if method == b"CONNECT":
        if seen != _METHOD | _AUTHORITY:
            raise MalformedHeaders("CONNECT needs :authority and no :scheme or :path")
    elif seen & (_METHOD | _SCHEME | _PATH) != _METHOD | _SCHEME | _PATH:
        raise MalformedHeaders("request without :method, :scheme or :path")
    elif not path:
        raise MalformedHeaders("empty :path")
    elif path[:1] != b"/" and (path != b"*" or method != b"OPTIONS") and scheme in (b"http", b"https"):
        raise MalformedHeaders(":path is neither absolute nor * for OPTIONS")
    if host is not None and authority is not None and host != authority:
        raise MalformedHeaders("host differs from :authority")
    return content_length


def check_response(headers: Headers, max_list_size: int) -> tuple[int, int | None]:
    """A response's field block; returns its :status and content-length."""
    status = None
    is_regular = False
    content_length = None
    size = _FIELD_OVERHEAD * len(headers)
    valid = _valid_fields
    for field in headers:
        name, value = field
        size += len(name) + len(value)
        if field in valid:
            is_regular = True
            continue
        if name[:1] == b":":
            if is_regular:
                raise MalformedHeaders("pseudo-header after a regular field")
            if name != b":status":
                raise MalformedHeaders(f"pseudo-header {name[:64].decode(errors='replace')} is not a response's")
            if status is not None:
                raise MalformedHeaders(":status twice")
            if len(value) != 3 or not value.isdigit():
                raise MalformedHeaders(":status is not three digits")
            status = int(value)
            continue
        is_regular = True
        _check_regular(name, value)
        if name == b"te":
            raise MalformedHeaders("te in a response")
        if name == b"content-length":
            content_length = _content_length(value, content_length)
    if size > max_list_size:
        raise HeadersTooLarge(size)
    if status is None:
        raise MalformedHeaders("response without :status")
    if status == 101:
        raise MalformedHeaders("101 Switching Protocols does not exist in HTTP/2")
    return status, content_length


def check_trailers(headers: Headers, max_list_size: int) -> None:
    """A trailer block (either direction): regular fields only."""
    size = _FIELD_OVERHEAD * len(headers)
    valid = _valid_fields
    for field in headers:
        name, value = field
        size += len(name) + len(value)
        if field in valid:
            continue
        if name[:1] == b":":
            raise MalformedHeaders("pseudo-header in trailers")
        _check_regular(name, value)
        if name == b"te":
            raise MalformedHeaders("te in trailers")
    if size > max_list_size:
        raise HeadersTooLarge(size)
