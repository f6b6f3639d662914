"""Transport behaviour shared by both clients: backoff, no redirects, link parsing."""

import pytest
from ci_fake_api import GITHUB_TOKEN, FakeApi

from ci_commands.transport import HttpError, Response, RetryPolicy, Transport, same_endpoint


@pytest.mark.parametrize(
    ("headers", "retry", "expected"),
    [
        ({"retry-after": "7"}, 0, 7.0),
        ({"ratelimit-reset": "12"}, 3, 12.0),
        ({"retry-after": "0"}, 2, 0.0),
        ({"retry-after": "-5"}, 0, 0.0),
        ({"retry-after": "3600"}, 0, 60.0),
        ({}, 0, 1.0),
        ({}, 1, 2.0),
        ({}, 3, 8.0),
        ({}, 10, 60.0),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 2, 4.0),
    ],
)
def test_retry_delay(headers: dict, retry: int, expected: float) -> None:
    assert RetryPolicy().delay(retry, headers) == expected


def test_retry_policy_needs_at_least_one_attempt() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)


def test_redirects_are_not_followed(fake_api: FakeApi) -> None:
    transport = Transport({"Authorization": f"Bearer {GITHUB_TOKEN}"}, sleep=lambda _: None)
    with pytest.raises(HttpError) as caught:
        transport.request("GET", fake_api.base_url + "/redirect")
    assert caught.value.status == 302
    assert [c.path for c in fake_api.calls] == ["/redirect"]


def test_429_is_retried_then_reported_when_attempts_run_out(fake_api: FakeApi) -> None:
    delays: list[float] = []
    transport = Transport({"Authorization": f"Bearer {GITHUB_TOKEN}"}, RetryPolicy(attempts=3), delays.append)
    fake_api.add_pull()
    for _ in range(3):
        fake_api.throttle("GET", "/pulls/42", reset="2")
    with pytest.raises(HttpError) as caught:
        transport.request("GET", f"{fake_api.github_url}/repos/dpgate-project/dpgate/pulls/42")
    assert caught.value.status == 429
    assert delays == [2.0, 2.0]
    assert len(fake_api.calls) == 3


def test_non_http_urls_are_refused() -> None:
    with pytest.raises(ValueError):
        Transport({}).request("GET", "file:///etc/passwd")


@pytest.mark.parametrize(
    ("header", "rel", "expected"),
    [
        ('<https://a/x?page=2>; rel="next", <https://a/x?page=9>; rel="last"', "next", "https://a/x?page=2"),
        ('<https://a/x?page=9>; rel="last"', "next", None),
        (
            '<https://a/x?branch%5B%5D=a%2Cb&page=2>; rel="next"',
            "next",
            "https://a/x?branch%5B%5D=a%2Cb&page=2",
        ),
        ("", "next", None),
    ],
)
def test_link_header(header: str, rel: str, expected: str | None) -> None:
    assert Response(200, {"link": header}, b"").link(rel) == expected


ENDPOINT = "https://api.buildkite.com/v2/organizations/o/pipelines/p/builds"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (ENDPOINT + "?page=2&per_page=100", True),
        (ENDPOINT, True),
        ("http://api.buildkite.com/v2/organizations/o/pipelines/p/builds?page=2", False),
        ("https://evil.example/v2/organizations/o/pipelines/p/builds?page=2", False),
        ("https://api.buildkite.com:444/v2/organizations/o/pipelines/p/builds?page=2", False),
        ("https://user@api.buildkite.com/v2/organizations/o/pipelines/p/builds?page=2", False),
        ("https://api.buildkite.com/v2/organizations/o/pipelines/other/builds?page=2", False),
        ("https://api.buildkite.com/v2/organizations/o/pipelines/p/builds/5/cancel", False),
        ("https://api.buildkite.com/v2/organizations/o/pipelines/p/builds/../../q/builds", False),
        (ENDPOINT + "#frag", False),
        ("/v2/organizations/o/pipelines/p/builds?page=2", False),
    ],
)
def test_same_endpoint(url: str, expected: bool) -> None:
    assert same_endpoint(url, ENDPOINT) is expected
