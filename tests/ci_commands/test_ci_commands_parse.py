"""Exact-match parsing: only the four bodies in the table are commands, nothing near them."""

import pytest

from ci_commands.commands import COMMANDS, Command, parse_command

CASES = [
    ("/ci run", Command.RUN),
    ("/ci retry", Command.RETRY),
    ("/ci cancel", Command.CANCEL),
    ("/ci status", Command.STATUS),
    # near misses: whitespace
    (" /ci cancel", None),
    ("/ci cancel ", None),
    ("/ci cancel\n", None),
    ("\r\n/ci cancel", None),
    ("/ci  cancel", None),
    ("/ci\tcancel", None),
    # near misses: case and typos
    ("/CI cancel", None),
    ("/ci Cancel", None),
    ("/ci cancle", None),
    ("/ci canel", None),
    ("ci cancel", None),
    ("/cicancel", None),
    # extra words, prefixes, quoting, several commands
    ("/ci cancel please", None),
    ("please /ci cancel", None),
    ("/ci cancel now", None),
    ("/ci run\n/ci cancel", None),
    ("> /ci cancel", None),
    ("`/ci cancel`", None),
    ("/ci", None),
    ("/ci ", None),
    ("/ci help", None),
    ("", None),
    # look-alike characters (Cyrillic "с", full-width solidus)
    ("/ci \u0441ancel", None),
    ("\uff0fci cancel", None),
    # not strings at all
    (None, None),
    (42, None),
    (["/ci cancel"], None),
]


@pytest.mark.parametrize(("body", "expected"), CASES, ids=[repr(body) for body, _ in CASES])
def test_parse_command(body: object, expected: Command | None) -> None:
    assert parse_command(body) is expected


def test_table_holds_exactly_the_four_commands() -> None:
    assert dict(COMMANDS) == {
        "/ci run": Command.RUN,
        "/ci retry": Command.RETRY,
        "/ci cancel": Command.CANCEL,
        "/ci status": Command.STATUS,
    }


def test_table_cannot_be_widened_at_runtime() -> None:
    with pytest.raises(TypeError):
        COMMANDS["/ci cancel all"] = Command.CANCEL  # type: ignore[index]
