"""The handful of GitHub REST calls the commands need, on the shared `Transport`.

Everything trust-related (permissions, draft state, labels, reviews) is fetched here at the
time of the decision instead of being read from the webhook payload.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import quote

from ci_commands.authorize import Permission
from ci_commands.pulls import PullRequest, Review, parse_pull, parse_review
from ci_commands.transport import HttpError, Response, RetryPolicy, Transport, same_endpoint

DEFAULT_API_URL = "https://api.github.com"
API_VERSION = "2022-11-28"


class PaginationError(RuntimeError):
    """A listing could not be read completely and safely."""


@dataclass(slots=True)
class GitHubClient:
    """A repository-agnostic client; ``repository`` is always ``owner/name``."""

    transport: Transport
    base_url: str = DEFAULT_API_URL
    max_pages: int = 10

    @classmethod
    def create(
        cls,
        token: str,
        base_url: str = DEFAULT_API_URL,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> GitHubClient:
        headers = {
            "Authorization": f"Bearer {token}",
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": API_VERSION,
            "User-Agent": "dpgate-ci-commands",
        }
        return cls(Transport(headers, retry or RetryPolicy(), sleep), base_url.rstrip("/"))

    def _repo_url(self, repository: str, suffix: str) -> str:
        owner, name = repository.split("/", 1)
        return f"{self.base_url}/repos/{quote(owner, safe='')}/{quote(name, safe='')}/{suffix}"

    def get_pull(self, repository: str, number: int) -> PullRequest:
        data = self.transport.request("GET", self._repo_url(repository, f"pulls/{number}")).json()
        if not isinstance(data, Mapping):
            raise TypeError("pull request answer is not a JSON object")
        return parse_pull(data)

    def get_permission(self, repository: str, login: str) -> Permission:
        """The user's permission; 404 (not a collaborator, or no such user) means none."""
        url = self._repo_url(repository, f"collaborators/{quote(login, safe='')}/permission")
        try:
            data = self.transport.request("GET", url).json()
        except HttpError as error:
            if error.status == 404:
                return Permission.NONE
            raise
        if not isinstance(data, Mapping):
            return Permission.NONE
        return Permission.from_api(data.get("permission"), data.get("role_name"))

    def list_reviews(self, repository: str, number: int) -> list[Review]:
        url = self._repo_url(repository, f"pulls/{number}/reviews")
        reviews: list[Review] = []
        for item in self._paginate(url + "?per_page=100", url):
            review = parse_review(item) if isinstance(item, Mapping) else None
            if review is not None:
                reviews.append(review)
        return reviews

    def create_comment(self, repository: str, number: int, body: str) -> None:
        self.transport.request(
            "POST", self._repo_url(repository, f"issues/{number}/comments"), {"body": body}
        )

    def react(self, repository: str, comment_id: int, content: str) -> Response:
        """Add a reaction; GitHub answers 201 when new and 200 when this user already reacted."""
        url = self._repo_url(repository, f"issues/comments/{comment_id}/reactions")
        return self.transport.request("POST", url, {"content": content})

    def _paginate(self, first: str, endpoint: str) -> list[object]:
        """Follow ``rel="next"`` links within one endpoint; refuse foreign links and endless lists.

        An incomplete review list could hide a "changes requested", so a truncated or redirected
        listing is an error rather than a partial answer.
        """
        items: list[object] = []
        url: str | None = first
        for _ in range(self.max_pages):
            if url is None:
                return items
            if not same_endpoint(url, endpoint):
                raise PaginationError(f"refusing to follow pagination link outside {endpoint}: {url}")
            response = self.transport.request("GET", url)
            page = response.json()
            if not isinstance(page, list):
                raise PaginationError(f"{url} did not answer a JSON array")
            items.extend(page)
            url = response.link("next")
        if url is not None:
            raise PaginationError(f"{endpoint} has more than {self.max_pages} pages")
        return items
