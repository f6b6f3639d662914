"""Every path through `authorize`, plus how permissions and approvals are read."""

from dataclasses import replace

import pytest

from ci_commands.authorize import (
    Actor,
    Permission,
    Policy,
    Reason,
    authorize,
    current_approvers,
)
from ci_commands.pulls import PullRequest, Review

HEAD = "c0ffee" * 6 + "cafe"
PULL = PullRequest(
    number=42,
    author="alice",
    state="open",
    draft=False,
    labels=frozenset(),
    head_sha=HEAD,
    head_ref="feature-x",
    head_label="alice:feature-x",
    head_repository="alice/dpgate",
    head_clone_url="https://github.com/alice/dpgate.git",
    base_repository="dpgate-project/dpgate",
    base_ref="main",
)
POLICY = Policy(trusted_users=frozenset({"Trusty"}), ready_label="ready")
AUTHOR = Actor("alice", Permission.READ)
STRANGER = Actor("mallory", Permission.NONE)


@pytest.mark.parametrize("permission", [Permission.WRITE, Permission.MAINTAIN, Permission.ADMIN])
def test_write_or_above_may_run_anything_even_on_a_draft(permission: Permission) -> None:
    decision = authorize(Actor("maint", permission), replace(PULL, draft=True), (), POLICY)
    assert decision.allowed and decision.reason is Reason.WRITE_PERMISSION


@pytest.mark.parametrize("login", ["Trusty", "trusty", "TRUSTY"])
def test_trusted_list_may_run_anything_and_logins_compare_case_blind(login: str) -> None:
    decision = authorize(Actor(login, Permission.NONE), replace(PULL, draft=True), (), POLICY)
    assert decision.allowed and decision.reason is Reason.TRUSTED_USER


@pytest.mark.parametrize("permission", [Permission.TRIAGE, Permission.READ, Permission.NONE])
def test_others_without_write_are_refused_even_on_a_ready_pr(permission: Permission) -> None:
    ready = replace(PULL, labels=frozenset({"ready"}))
    decision = authorize(Actor("bob", permission), ready, [Actor("maint", Permission.ADMIN)], POLICY)
    assert not decision.allowed and decision.reason is Reason.NOT_AUTHOR


def test_author_of_a_draft_is_refused_even_with_label_and_approval() -> None:
    draft = replace(PULL, draft=True, labels=frozenset({"ready"}))
    decision = authorize(AUTHOR, draft, [Actor("maint", Permission.WRITE)], POLICY)
    assert not decision.allowed and decision.reason is Reason.DRAFT


def test_author_with_ready_label_is_allowed() -> None:
    decision = authorize(AUTHOR, replace(PULL, labels=frozenset({"bug", "ready"})), (), POLICY)
    assert decision.allowed and decision.reason is Reason.AUTHOR_READY_LABEL


def test_ready_label_name_comes_from_policy() -> None:
    pull = replace(PULL, labels=frozenset({"ready"}))
    decision = authorize(AUTHOR, pull, (), Policy(ready_label="ci-ok"))
    assert not decision.allowed and decision.reason is Reason.NOT_READY


def test_author_login_matches_case_blind() -> None:
    decision = authorize(
        Actor("ALICE", Permission.READ), replace(PULL, labels=frozenset({"ready"})), (), POLICY
    )
    assert decision.allowed


@pytest.mark.parametrize(
    "approver",
    [Actor("maint", Permission.WRITE), Actor("owner", Permission.ADMIN), Actor("trusty", Permission.NONE)],
    ids=["write", "admin", "trusted-list"],
)
def test_author_with_trusted_approval_is_allowed(approver: Actor) -> None:
    decision = authorize(AUTHOR, PULL, [approver], POLICY)
    assert decision.allowed and decision.reason is Reason.AUTHOR_TRUSTED_APPROVAL


@pytest.mark.parametrize(
    "approvers",
    [
        [],
        [Actor("friend", Permission.READ)],
        [Actor("triager", Permission.TRIAGE)],
        [Actor("alice", Permission.READ)],
    ],
    ids=["none", "untrusted-reader", "triage", "self-approval"],
)
def test_author_without_label_or_trusted_approval_is_refused(approvers: list[Actor]) -> None:
    decision = authorize(AUTHOR, PULL, approvers, POLICY)
    assert not decision.allowed and decision.reason is Reason.NOT_READY


def test_refusal_reasons_say_why() -> None:
    for reason in (Reason.NOT_AUTHOR, Reason.DRAFT, Reason.NOT_READY):
        assert len(reason.value) > 20


@pytest.mark.parametrize(
    ("permission", "role_name", "expected"),
    [
        ("admin", "admin", Permission.ADMIN),
        ("write", "maintain", Permission.MAINTAIN),
        ("write", "write", Permission.WRITE),
        ("read", "triage", Permission.TRIAGE),
        ("read", "read", Permission.READ),
        ("none", None, Permission.NONE),
        ("write", "custom-release-role", Permission.WRITE),
        ("read", "custom-reader", Permission.READ),
        (None, None, Permission.NONE),
        ("superuser", "god", Permission.NONE),
        (3, None, Permission.NONE),
    ],
)
def test_permission_from_api(permission: object, role_name: object, expected: Permission) -> None:
    assert Permission.from_api(permission, role_name) is expected


def review(login: str, state: str, commit: str = HEAD) -> Review:
    return Review(reviewer=login, state=state, commit_id=commit)


@pytest.mark.parametrize(
    ("reviews", "expected"),
    [
        ([review("maint", "APPROVED")], ("maint",)),
        ([review("maint", "APPROVED", commit="old")], ()),
        ([review("maint", "APPROVED"), review("maint", "CHANGES_REQUESTED")], ()),
        ([review("maint", "APPROVED"), review("maint", "DISMISSED")], ()),
        ([review("maint", "APPROVED"), review("maint", "COMMENTED")], ("maint",)),
        ([review("maint", "CHANGES_REQUESTED"), review("maint", "APPROVED")], ("maint",)),
        ([review("maint", "APPROVED", commit="old"), review("Maint", "APPROVED")], ("Maint",)),
        ([review("a", "APPROVED"), review("b", "PENDING"), review("c", "COMMENTED")], ("a",)),
    ],
    ids=[
        "approved",
        "stale-commit",
        "changes-after",
        "dismissed",
        "comment-after",
        "re-approved",
        "re-approved-head-case",
        "only-approvals",
    ],
)
def test_current_approvers(reviews: list[Review], expected: tuple[str, ...]) -> None:
    assert current_approvers(reviews, HEAD) == expected
