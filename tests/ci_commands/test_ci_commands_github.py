"""The GitHub client against the recording fake: trust facts, reviews, comments, reactions."""

import pytest
from ci_fake_api import GITHUB_TOKEN, REPO, FakeApi

from ci_commands.authorize import Permission
from ci_commands.github import GitHubClient, PaginationError
from ci_commands.transport import HttpError


@pytest.fixture
def client(fake_api: FakeApi, sleeps: list[float]) -> GitHubClient:
    return GitHubClient.create(GITHUB_TOKEN, fake_api.github_url, sleep=sleeps.append)


def test_get_pull(fake_api: FakeApi, client: GitHubClient) -> None:
    fake_api.add_pull(42, author="alice", labels=("ready",), draft=True)
    pull = client.get_pull(REPO, 42)
    assert (pull.number, pull.author, pull.draft, pull.labels) == (42, "alice", True, {"ready"})
    assert fake_api.calls[0].path == f"/github/repos/{REPO}/pulls/42"


def test_missing_pull_is_an_error(client: GitHubClient) -> None:
    with pytest.raises(HttpError) as caught:
        client.get_pull(REPO, 404)
    assert caught.value.status == 404


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (("admin", "admin"), Permission.ADMIN),
        (("write", "maintain"), Permission.MAINTAIN),
        (("write", "write"), Permission.WRITE),
        (("read", "triage"), Permission.TRIAGE),
        (("none", "none"), Permission.NONE),
        (None, Permission.NONE),
    ],
)
def test_get_permission(
    fake_api: FakeApi, client: GitHubClient, answer: tuple | None, expected: Permission
) -> None:
    if answer is not None:
        fake_api.permissions["bob"] = answer
    assert client.get_permission(REPO, "bob") is expected
    assert fake_api.calls[0].path == f"/github/repos/{REPO}/collaborators/bob/permission"


def test_list_reviews_follows_pages(fake_api: FakeApi, client: GitHubClient) -> None:
    fake_api.reviews[42] = [
        {"user": {"login": f"r{i}"}, "state": "APPROVED", "commit_id": "abc"} for i in range(3)
    ] + [{"user": None, "state": "APPROVED", "commit_id": "abc"}]
    fake_api.page_size = 1
    reviews = client.list_reviews(REPO, 42)
    assert [r.reviewer for r in reviews] == ["r0", "r1", "r2"]
    assert len(fake_api.calls) == 4


def test_list_reviews_refuses_foreign_links_and_endless_lists(
    fake_api: FakeApi, client: GitHubClient
) -> None:
    fake_api.reviews[42] = [{"user": {"login": "r"}, "state": "APPROVED", "commit_id": "abc"}] * 5
    fake_api.page_size = 1
    client.max_pages = 3
    with pytest.raises(PaginationError, match="more than 3 pages"):
        client.list_reviews(REPO, 42)
    fake_api.calls.clear()
    fake_api.next_link_override = "http://evil.invalid/repos/x/pulls/42/reviews?page=2"
    with pytest.raises(PaginationError, match="outside"):
        client.list_reviews(REPO, 42)
    assert len(fake_api.calls) == 1


def test_comment_and_reaction(fake_api: FakeApi, client: GitHubClient) -> None:
    client.create_comment(REPO, 42, "hello")
    assert fake_api.comments == [(42, "hello")]
    assert client.react(REPO, 9001, "eyes").status == 201
    assert client.react(REPO, 9001, "eyes").status == 200
    assert fake_api.calls[-1].path == f"/github/repos/{REPO}/issues/comments/9001/reactions"


def test_github_429_is_retried(fake_api: FakeApi, client: GitHubClient, sleeps: list[float]) -> None:
    fake_api.add_pull(42)
    fake_api.throttle("GET", "/pulls/42", reset="5")
    assert client.get_pull(REPO, 42).number == 42
    assert sleeps == [5.0]
