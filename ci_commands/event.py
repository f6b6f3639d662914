"""Reduce a GitHub ``issue_comment`` payload to the few facts the dispatcher may rely on.

Only identifiers are taken from the payload (repository, pull-request number, comment id,
commenter login and body). Anything that carries trust -- permissions, draft state, labels,
``author_association`` -- is deliberately *not* read here: it is asked of the GitHub API at the
moment of the decision, because a payload can be stale and ``author_association`` does not
reflect repository permissions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


class EventError(ValueError):
    """The payload claims to be a pull-request comment but lacks a field we need."""


@dataclass(frozen=True, slots=True)
class CommentEvent:
    """A newly created comment on a pull request."""

    repository: str
    pr_number: int
    comment_id: int
    commenter: str
    body: str


def parse_event(payload: Mapping[str, object]) -> CommentEvent | None:
    """Return the comment event, or None when the payload is not a created comment on a PR.

    Plain issues (no ``issue.pull_request``), edited or deleted comments and other event kinds
    are ignored rather than rejected: the workflow filters them too, this is defence in depth.
    """
    if payload.get("action") != "created":
        return None
    issue = payload.get("issue")
    comment = payload.get("comment")
    repository = payload.get("repository")
    if not isinstance(issue, Mapping) or not issue.get("pull_request"):
        return None
    if not isinstance(comment, Mapping) or not isinstance(repository, Mapping):
        raise EventError("issue_comment payload without comment or repository")
    user = comment.get("user")
    login = user.get("login") if isinstance(user, Mapping) else None
    full_name = repository.get("full_name")
    number = issue.get("number")
    comment_id = comment.get("id")
    body = comment.get("body")
    if not isinstance(login, str) or not login:
        raise EventError("comment without a user login")
    if not isinstance(full_name, str) or full_name.count("/") != 1:
        raise EventError("repository without an owner/name full_name")
    if not _is_int(number) or not _is_int(comment_id):
        raise EventError("issue number and comment id must be integers")
    return CommentEvent(
        repository=full_name,
        pr_number=int(number),
        comment_id=int(comment_id),
        commenter=login,
        body=body if isinstance(body, str) else "",
    )


def _is_int(value: object) -> bool:
    """True for real integers; JSON booleans are ints in Python and must not pass."""
    return isinstance(value, int) and not isinstance(value, bool)
