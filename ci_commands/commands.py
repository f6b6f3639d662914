"""The command table and the exact-match parser for pull-request comments.

Matching is by equality of the *whole* comment body against a table of constants, not by
prefix, regex or case folding: a comment that merely mentions a command ("please /ci cancel
this") or carries stray whitespace must never act, because every command spends GPU time or
stops someone's build.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final


class Command(enum.Enum):
    """A CI command; the value is the exact comment body that triggers it."""

    RUN = "/ci run"
    RETRY = "/ci retry"
    CANCEL = "/ci cancel"
    STATUS = "/ci status"


COMMANDS: Final[Mapping[str, Command]] = MappingProxyType({command.value: command for command in Command})
"""Exact comment bodies to commands; read-only so nothing can widen it at runtime."""

NEEDS_OPEN_PULL_REQUEST: Final[frozenset[Command]] = frozenset({Command.RUN, Command.RETRY})
"""Commands that start builds, which make no sense (and waste runners) on a closed pull request."""


def parse_command(body: object) -> Command | None:
    """Return the command whose text equals ``body`` exactly, or None for any other comment."""
    if not isinstance(body, str):
        return None
    return COMMANDS.get(body)
