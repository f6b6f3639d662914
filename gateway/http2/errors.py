"""The two kinds of HTTP/2 error (RFC 9113 section 5.4): one ends the connection, one a stream."""

from __future__ import annotations


class ProtocolViolation(Exception):
    """A connection error: the connection ends with GOAWAY carrying `error_code`, then closes."""

    def __init__(self, error_code: int, reason: str) -> None:
        super().__init__(reason)
        self.error_code = error_code


class MalformedHeaders(Exception):
    """A field block that breaks RFC 9113 section 8 (a malformed message): a stream error."""


class HeadersTooLarge(Exception):
    """A field block over SETTINGS_MAX_HEADER_LIST_SIZE; `size` counts as RFC 9113 section 6.5.2."""

    def __init__(self, size: int) -> None:
        super().__init__(f"header list of {size} bytes")
        self.size = size
