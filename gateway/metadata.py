"""Parsing of the `x-data-parallel-rank` request metadata (DESIGN.md, front door rule 1).

The rule is strict on purpose: a client that pins a rank and gets a silently different one has a
worse bug than one whose call fails at once. So anything but plain ASCII digits (an optional
leading `+`) within 0..2^32-1, after stripping ASCII whitespace, fails the call with one fixed
message, before any engine is contacted. Two values and a binary (`-bin`) key are refused too:
guessing which value was meant is exactly the silent fallback the rule forbids.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from gateway.errors import InvalidArgument

RANK_KEY: Final = "x-data-parallel-rank"
RANK_BIN_KEY: Final = RANK_KEY + "-bin"
RANK_ERROR_MESSAGE: Final = "x-data-parallel-rank metadata must be an unsigned 32-bit integer"
MAX_RANK: Final = 2**32 - 1

# HTTP's notion of ASCII whitespace; str.strip() with no argument would also strip Unicode spaces.
_ASCII_WHITESPACE: Final = " \t\n\r\f\v"
_DIGITS: Final = frozenset("0123456789")


def parse_rank_value(value: str | bytes) -> int:
    """Return the rank one metadata value names, or raise InvalidArgument with the fixed message."""
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            raise InvalidArgument(RANK_ERROR_MESSAGE) from None
    if not value.isascii():
        raise InvalidArgument(RANK_ERROR_MESSAGE)
    text = value.strip(_ASCII_WHITESPACE)
    if text.startswith("+"):
        text = text[1:]
    # int() alone would accept "1_0", " 1", "-1" and Unicode digits; check the characters first.
    if not text or not _DIGITS.issuperset(text):
        raise InvalidArgument(RANK_ERROR_MESSAGE)
    rank = int(text)
    if rank > MAX_RANK:
        raise InvalidArgument(RANK_ERROR_MESSAGE)
    return rank


def parse_data_parallel_rank(metadata: Iterable[tuple[str, str | bytes]] | None) -> int | None:
    """Return the pinned rank in a call's metadata, None when there is no pin.

    `metadata` is the call's invocation metadata as (key, value) pairs; gRPC lower-cases keys, and
    keys are compared lower-cased here too so a direct caller gets the same answer.
    """
    if not metadata:
        return None
    found: str | bytes | None = None
    num_found = 0
    for key, value in metadata:
        lowered = key.lower()
        if lowered == RANK_KEY:
            found = value
            num_found += 1
        elif lowered == RANK_BIN_KEY:
            raise InvalidArgument(RANK_ERROR_MESSAGE)
    if num_found == 0 or found is None:
        return None
    if num_found > 1:
        raise InvalidArgument(RANK_ERROR_MESSAGE)
    return parse_rank_value(found)
