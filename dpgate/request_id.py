"""The `x-request-id` metadata: one id per call, kept from the client through gateway and engine.

A client may name its call with `x-request-id`; the gateway forwards the id to the engine, both
log it on the call's lines, and the gateway echoes it in trailing metadata. An id that is
missing is made (a uuid4 hex); one that breaks the rule (1 to 128 printable ASCII characters,
0x20-0x7E, as gRPC allows in ASCII metadata, and one value only) is replaced by a fresh one
rather than failing the call: the id is for finding log lines, not worth refusing work over.
It is unrelated to the `request_id` body field of Generate, which names a request for Abort.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

REQUEST_ID_KEY = "x-request-id"
MAX_REQUEST_ID_LENGTH = 128


# The bits RFC 9562 fixes in a version 4 UUID: version 4 (0100) and variant 10.
_UUID4_CLEAR = (0xF000 << 64) | (0xC000 << 48)
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)
_IDS_PER_READ = 256
# Printable ASCII, 0x20-0x7E, matched in C (a Python loop over the characters was a tenth of the
# HTTP path's per-call request-id work, issue 27).
_PRINTABLE_BYTES = re.compile(rb"[\x20-\x7e]*")
_PRINTABLE_TEXT = re.compile(r"[\x20-\x7e]*")


class _RandomIds:
    """Random 128-bit values from os.urandom read 256 at a time: one getrandom call per 256 ids
    instead of one each (the gateway makes an id for every call that brings none, and the system
    call showed in its profile, issue 27). A forked child starts with nothing read, so it never
    hands out its parent's values."""

    def __init__(self) -> None:
        self._values: list[int] = []

    def take(self) -> int:
        if not self._values:
            data = os.urandom(16 * _IDS_PER_READ)
            self._values = [int.from_bytes(data[i : i + 16]) for i in range(0, len(data), 16)]
        return self._values.pop()

    def forget(self) -> None:
        self._values = []


_random_ids = _RandomIds()
os.register_at_fork(after_in_child=_random_ids.forget)


def new_request_id() -> str:
    """A random uuid4 in hex, what `uuid.uuid4().hex` gives, from urandom's bytes as uuid4's are,
    without a UUID object or a system call each."""
    return f"{(_random_ids.take() & ~_UUID4_CLEAR) | _UUID4_SET:032x}"


def request_id_problem(values: Sequence[str | bytes]) -> str | None:
    """Why the call's `x-request-id` values cannot be used as its id; None when exactly one valid one was sent."""
    if not values:
        return "was not sent"
    if len(values) > 1:
        return f"was sent {len(values)} times"
    value = values[0]
    if not value:
        return "is empty"
    if len(value) > MAX_REQUEST_ID_LENGTH:
        return f"is {len(value)} characters long, more than {MAX_REQUEST_ID_LENGTH}"
    printable = _PRINTABLE_BYTES if isinstance(value, bytes) else _PRINTABLE_TEXT
    if printable.fullmatch(value) is None:  # type: ignore[arg-type]
        return "has characters outside printable ASCII"
    return None


def resolve_request_id(values: Sequence[str | bytes]) -> tuple[str, str | None]:
    """(the call's id, why the sent value was replaced or None): the sent id when usable, else a new one."""
    problem = request_id_problem(values)
    if problem is None:
        value = values[0]
        return (value.decode("ascii") if isinstance(value, bytes) else value), None
    return new_request_id(), problem
