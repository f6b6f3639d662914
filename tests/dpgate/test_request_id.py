"""The x-request-id rule: the sent id when usable, else a fresh uuid4 hex and the reason."""

from __future__ import annotations

import os
import re
import uuid

import pytest

from dpgate.request_id import MAX_REQUEST_ID_LENGTH, new_request_id, request_id_problem, resolve_request_id


@pytest.mark.parametrize("value", ["a", "req-1/2 x", "~" * MAX_REQUEST_ID_LENGTH, b"bytes-ok", " ", b" ~"])
def test_a_usable_id_is_kept(value):
    kept = value.decode() if isinstance(value, bytes) else value
    assert resolve_request_id([value]) == (kept, None)


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ([], "was not sent"),
        (["a", "b"], "was sent 2 times"),
        ([""], "is empty"),
        (["x" * 129], "is 129 characters long, more than 128"),
        (["caf\u00e9"], "has characters outside printable ASCII"),
        (["tab\there"], "has characters outside printable ASCII"),
        ([b"\x7f"], "has characters outside printable ASCII"),
        ([b"ok\x1f"], "has characters outside printable ASCII"),
        (["ends with a newline\n"], "has characters outside printable ASCII"),
        (["\u0100"], "has characters outside printable ASCII"),
    ],
)
def test_an_unusable_id_is_replaced_by_a_fresh_one(values, problem):
    assert request_id_problem(values) == problem
    first, reason = resolve_request_id(values)
    second, _ = resolve_request_id(values)
    assert reason == problem
    assert re.fullmatch("[0-9a-f]{32}", first) and first != second


def test_a_new_id_is_a_version_4_uuid_in_hex():
    for _ in range(200):
        made = new_request_id()
        parsed = uuid.UUID(hex=made)
        assert parsed.hex == made and parsed.version == 4 and parsed.variant == uuid.RFC_4122
    assert len({new_request_id() for _ in range(200)}) == 200


def test_a_forked_child_makes_ids_its_parent_does_not():
    new_request_id()  # the parent has read ahead
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (runs in the child)
        os.write(writer, new_request_id().encode())
        os._exit(0)
    os.waitpid(child, 0)
    from_child = os.read(reader, 64).decode()
    os.close(reader)
    os.close(writer)
    assert from_child != new_request_id() and uuid.UUID(hex=from_child).version == 4
