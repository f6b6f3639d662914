"""Handle one ``issue_comment`` event from start to reply: the only place that sequences calls.

Order matters and is fixed here: parse (non-commands stop before any API call, so they have no
side effects), claim the comment (duplicates stop), fetch trust facts and authorize with the one
`authorize` function, then act and reply.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import assert_never

from ci_commands import actions, replies
from ci_commands.actions import RECOVERABLE, Target, describe_error
from ci_commands.authorize import Actor, Decision, Permission, Policy, Reason, authorize, current_approvers
from ci_commands.commands import NEEDS_OPEN_PULL_REQUEST, Command, parse_command
from ci_commands.dedupe import Claim, claim_comment
from ci_commands.event import CommentEvent, parse_event
from ci_commands.github import GitHubClient, PaginationError
from ci_commands.pulls import PullRequest

FACT_ERRORS = (*RECOVERABLE, PaginationError, KeyError)
"""Failures reading GitHub or Buildkite that are answered on the PR instead of crashing the run."""


class Outcome(enum.Enum):
    IGNORED = "not a command on a pull request"
    DUPLICATE = "already handled by an earlier delivery"
    REFUSED = "refused, with a reply"
    DONE = "done, with a reply"
    FAILED = "an API call failed, with a reply"


@dataclass(frozen=True, slots=True)
class Services:
    github: GitHubClient
    target: Target
    policy: Policy


def handle(payload: Mapping[str, object], services: Services) -> Outcome:
    """Act on one delivery of a comment event and return what happened."""
    event = parse_event(payload)
    if event is None:
        return Outcome.IGNORED
    command = parse_command(event.body)
    if command is None:
        return Outcome.IGNORED
    github = services.github
    if claim_comment(github, event.repository, event.comment_id) is Claim.DUPLICATE:
        return Outcome.DUPLICATE
    try:
        pull = github.get_pull(event.repository, event.pr_number)
        decision = gather_and_authorize(github, services.policy, event, pull)
        refusal = _refusal(command, event, pull, decision)
        reply = refusal or _execute(command, services.target, pull, event.commenter)
    except FACT_ERRORS as error:
        failure = replies.failure(command, event.commenter, describe_error(error))
        github.create_comment(event.repository, event.pr_number, failure)
        return Outcome.FAILED
    github.create_comment(event.repository, event.pr_number, reply)
    return Outcome.REFUSED if refusal else Outcome.DONE


def gather_and_authorize(
    github: GitHubClient, policy: Policy, event: CommentEvent, pull: PullRequest
) -> Decision:
    """Fetch the facts `authorize` needs, asking for reviews only when they can change the answer."""
    actor = Actor(event.commenter, github.get_permission(event.repository, event.commenter))
    decision = authorize(actor, pull, (), policy)
    if decision.reason is not Reason.NOT_READY:
        return decision
    approvers = []
    for login in current_approvers(github.list_reviews(event.repository, pull.number), pull.head_sha):
        listed = Actor(login, Permission.NONE)
        permission = (
            Permission.NONE if policy.is_trusted(listed) else github.get_permission(event.repository, login)
        )
        approvers.append(Actor(login, permission))
    return authorize(actor, pull, approvers, policy)


def _refusal(command: Command, event: CommentEvent, pull: PullRequest, decision: Decision) -> str | None:
    if not decision.allowed:
        return replies.refusal(command, event.commenter, decision.reason)
    if command in NEEDS_OPEN_PULL_REQUEST and not pull.is_open:
        return replies.closed(command, event.commenter)
    return None


def _execute(command: Command, target: Target, pull: PullRequest, login: str) -> str:
    match command:
        case Command.CANCEL:
            return replies.cancelled(command, login, actions.cancel(target, pull))
        case Command.STATUS:
            return replies.status(command, login, actions.status(target, pull))
        case Command.RUN:
            return replies.started(command, login, actions.run(target, pull, login))
        case Command.RETRY:
            return replies.retried(command, login, actions.retry(target, pull))
    assert_never(command)
