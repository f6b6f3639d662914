"""Which Buildkite builds belong to a pull request, decided locally from plain data.

A branch-name filter is not proof of ownership: a fork may name its branch ``main``, two PRs
may come from same-named branches, and an API may answer more than was asked. So every build
is re-checked here before anything is cancelled or rebuilt.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Final

from ci_commands.buildkite import Build, BuildState
from ci_commands.pulls import PullRequest

DEFAULT_PR_META_KEY: Final = "github_pr_number"
"""Build meta-data key in which the project's own builds (``/ci run``) stamp the PR number."""

ACTIVE_STATES: Final = (BuildState.SCHEDULED, BuildState.RUNNING, BuildState.FAILING)
"""States `/ci cancel` acts on and `/ci status` reports: builds still using or awaiting runners."""


class Verdict(enum.Enum):
    """What to do with one listed build, with the reason shown when it is skipped."""

    ACT = "belongs to this pull request"
    OTHER_BRANCH = "is on another branch"
    WRONG_STATE = "is not in an expected state"
    OTHER_PR = "does not belong to this pull request"


def is_build_for_pr(build: Build, pr_number: int, meta_key: str = DEFAULT_PR_META_KEY) -> bool:
    """True when the build says it was made for ``pr_number``.

    Buildkite's own ``pull_request.id`` wins when present (it is set from GitHub's webhook);
    otherwise the PR number the project stamps into build meta-data decides. A build with
    neither -- e.g. a push build of ``main`` -- belongs to no pull request.
    """
    if build.pull_request_id is not None:
        return build.pull_request_id.strip() == str(pr_number)
    stamped = build.meta_data.get(meta_key)
    return stamped is not None and stamped.strip() == str(pr_number)


def check_build(
    build: Build,
    pull: PullRequest,
    states: Iterable[str] = ACTIVE_STATES,
    meta_key: str = DEFAULT_PR_META_KEY,
) -> Verdict:
    """Re-check a listed build: its branch, its state, then its PR stamp, in that order."""
    if build.branch not in pull.branch_names:
        return Verdict.OTHER_BRANCH
    if build.state not in {str(state) for state in states}:
        return Verdict.WRONG_STATE
    if not is_build_for_pr(build, pull.number, meta_key):
        return Verdict.OTHER_PR
    return Verdict.ACT


def newest_for_pr(
    builds: Iterable[Build], pull: PullRequest, states: Iterable[str], meta_key: str = DEFAULT_PR_META_KEY
) -> Build | None:
    """The highest-numbered build of this PR in one of ``states`` (numbers grow with time)."""
    wanted = tuple(states)
    mine = [b for b in builds if check_build(b, pull, wanted, meta_key) is Verdict.ACT]
    return max(mine, key=lambda b: b.number, default=None)
