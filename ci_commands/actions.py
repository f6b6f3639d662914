"""What each command does in Buildkite, given a pull request already authorized.

Listing is done by branch names and states on the server, then every build is re-checked
locally (`ownership.check_build`) before it is touched, so a sloppy filter or a same-named fork
branch can never reach another pull request's -- or ``main``'s -- builds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ci_commands.buildkite import Build, BuildkiteClient, BuildState, NewBuild, UnsafeLinkError
from ci_commands.ownership import ACTIVE_STATES, Verdict, check_build, newest_for_pr
from ci_commands.pulls import PullRequest
from ci_commands.transport import HttpError

RECOVERABLE = (HttpError, UnsafeLinkError, OSError, ValueError, TypeError)
"""Errors of one Buildkite call: reported in the reply, and never stop work on other builds."""


@dataclass(frozen=True, slots=True)
class Target:
    """The pipeline the commands act on and the meta-data key stamped with the PR number."""

    buildkite: BuildkiteClient
    pipeline: str
    meta_key: str


@dataclass(frozen=True, slots=True)
class Skipped:
    build: Build
    verdict: Verdict


@dataclass(frozen=True, slots=True)
class Failed:
    build: Build
    error: str


@dataclass(frozen=True, slots=True)
class CancelReport:
    cancelled: tuple[Build, ...]
    skipped: tuple[Skipped, ...]
    failed: tuple[Failed, ...]
    truncated: bool


@dataclass(frozen=True, slots=True)
class StatusReport:
    builds: tuple[Build, ...]
    truncated: bool


@dataclass(frozen=True, slots=True)
class RetryReport:
    """``original`` is None when the PR has no failed build to rebuild."""

    original: Build | None
    rebuilt: Build | None


def _candidates(target: Target, pull: PullRequest) -> tuple[list[Build], bool]:
    listing = target.buildkite.list_builds(
        target.pipeline, branch=pull.branch_names, states=[str(s) for s in ACTIVE_STATES]
    )
    unique = {build.number: build for build in listing.builds}
    return sorted(unique.values(), key=lambda b: b.number), listing.truncated


def cancel(target: Target, pull: PullRequest) -> CancelReport:
    """Cancel every active build of the PR; one failed cancel does not stop the others."""
    builds, truncated = _candidates(target, pull)
    cancelled: list[Build] = []
    skipped: list[Skipped] = []
    failed: list[Failed] = []
    for build in builds:
        verdict = check_build(build, pull, ACTIVE_STATES, target.meta_key)
        if verdict is not Verdict.ACT:
            skipped.append(Skipped(build, verdict))
            continue
        try:
            target.buildkite.cancel_build(target.pipeline, build.number)
        except RECOVERABLE as error:
            failed.append(Failed(build, describe_error(error)))
        else:
            cancelled.append(build)
    return CancelReport(tuple(cancelled), tuple(skipped), tuple(failed), truncated)


def status(target: Target, pull: PullRequest) -> StatusReport:
    """The same builds `/ci cancel` would act on, without touching them."""
    builds, truncated = _candidates(target, pull)
    mine = tuple(b for b in builds if check_build(b, pull, ACTIVE_STATES, target.meta_key) is Verdict.ACT)
    return StatusReport(mine, truncated)


def run(target: Target, pull: PullRequest, requested_by: str) -> Build:
    """Create a build of the PR's head commit, stamped with the PR number in meta-data."""
    return target.buildkite.create_build(
        target.pipeline,
        NewBuild(
            commit=pull.head_sha,
            branch=pull.buildkite_branch,
            message=f"/ci run on #{pull.number} by @{requested_by}",
            meta_data={target.meta_key: str(pull.number)},
            pull_request_id=pull.number,
            pull_request_base_branch=pull.base_ref,
            pull_request_repository=pull.head_clone_url if pull.is_fork else None,
        ),
    )


def retry(target: Target, pull: PullRequest) -> RetryReport:
    """Rebuild the newest failed build of the PR with Buildkite's rebuild endpoint."""
    failed_state = [str(BuildState.FAILED)]
    listing = target.buildkite.list_builds(target.pipeline, branch=pull.branch_names, states=failed_state)
    original = newest_for_pr(listing.builds, pull, failed_state, target.meta_key)
    if original is None:
        return RetryReport(None, None)
    return RetryReport(original, target.buildkite.rebuild_build(target.pipeline, original.number))


def describe_error(error: Exception) -> str:
    """A one-line reason for a reply: HTTP status and the API's message when it sent one."""
    if isinstance(error, HttpError):
        try:
            message = json.loads(error.body).get("message")
        except (ValueError, AttributeError):
            message = None
        return f"HTTP {error.status}" + (f": {message}" if isinstance(message, str) and message else "")
    return f"{type(error).__name__}: {error}"
