"""End-to-end handling of comment events against the recording fake GitHub + Buildkite API.

These are the scenarios issue 5 asks to see: exactly the right builds cancelled from a mixed
set, a fork branch named ``main`` never touching the project's ``main``, a 422 not stopping
the other cancels, a 429 retried, and a repeated delivery doing nothing.
"""

from collections.abc import Callable

import pytest
from ci_fake_api import BUILDKITE_TOKEN, BUILDS_PATH, GITHUB_TOKEN, ORG, PIPELINE, FakeApi

from ci_commands.actions import Target
from ci_commands.authorize import Policy
from ci_commands.buildkite import BuildkiteClient
from ci_commands.dispatch import Outcome, Services, handle
from ci_commands.github import GitHubClient

Event = Callable[..., dict]


@pytest.fixture
def services(fake_api: FakeApi, sleeps: list[float]) -> Services:
    return Services(
        github=GitHubClient.create(GITHUB_TOKEN, fake_api.github_url, sleep=sleeps.append),
        target=Target(
            buildkite=BuildkiteClient.create(
                BUILDKITE_TOKEN, ORG, fake_api.buildkite_url, sleep=sleeps.append
            ),
            pipeline=PIPELINE,
            meta_key="github_pr_number",
        ),
        policy=Policy(trusted_users=frozenset({"trusty"}), ready_label="ready"),
    )


@pytest.fixture
def maint(fake_api: FakeApi) -> str:
    fake_api.permissions["maint"] = ("write", "maintain")
    return "maint"


def buildkite_calls(api: FakeApi) -> list[tuple[str, str]]:
    return [(c.method, c.path) for c in api.calls if c.path.startswith("/buildkite/")]


def arrange_mixed_set(api: FakeApi) -> None:
    """Fork PR #42 from alice:feature-x and builds around it; #1, #4 and #5 are its own."""
    api.add_pull(42, author="alice", ref="feature-x", head_owner="alice")
    api.add_build(1, "alice:feature-x", "running", pr=42)
    api.add_build(2, "bob:feature-x", "running", pr=43)  # another PR's fork branch of the same name
    api.add_build(3, "alice:feature-x", "passed", pr=42)  # finished
    api.add_build(4, "alice:feature-x", "scheduled", meta={"github_pr_number": "42"})  # metadata only
    api.add_build(5, "feature-x", "failing", pr=42)  # legacy bare-branch build
    api.add_build(6, "feature-x", "running", pr=44)  # the project's own feature-x branch, another PR
    api.add_build(7, "alice:feature-x", "running")  # neither PR id nor stamp: not provably ours
    api.add_build(8, "alice:feature-x", "running", meta={"github_pr_number": "420"})


@pytest.mark.parametrize("ignore_filters", [False, True], ids=["server-filters", "server-ignores-filters"])
def test_cancel_mixed_set_cancels_exactly_this_prs_active_builds(
    fake_api: FakeApi, services: Services, comment_event: Event, maint: str, ignore_filters: bool
) -> None:
    arrange_mixed_set(fake_api)
    fake_api.ignore_filters = ignore_filters
    assert handle(comment_event("/ci cancel", login=maint), services) is Outcome.DONE
    assert fake_api.cancelled_numbers() == [1, 4, 5]
    assert {n: b["state"] for n, b in fake_api.builds.items() if b["state"] == "canceled"}.keys() == {1, 4, 5}
    (listing,) = fake_api.calls_to("GET", BUILDS_PATH + "$")
    assert listing.query["branch[]"] == ["alice:feature-x", "feature-x"]
    assert listing.query["state[]"] == ["scheduled", "running", "failing"]
    ((number, reply),) = fake_api.comments
    assert number == 42
    assert "cancelled: [#1]" in reply and "[#4]" in reply and "[#5]" in reply
    assert "skipped [#6]" in reply and "skipped [#7]" in reply and "skipped [#8]" in reply
    assert ("skipped [#2]" in reply) is ignore_filters


@pytest.mark.parametrize("ignore_filters", [False, True], ids=["server-filters", "server-ignores-filters"])
def test_fork_branch_named_main_never_cancels_the_projects_main(
    fake_api: FakeApi, services: Services, comment_event: Event, maint: str, ignore_filters: bool
) -> None:
    fake_api.add_pull(50, author="mallory", ref="main", head_owner="mallory")
    fake_api.add_build(10, "main", "running")  # push build of the project's main
    fake_api.add_build(11, "main", "scheduled", meta={"release": "yes"})
    fake_api.add_build(12, "mallory:main", "running", pr=50)
    fake_api.add_build(13, "main", "failing", pr=7)  # a same-repo PR from main, not #50
    fake_api.ignore_filters = ignore_filters
    assert handle(comment_event("/ci cancel", login=maint, number=50), services) is Outcome.DONE
    assert fake_api.cancelled_numbers() == [12]
    assert [fake_api.builds[n]["state"] for n in (10, 11, 13)] == ["running", "scheduled", "failing"]


def test_a_422_on_one_build_does_not_stop_the_others(
    fake_api: FakeApi, services: Services, comment_event: Event, maint: str
) -> None:
    fake_api.add_pull(42)
    for number in (21, 22, 23):
        fake_api.add_build(number, "alice:feature-x", "running", pr=42)
    fake_api.cancel_status[22] = 422
    assert handle(comment_event("/ci cancel", login=maint), services) is Outcome.DONE
    assert fake_api.cancelled_numbers() == [21, 22, 23]  # all three were attempted
    assert [fake_api.builds[n]["state"] for n in (21, 22, 23)] == ["canceled", "running", "canceled"]
    ((_, reply),) = fake_api.comments
    assert "cancelled: [#21]" in reply and "[#23]" in reply
    assert "failed to cancel [#22]" in reply and "HTTP 422: Build can't be canceled" in reply


def test_429s_are_retried_and_the_cancel_completes(
    fake_api: FakeApi, services: Services, comment_event: Event, maint: str, sleeps: list[float]
) -> None:
    fake_api.add_pull(42)
    fake_api.add_build(31, "alice:feature-x", "running", pr=42)
    fake_api.throttle("GET", "/builds", reset="3")
    fake_api.throttle("PUT", "/builds/31/cancel", reset="2")
    assert handle(comment_event("/ci cancel", login=maint), services) is Outcome.DONE
    assert sleeps == [3.0, 2.0]
    assert len(fake_api.calls_to("PUT", r"/builds/31/cancel$")) == 2
    assert fake_api.builds[31]["state"] == "canceled"


def test_second_delivery_of_the_same_comment_does_nothing(
    fake_api: FakeApi, services: Services, comment_event: Event, maint: str
) -> None:
    arrange_mixed_set(fake_api)
    payload = comment_event("/ci cancel", login=maint)
    assert handle(payload, services) is Outcome.DONE
    first = len(fake_api.calls)
    for build in fake_api.builds.values():  # new activity must not tempt a replay
        build["state"] = "running"
    assert handle(payload, services) is Outcome.DUPLICATE
    assert [(c.method, c.path) for c in fake_api.calls[first:]] == [
        ("POST", "/github/repos/dpgate-project/dpgate/issues/comments/9001/reactions")
    ]
    assert len(fake_api.comments) == 1
    assert fake_api.cancelled_numbers() == [1, 4, 5]


@pytest.mark.parametrize("body", ["/ci cancel ", "/CI cancel", "/ci cancel please", "lgtm", "", " /ci run"])
def test_non_commands_make_no_calls_at_all(
    fake_api: FakeApi, services: Services, comment_event: Event, maint: str, body: str
) -> None:
    arrange_mixed_set(fake_api)
    assert handle(comment_event(body, login=maint), services) is Outcome.IGNORED
    assert fake_api.calls == []


def test_comment_on_a_plain_issue_is_ignored(
    fake_api: FakeApi, services: Services, comment_event: Event
) -> None:
    payload = comment_event("/ci cancel")
    del payload["issue"]["pull_request"]
    assert handle(payload, services) is Outcome.IGNORED
    assert fake_api.calls == []


def test_stranger_is_refused_with_a_reason_and_touches_no_build(
    fake_api: FakeApi, services: Services, comment_event: Event
) -> None:
    arrange_mixed_set(fake_api)
    fake_api.permissions["mallory"] = ("read", "read")
    # the payload says OWNER; that must not matter
    assert handle(comment_event("/ci cancel", login="mallory"), services) is Outcome.REFUSED
    assert buildkite_calls(fake_api) == []
    ((_, reply),) = fake_api.comments
    assert "@mallory" in reply and "was not run" in reply and "author" in reply


def test_author_of_a_draft_is_refused(fake_api: FakeApi, services: Services, comment_event: Event) -> None:
    fake_api.add_pull(42, author="alice", draft=True, labels=("ready",))
    assert handle(comment_event("/ci run", login="alice"), services) is Outcome.REFUSED
    assert buildkite_calls(fake_api) == []
    assert "draft" in fake_api.comments[0][1]


def test_author_without_label_or_approval_is_refused_after_reviews_are_checked(
    fake_api: FakeApi, services: Services, comment_event: Event
) -> None:
    fake_api.add_pull(42, author="alice", head_sha="b" * 40)
    fake_api.reviews[42] = [{"user": {"login": "maint"}, "state": "APPROVED", "commit_id": "old"}]
    assert handle(comment_event("/ci run", login="alice"), services) is Outcome.REFUSED
    assert fake_api.calls_to("GET", r"/reviews$")
    assert "ready label" in fake_api.comments[0][1]


def test_author_with_trusted_approval_of_head_may_run(
    fake_api: FakeApi, services: Services, comment_event: Event
) -> None:
    fake_api.add_pull(42, author="alice", head_sha="b" * 40)
    fake_api.permissions["maint"] = ("write", "write")
    fake_api.reviews[42] = [{"user": {"login": "maint"}, "state": "APPROVED", "commit_id": "b" * 40}]
    assert handle(comment_event("/ci status", login="alice"), services) is Outcome.DONE
    assert fake_api.calls_to("GET", r"/collaborators/maint/permission$")


def test_author_with_ready_label_may_cancel_without_review_lookup(
    fake_api: FakeApi, services: Services, comment_event: Event
) -> None:
    fake_api.add_pull(42, author="alice", labels=("ready",))
    fake_api.add_build(1, "alice:feature-x", "running", pr=42)
    assert handle(comment_event("/ci cancel", login="alice"), services) is Outcome.DONE
    assert fake_api.cancelled_numbers() == [1]
    assert not fake_api.calls_to("GET", r"/reviews$")


def test_status_lists_the_builds_cancel_would_touch_and_touches_none(
    fake_api: FakeApi, services: Services, comment_event: Event, maint: str
) -> None:
    arrange_mixed_set(fake_api)
    fake_api.ignore_filters = True
    assert handle(comment_event("/ci status", login=maint), services) is Outcome.DONE
    assert fake_api.calls_to("PUT", ".") == []
    reply = fake_api.comments[0][1]
    listed = [line.split("]")[0].removeprefix("- [#") for line in reply.splitlines()[1:]]
    assert listed == ["1", "4", "5"]


def test_run_creates_a_stamped_build_of_the_head_commit(
    fake_api: FakeApi, services: Services, comment_event: Event, maint: str
) -> None:
    fake_api.add_pull(42, author="alice", ref="feature-x", head_owner="alice", head_sha="c" * 40)
    assert handle(comment_event("/ci run", login=maint), services) is Outcome.DONE
    (create,) = fake_api.calls_to("POST", BUILDS_PATH + "$")
    assert create.body == {
        "commit": "c" * 40,
        "branch": "alice:feature-x",
        "message": "/ci run on #42 by @maint",
        "meta_data": {"github_pr_number": "42"},
        "pull_request_id": 42,
        "pull_request_base_branch": "main",
        "pull_request_repository": "https://github.com/alice/dpgate.git",
    }
    assert "started build [#1]" in fake_api.comments[0][1]


def test_run_on_same_repo_pr_uses_the_bare_branch(
    fake_api: FakeApi, services: Services, comment_event: Event, maint: str
) -> None:
    fake_api.add_pull(42, author="alice", ref="feature-x", head_owner="dpgate-project")
    assert handle(comment_event("/ci run", login=maint), services) is Outcome.DONE
    (create,) = fake_api.calls_to("POST", BUILDS_PATH + "$")
    assert create.body["branch"] == "feature-x" and "pull_request_repository" not in create.body


@pytest.mark.parametrize("body", ["/ci run", "/ci retry"])
def test_build_starting_commands_refuse_closed_pull_requests(
    fake_api: FakeApi, services: Services, comment_event: Event, maint: str, body: str
) -> None:
    fake_api.add_pull(42, state="closed")
    fake_api.add_build(1, "alice:feature-x", "failed", pr=42)
    assert handle(comment_event(body, login=maint), services) is Outcome.REFUSED
    assert buildkite_calls(fake_api) == []
    assert "not open" in fake_api.comments[0][1]


def test_retry_rebuilds_the_newest_failed_build_of_this_pr(
    fake_api: FakeApi, services: Services, comment_event: Event, maint: str
) -> None:
    fake_api.add_pull(42)
    fake_api.add_build(30, "alice:feature-x", "failed", pr=42)
    fake_api.add_build(31, "feature-x", "failed", meta={"github_pr_number": "42"})
    fake_api.add_build(32, "alice:feature-x", "passed", pr=42)
    fake_api.add_build(33, "feature-x", "failed", pr=44)  # newer, but another PR's
    assert handle(comment_event("/ci retry", login=maint), services) is Outcome.DONE
    assert [c.path for c in fake_api.calls_to("PUT", ".")] == [f"{BUILDS_PATH}/31/rebuild"]
    (listing,) = fake_api.calls_to("GET", BUILDS_PATH + "$")
    assert listing.query["state[]"] == ["failed"]
    assert "rebuilding [#31]" in fake_api.comments[0][1] and "as [#34]" in fake_api.comments[0][1]


def test_retry_without_failed_build_says_so(
    fake_api: FakeApi, services: Services, comment_event: Event, maint: str
) -> None:
    fake_api.add_pull(42)
    fake_api.add_build(30, "alice:feature-x", "passed", pr=42)
    assert handle(comment_event("/ci retry", login=maint), services) is Outcome.DONE
    assert fake_api.calls_to("PUT", ".") == []
    assert "no failed build" in fake_api.comments[0][1]


def test_buildkite_failure_is_reported_on_the_pr(
    fake_api: FakeApi, comment_event: Event, maint: str, services: Services
) -> None:
    fake_api.add_pull(42)
    broken = Services(
        github=services.github,
        target=Target(
            BuildkiteClient.create("revoked", ORG, fake_api.buildkite_url), PIPELINE, "github_pr_number"
        ),
        policy=Policy(),
    )
    assert handle(comment_event("/ci cancel", login=maint), broken) is Outcome.FAILED
    assert "failed: HTTP 401" in fake_api.comments[0][1]


def test_unsafe_pagination_link_is_reported_not_followed(
    fake_api: FakeApi, services: Services, comment_event: Event, maint: str
) -> None:
    arrange_mixed_set(fake_api)
    fake_api.next_link_override = (
        "http://evil.invalid/v2/organizations/dpgate/pipelines/dpgate-gpu/builds?page=2"
    )
    assert handle(comment_event("/ci cancel", login=maint), services) is Outcome.FAILED
    assert fake_api.calls_to("PUT", ".") == []
    assert "refusing to follow" in fake_api.comments[0][1]


def test_unknown_pull_request_is_answered_not_crashed(
    fake_api: FakeApi, services: Services, comment_event: Event, maint: str
) -> None:
    assert handle(comment_event("/ci status", login=maint, number=77), services) is Outcome.FAILED
    assert buildkite_calls(fake_api) == []
    assert fake_api.comments == [
        (77, "`/ci status` (requested by @maint) failed: HTTP 404: Not Found. Nothing further was attempted.")
    ]
