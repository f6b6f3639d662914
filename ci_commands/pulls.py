"""Pull-request facts as the rest of the package needs them, parsed from GitHub API JSON.

Kept apart from the HTTP client so authorization and build-ownership code can be tested with
hand-written values, and so the Buildkite branch naming rule lives in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PullRequest:
    """One pull request, read from ``GET /repos/{owner}/{repo}/pulls/{number}``."""

    number: int
    author: str
    state: str
    draft: bool
    labels: frozenset[str]
    head_sha: str
    head_ref: str
    head_label: str
    head_repository: str | None
    head_clone_url: str | None
    base_repository: str
    base_ref: str

    @property
    def is_open(self) -> bool:
        return self.state == "open"

    @property
    def is_fork(self) -> bool:
        """A deleted fork has no head repository; treat it as a fork, never as our own branch."""
        return self.head_repository != self.base_repository

    @property
    def buildkite_branch(self) -> str:
        """The branch name Buildkite gives this PR's builds: ``owner:branch`` for forks.

        Buildkite prefixes fork branches with the fork owner so that a fork's ``main`` is not
        the project's ``main``; builds we create follow the same rule.
        """
        return self.head_label if self.is_fork else self.head_ref

    @property
    def branch_names(self) -> tuple[str, ...]:
        """Every branch name a build of this PR may carry: ``owner:branch``, then the bare name.

        The bare name covers same-repository PRs and builds made before Buildkite prefixed fork
        branches (legacy builds); it is also why a bare-name match alone never proves ownership.
        """
        if self.head_label == self.head_ref:
            return (self.head_ref,)
        return (self.head_label, self.head_ref)


@dataclass(frozen=True, slots=True)
class Review:
    """One submitted review, in the order GitHub lists them (oldest first)."""

    reviewer: str
    state: str
    commit_id: str


def parse_pull(data: Mapping[str, object]) -> PullRequest:
    """Build a `PullRequest` from API JSON; KeyError/TypeError means GitHub changed shape."""
    head = _mapping(data["head"])
    base = _mapping(data["base"])
    head_repo = head.get("repo")
    head_repo_map = _mapping(head_repo) if head_repo else None
    labels = data.get("labels") or []
    return PullRequest(
        number=int(str(data["number"])),
        author=str(_mapping(data["user"])["login"]),
        state=str(data["state"]),
        draft=bool(data.get("draft", False)),
        labels=frozenset(str(_mapping(label)["name"]) for label in _sequence(labels)),
        head_sha=str(head["sha"]),
        head_ref=str(head["ref"]),
        head_label=str(head.get("label") or head["ref"]),
        head_repository=str(head_repo_map["full_name"]) if head_repo_map else None,
        head_clone_url=_optional_str(head_repo_map.get("clone_url")) if head_repo_map else None,
        base_repository=str(_mapping(base["repo"])["full_name"]),
        base_ref=str(base["ref"]),
    )


def parse_review(data: Mapping[str, object]) -> Review | None:
    """Build a `Review`; reviews by deleted users (no ``user``) carry no trust and are dropped."""
    user = data.get("user")
    if not isinstance(user, Mapping) or not isinstance(user.get("login"), str):
        return None
    return Review(
        reviewer=str(user["login"]),
        state=str(data.get("state", "")),
        commit_id=str(data.get("commit_id") or ""),
    )


def _optional_str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _mapping(value: object) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise TypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def _sequence(value: object) -> list[object]:
    if not isinstance(value, list):
        raise TypeError(f"expected a JSON array, got {type(value).__name__}")
    return value
