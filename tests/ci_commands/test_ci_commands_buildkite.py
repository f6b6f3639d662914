"""The Buildkite client against the recording fake: filters, pagination limits, 429, cancel."""

import pytest
from ci_fake_api import BUILDKITE_TOKEN, BUILDS_PATH, ORG, PIPELINE, FakeApi

from ci_commands.buildkite import BuildkiteClient, NewBuild, UnsafeLinkError
from ci_commands.transport import HttpError


@pytest.fixture
def client(fake_api: FakeApi, sleeps: list[float]) -> BuildkiteClient:
    return BuildkiteClient.create(BUILDKITE_TOKEN, ORG, fake_api.buildkite_url, sleep=sleeps.append)


def test_filters_are_sent_as_buildkite_query_parameters(fake_api: FakeApi, client: BuildkiteClient) -> None:
    client.list_builds(
        PIPELINE,
        branch=["alice:feature-x", "feature-x"],
        commit="abc",
        states=["scheduled", "running"],
        meta_data={"github_pr_number": "42"},
    )
    (call,) = fake_api.calls
    assert call.path == BUILDS_PATH
    assert call.query == {
        "branch[]": ["alice:feature-x", "feature-x"],
        "commit": ["abc"],
        "state[]": ["scheduled", "running"],
        "meta_data[github_pr_number]": ["42"],
        "per_page": ["100"],
    }


def test_single_branch_and_no_filters(fake_api: FakeApi, client: BuildkiteClient) -> None:
    client.list_builds(PIPELINE, branch="main")
    client.list_builds(PIPELINE)
    assert [c.query for c in fake_api.calls] == [
        {"branch": ["main"], "per_page": ["100"]},
        {"per_page": ["100"]},
    ]


def test_filters_select_builds(fake_api: FakeApi, client: BuildkiteClient) -> None:
    fake_api.add_build(1, "main", "running")
    fake_api.add_build(2, "feature-x", "running", meta={"github_pr_number": "42"})
    fake_api.add_build(3, "feature-x", "passed", meta={"github_pr_number": "42"})
    fake_api.add_build(4, "feature-x", "running", meta={"github_pr_number": "41"})
    listing = client.list_builds(
        PIPELINE, branch="feature-x", states=["running"], meta_data={"github_pr_number": "42"}
    )
    assert [b.number for b in listing.builds] == [2]
    assert listing.builds[0].meta_data == {"github_pr_number": "42"}


def test_pagination_is_followed_within_the_pipeline(fake_api: FakeApi, client: BuildkiteClient) -> None:
    for number in range(1, 6):
        fake_api.add_build(number, "feature-x")
    fake_api.page_size = 2
    listing = client.list_builds(PIPELINE, branch="feature-x", states=["running"])
    assert [b.number for b in listing.builds] == [5, 4, 3, 2, 1]
    assert not listing.truncated
    assert [c.query.get("page") for c in fake_api.calls] == [None, ["2"], ["3"]]
    assert all(c.query["branch"] == ["feature-x"] for c in fake_api.calls)


def test_pagination_stops_at_the_page_cap(fake_api: FakeApi, client: BuildkiteClient) -> None:
    for number in range(1, 8):
        fake_api.add_build(number, "feature-x")
    fake_api.page_size = 2
    client.max_pages = 2
    listing = client.list_builds(PIPELINE)
    assert [b.number for b in listing.builds] == [7, 6, 5, 4]
    assert listing.truncated
    assert len(fake_api.calls) == 2


@pytest.mark.parametrize(
    "link",
    [
        "http://evil.invalid/buildkite/v2/organizations/dpgate/pipelines/dpgate-gpu/builds?page=2",
        "{base}/buildkite/v2/organizations/dpgate/pipelines/other-pipeline/builds?page=2",
        "{base}/buildkite/v2/organizations/other-org/pipelines/dpgate-gpu/builds?page=2",
        "{base}/buildkite/v2/organizations/dpgate/pipelines/dpgate-gpu/builds/1/cancel",
        "{base}/github/repos/dpgate-project/dpgate/pulls/42",
    ],
    ids=["other-host", "other-pipeline", "other-org", "cancel-endpoint", "github"],
)
def test_links_outside_the_builds_url_are_refused(
    fake_api: FakeApi, client: BuildkiteClient, link: str
) -> None:
    fake_api.add_build(1, "feature-x")
    fake_api.next_link_override = link.format(base=fake_api.base_url)
    with pytest.raises(UnsafeLinkError):
        client.list_builds(PIPELINE)
    assert [c.path for c in fake_api.calls] == [BUILDS_PATH]


def test_429_is_retried_with_the_servers_backoff(
    fake_api: FakeApi, client: BuildkiteClient, sleeps: list[float]
) -> None:
    fake_api.add_build(1, "feature-x")
    fake_api.throttle("GET", "/builds", reset="3")
    listing = client.list_builds(PIPELINE)
    assert [b.number for b in listing.builds] == [1]
    assert sleeps == [3.0]
    assert len(fake_api.calls) == 2


def test_cancel_build(fake_api: FakeApi, client: BuildkiteClient) -> None:
    fake_api.add_build(7, "feature-x", "running")
    build = client.cancel_build(PIPELINE, 7)
    assert build.state == "canceled"
    assert [(c.method, c.path) for c in fake_api.calls] == [("PUT", f"{BUILDS_PATH}/7/cancel")]


def test_cancel_of_a_finished_build_raises_422(fake_api: FakeApi, client: BuildkiteClient) -> None:
    fake_api.add_build(7, "feature-x", "passed")
    with pytest.raises(HttpError) as caught:
        client.cancel_build(PIPELINE, 7)
    assert caught.value.status == 422


def test_create_and_rebuild(fake_api: FakeApi, client: BuildkiteClient) -> None:
    created = client.create_build(
        PIPELINE,
        NewBuild(commit="f" * 40, branch="alice:x", message="m", meta_data={"k": "42"}, pull_request_id=42),
    )
    assert created.number == 1 and created.pull_request_id == "42" and created.meta_data == {"k": "42"}
    assert fake_api.calls[0].body == {
        "commit": "f" * 40,
        "branch": "alice:x",
        "message": "m",
        "meta_data": {"k": "42"},
        "pull_request_id": 42,
    }
    rebuilt = client.rebuild_build(PIPELINE, 1)
    assert rebuilt.number == 2 and rebuilt.commit == "f" * 40
    assert fake_api.calls[1].path == f"{BUILDS_PATH}/1/rebuild"


def test_wrong_token_is_reported(fake_api: FakeApi) -> None:
    client = BuildkiteClient.create("wrong", ORG, fake_api.buildkite_url)
    with pytest.raises(HttpError) as caught:
        client.list_builds(PIPELINE)
    assert caught.value.status == 401
