"""Local ownership checks: the last line of defence before a build is cancelled or rebuilt."""

from dataclasses import replace

import pytest

from ci_commands.buildkite import Build, parse_build
from ci_commands.ownership import Verdict, check_build, is_build_for_pr, newest_for_pr
from ci_commands.pulls import PullRequest

FORK_PR = PullRequest(
    number=42,
    author="alice",
    state="open",
    draft=False,
    labels=frozenset(),
    head_sha="abc",
    head_ref="feature-x",
    head_label="alice:feature-x",
    head_repository="alice/dpgate",
    head_clone_url=None,
    base_repository="dpgate-project/dpgate",
    base_ref="main",
)
BUILD = Build(
    number=1,
    state="running",
    branch="alice:feature-x",
    commit="abc",
    web_url="",
    pull_request_id="42",
    meta_data={},
)


@pytest.mark.parametrize(
    ("pull_request_id", "meta", "expected"),
    [
        ("42", {}, True),
        ("43", {}, False),
        ("42", {"github_pr_number": "43"}, True),  # Buildkite's own id wins
        ("43", {"github_pr_number": "42"}, False),  # ... also when it says no
        (None, {"github_pr_number": "42"}, True),
        (None, {"github_pr_number": " 42 "}, True),
        (None, {"github_pr_number": "420"}, False),
        (None, {"github_pr_number": "4"}, False),
        (None, {"other_key": "42"}, False),
        (None, {}, False),
    ],
)
def test_is_build_for_pr(pull_request_id: str | None, meta: dict, expected: bool) -> None:
    build = replace(BUILD, pull_request_id=pull_request_id, meta_data=meta)
    assert is_build_for_pr(build, 42) is expected


def test_meta_key_is_configurable() -> None:
    build = replace(BUILD, pull_request_id=None, meta_data={"pr": "42"})
    assert is_build_for_pr(build, 42, meta_key="pr")
    assert not is_build_for_pr(build, 42)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, Verdict.ACT),
        ({"branch": "feature-x"}, Verdict.ACT),  # legacy bare-branch build
        ({"state": "scheduled"}, Verdict.ACT),
        ({"state": "failing"}, Verdict.ACT),
        ({"branch": "bob:feature-x"}, Verdict.OTHER_BRANCH),
        ({"branch": "main"}, Verdict.OTHER_BRANCH),
        ({"state": "passed"}, Verdict.WRONG_STATE),
        ({"state": "failed"}, Verdict.WRONG_STATE),
        ({"state": "canceled"}, Verdict.WRONG_STATE),
        ({"state": "blocked"}, Verdict.WRONG_STATE),
        ({"pull_request_id": "7"}, Verdict.OTHER_PR),
        ({"pull_request_id": None}, Verdict.OTHER_PR),
    ],
)
def test_check_build(changes: dict, expected: Verdict) -> None:
    assert check_build(replace(BUILD, **changes), FORK_PR) is expected


def test_fork_branch_named_main_never_claims_the_projects_main_builds() -> None:
    fork_main = replace(FORK_PR, head_ref="main", head_label="mallory:main", head_repository="mallory/dpgate")
    push_build = replace(BUILD, branch="main", pull_request_id=None, meta_data={})
    other_pr_on_main = replace(BUILD, branch="main", pull_request_id="7")
    assert check_build(push_build, fork_main) is Verdict.OTHER_PR
    assert check_build(other_pr_on_main, fork_main) is Verdict.OTHER_PR
    assert check_build(replace(BUILD, branch="mallory:main"), fork_main) is Verdict.ACT


def test_newest_for_pr_picks_highest_number_of_this_pr_in_state() -> None:
    builds = [
        replace(BUILD, number=5, state="failed"),
        replace(BUILD, number=9, state="failed", pull_request_id="43"),
        replace(BUILD, number=8, state="passed"),
        replace(BUILD, number=7, state="failed", branch="feature-x"),
        replace(BUILD, number=3, state="failed"),
    ]
    newest = newest_for_pr(builds, FORK_PR, ["failed"])
    assert newest is not None and newest.number == 7
    assert newest_for_pr(builds[1:2], FORK_PR, ["failed"]) is None


@pytest.mark.parametrize(
    ("pull_request", "expected"),
    [
        (None, None),
        ({}, None),
        ({"id": ""}, None),
        ({"id": None}, None),
        ({"id": 42}, "42"),
        ({"id": "42"}, "42"),
    ],
)
def test_parse_build_pull_request_id(pull_request: object, expected: str | None) -> None:
    data = {"number": 3, "state": "running", "branch": "x", "pull_request": pull_request, "meta_data": None}
    build = parse_build(data)
    assert build.pull_request_id == expected and build.meta_data == {}
