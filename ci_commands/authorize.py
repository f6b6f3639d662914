"""Who may run a CI command on a pull request: one pure decision used by every command.

Rules (issue 5):

* users with write, maintain or admin permission on the repository -- as reported by the
  GitHub API, never by the payload's ``author_association`` -- and users on the configured
  trusted list may run any command on any pull request;
* the pull request's author may run commands on their own PR only when it is not a draft and
  it either carries the ready label or holds an approval from a trusted reviewer on its current
  head commit (an approval of older code must not let newly pushed code onto GPU runners);
* everyone else is refused, with a reason the dispatcher posts back as a comment.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ci_commands.pulls import PullRequest, Review


class Permission(enum.Enum):
    """A user's role on the repository, as the collaborator-permission endpoint reports it."""

    ADMIN = "admin"
    MAINTAIN = "maintain"
    WRITE = "write"
    TRIAGE = "triage"
    READ = "read"
    NONE = "none"

    @classmethod
    def from_api(cls, permission: object, role_name: object = None) -> Permission:
        """Map the API answer; ``role_name`` is finer (maintain, triage) when it is a known role.

        Custom organisation roles appear only in ``role_name``; their base ``permission`` is then
        the honest answer. Anything unrecognised is `NONE`, so unknown never means trusted.
        """
        for value in (role_name, permission):
            if isinstance(value, str):
                try:
                    return cls(value.lower())
                except ValueError:
                    continue
        return cls.NONE


WRITE_OR_ABOVE = frozenset({Permission.ADMIN, Permission.MAINTAIN, Permission.WRITE})


class Reason(enum.Enum):
    """Why a command was allowed or refused; refusals carry the text posted on the PR."""

    WRITE_PERMISSION = "has write permission or above"
    TRUSTED_USER = "is on the trusted list"
    AUTHOR_READY_LABEL = "is the author of a pull request labelled ready"
    AUTHOR_TRUSTED_APPROVAL = "is the author of a pull request approved by a trusted reviewer"
    NOT_AUTHOR = "only maintainers, trusted users and the pull request's author may run CI commands"
    DRAFT = "the pull request is a draft; mark it ready for review first"
    NOT_READY = (
        "the pull request needs the ready label or an approval of its latest commit "
        "from a trusted reviewer before its author may run CI commands"
    )


@dataclass(frozen=True, slots=True)
class Actor:
    """A user and the permission GitHub reports for them on this repository."""

    login: str
    permission: Permission


@dataclass(frozen=True, slots=True)
class Policy:
    """Configuration of trust: the trusted list and the label that marks a PR ready."""

    trusted_users: frozenset[str] = field(default_factory=frozenset)
    ready_label: str = "ready"

    def is_trusted(self, actor: Actor) -> bool:
        """Trusted list membership or write permission and above; logins compare case-blind."""
        return actor.permission in WRITE_OR_ABOVE or _fold(actor.login) in {
            _fold(login) for login in self.trusted_users
        }


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: Reason


def current_approvers(reviews: Sequence[Review], head_sha: str) -> tuple[str, ...]:
    """Reviewers whose latest verdict is an approval of ``head_sha``.

    A reviewer's later "changes requested" or a dismissal withdraws their approval; plain
    comments do not, matching how GitHub itself counts approvals.
    """
    latest: dict[str, Review] = {}
    for review in reviews:
        if review.state in {"APPROVED", "CHANGES_REQUESTED", "DISMISSED"}:
            latest[_fold(review.reviewer)] = review
    return tuple(
        review.reviewer
        for review in latest.values()
        if review.state == "APPROVED" and review.commit_id == head_sha
    )


def authorize(actor: Actor, pull: PullRequest, approvers: Iterable[Actor], policy: Policy) -> Decision:
    """Decide whether ``actor`` may run a CI command on ``pull``.

    ``approvers`` are the reviewers from `current_approvers` with their permissions; the
    author's own approval can never count, even if GitHub were to allow one.
    """
    if actor.permission in WRITE_OR_ABOVE:
        return Decision(True, Reason.WRITE_PERMISSION)
    if policy.is_trusted(actor):
        return Decision(True, Reason.TRUSTED_USER)
    if _fold(actor.login) != _fold(pull.author):
        return Decision(False, Reason.NOT_AUTHOR)
    if pull.draft:
        return Decision(False, Reason.DRAFT)
    if policy.ready_label in pull.labels:
        return Decision(True, Reason.AUTHOR_READY_LABEL)
    if any(_fold(a.login) != _fold(pull.author) and policy.is_trusted(a) for a in approvers):
        return Decision(True, Reason.AUTHOR_TRUSTED_APPROVAL)
    return Decision(False, Reason.NOT_READY)


def _fold(login: str) -> str:
    """GitHub logins are case-insensitive."""
    return login.casefold()
