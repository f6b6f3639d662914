"""Act on each command comment once, however many times its event is delivered.

Workflow runs share no disk, so the marker lives on GitHub: the bot adds an ``eyes`` reaction
to the comment before doing anything. GitHub answers 201 when the reaction is new and 200 when
this user had already added it, which makes the reaction an atomic claim; the workflow's
per-PR concurrency group keeps two runs from racing between check and act anyway. A run that
claims and then crashes is not repeated by a redelivery: "at most once" is the safe side for
commands that start and stop GPU builds.

The token must belong to a bot account: a person's own "eyes" on the comment would read as a
claim if their token were used.
"""

from __future__ import annotations

import enum
from typing import Final, Protocol

from ci_commands.transport import Response

CLAIM_REACTION: Final = "eyes"


class Claim(enum.Enum):
    FIRST = "first delivery: act on it"
    DUPLICATE = "already claimed by an earlier delivery: do nothing"


class _Reacts(Protocol):
    def react(self, repository: str, comment_id: int, content: str) -> Response: ...


def claim_from_status(status: int) -> Claim:
    """201 Created is a fresh claim; 200 OK means our reaction was already there."""
    if status == 201:
        return Claim.FIRST
    if status == 200:
        return Claim.DUPLICATE
    raise ValueError(f"unexpected status {status} when adding the claim reaction")


def claim_comment(github: _Reacts, repository: str, comment_id: int) -> Claim:
    """Claim ``comment_id`` for this run by adding the bot's reaction to it."""
    return claim_from_status(github.react(repository, comment_id, CLAIM_REACTION).status)
