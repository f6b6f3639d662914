"""Fixtures for the ci_commands tests: the fake API server, injected sleeps, event payloads.

The fake lives in ``ci_fake_api.py`` (a uniquely named helper module, so it cannot collide
with other test directories' helpers under pytest's default import mode).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from ci_fake_api import REPO, FakeApi, start


@pytest.fixture
def fake_api() -> Iterator[FakeApi]:
    api = FakeApi()
    server, thread = start(api)
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def sleeps() -> list[float]:
    """Backoff delays the clients asked for; injected instead of time.sleep so tests never wait."""
    return []


@pytest.fixture
def comment_event() -> Callable[..., dict]:
    """Factory for issue_comment payloads as GitHub delivers them."""

    def make(body: str, login: str = "maint", number: int = 42, comment_id: int = 9001) -> dict:
        return {
            "action": "created",
            "issue": {
                "number": number,
                "pull_request": {"url": f"https://api.github.com/repos/{REPO}/pulls/{number}"},
            },
            "comment": {
                "id": comment_id,
                "body": body,
                "user": {"login": login},
                "author_association": "OWNER",
            },
            "repository": {"full_name": REPO, "default_branch": "main"},
        }

    return make
