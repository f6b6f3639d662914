"""Parsing of GitHub pull-request JSON and the Buildkite branch names derived from it."""

import pytest

from ci_commands.pulls import parse_pull, parse_review


def pull_json(head_owner: str = "alice", head_repo: object = "alice/dpgate", ref: str = "feature-x") -> dict:
    repo = {"full_name": head_repo, "clone_url": f"https://github.com/{head_repo}.git"} if head_repo else None
    return {
        "number": 42,
        "user": {"login": "alice"},
        "state": "open",
        "draft": False,
        "labels": [{"name": "ready"}, {"name": "gpu"}],
        "head": {"sha": "abc123", "ref": ref, "label": f"{head_owner}:{ref}", "repo": repo},
        "base": {"ref": "main", "repo": {"full_name": "dpgate-project/dpgate"}},
    }


def test_fork_pull_request() -> None:
    pull = parse_pull(pull_json())
    assert pull.is_fork and pull.is_open and not pull.draft
    assert pull.labels == {"ready", "gpu"}
    assert pull.buildkite_branch == "alice:feature-x"
    assert pull.branch_names == ("alice:feature-x", "feature-x")
    assert pull.head_clone_url == "https://github.com/alice/dpgate.git"


def test_same_repository_pull_request_builds_the_bare_branch() -> None:
    pull = parse_pull(pull_json(head_owner="dpgate-project", head_repo="dpgate-project/dpgate"))
    assert not pull.is_fork
    assert pull.buildkite_branch == "feature-x"
    assert pull.branch_names == ("dpgate-project:feature-x", "feature-x")


def test_deleted_fork_is_still_a_fork() -> None:
    pull = parse_pull(pull_json(head_repo=None))
    assert pull.is_fork and pull.head_repository is None and pull.head_clone_url is None
    assert pull.buildkite_branch == "alice:feature-x"


def test_missing_head_is_an_error() -> None:
    data = pull_json()
    del data["head"]
    with pytest.raises(KeyError):
        parse_pull(data)


def test_review_of_deleted_user_is_dropped() -> None:
    assert parse_review({"user": None, "state": "APPROVED", "commit_id": "abc"}) is None
    kept = parse_review({"user": {"login": "m"}, "state": "APPROVED", "commit_id": "abc"})
    assert kept is not None and kept.reviewer == "m"
