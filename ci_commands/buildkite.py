"""Buildkite REST client: list a pipeline's builds with filters, cancel, rebuild, create.

Listing follows ``Link: rel="next"`` pagination only while the link stays on the pipeline's
own builds URL (same scheme, host and path), and only up to ``max_pages``; HTTP 429 is retried
by the shared `Transport` with backoff.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote, urlencode

from ci_commands.transport import RetryPolicy, Transport, same_endpoint

DEFAULT_API_URL = "https://api.buildkite.com/v2"


class BuildState(enum.StrEnum):
    """Build states Buildkite reports; `Build.state` keeps the raw string for unknown ones."""

    CREATING = "creating"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    FAILING = "failing"
    PASSED = "passed"
    FAILED = "failed"
    BLOCKED = "blocked"
    CANCELING = "canceling"
    CANCELED = "canceled"
    SKIPPED = "skipped"
    NOT_RUN = "not_run"
    WAITING = "waiting"
    WAITING_FAILED = "waiting_failed"


class UnsafeLinkError(RuntimeError):
    """A pagination link pointed outside the pipeline's builds URL; it was not followed."""


@dataclass(frozen=True, slots=True)
class Build:
    number: int
    state: str
    branch: str
    commit: str
    web_url: str
    pull_request_id: str | None
    meta_data: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class BuildListing:
    """Builds in API order (newest first); ``truncated`` when the page cap stopped the listing."""

    builds: tuple[Build, ...]
    truncated: bool


@dataclass(frozen=True, slots=True)
class NewBuild:
    """The body of a create-build request for a pull request's head commit."""

    commit: str
    branch: str
    message: str
    meta_data: Mapping[str, str]
    pull_request_id: int | None = None
    pull_request_base_branch: str | None = None
    pull_request_repository: str | None = None

    def payload(self) -> dict[str, object]:
        body: dict[str, object] = {
            "commit": self.commit,
            "branch": self.branch,
            "message": self.message,
            "meta_data": dict(self.meta_data),
        }
        optional = {
            "pull_request_id": self.pull_request_id,
            "pull_request_base_branch": self.pull_request_base_branch,
            "pull_request_repository": self.pull_request_repository,
        }
        body.update({key: value for key, value in optional.items() if value is not None})
        return body


def parse_build(data: Mapping[str, object]) -> Build:
    """Build a `Build` from API JSON; an empty or absent ``pull_request.id`` counts as absent."""
    pull_request = data.get("pull_request")
    pr_id = pull_request.get("id") if isinstance(pull_request, Mapping) else None
    meta = data.get("meta_data")
    return Build(
        number=int(str(data["number"])),
        state=str(data.get("state", "")),
        branch=str(data.get("branch") or ""),
        commit=str(data.get("commit") or ""),
        web_url=str(data.get("web_url") or ""),
        pull_request_id=str(pr_id) if pr_id not in (None, "") else None,
        meta_data={str(k): str(v) for k, v in meta.items()} if isinstance(meta, Mapping) else {},
    )


@dataclass(slots=True)
class BuildkiteClient:
    """One organization's REST API; every call names the pipeline it acts on."""

    transport: Transport
    organization: str
    base_url: str = DEFAULT_API_URL
    max_pages: int = 10
    per_page: int = 100

    @classmethod
    def create(
        cls,
        token: str,
        organization: str,
        base_url: str = DEFAULT_API_URL,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> BuildkiteClient:
        headers = {"Authorization": f"Bearer {token}", "User-Agent": "dpgate-ci-commands"}
        return cls(Transport(headers, retry or RetryPolicy(), sleep), organization, base_url.rstrip("/"))

    def builds_url(self, pipeline: str) -> str:
        org, slug = quote(self.organization, safe=""), quote(pipeline, safe="")
        return f"{self.base_url}/organizations/{org}/pipelines/{slug}/builds"

    def list_builds(
        self,
        pipeline: str,
        branch: str | Sequence[str] | None = None,
        commit: str | None = None,
        states: Iterable[str] = (),
        meta_data: Mapping[str, str] | None = None,
    ) -> BuildListing:
        """List builds matching every given filter, following pagination within the pipeline.

        Several branches are sent as ``branch[]`` so one listing covers ``owner:branch`` and the
        bare name. Raises `UnsafeLinkError` rather than follow a link elsewhere.
        """
        endpoint = self.builds_url(pipeline)
        url: str | None = f"{endpoint}?{urlencode(self._query(branch, commit, states, meta_data))}"
        builds: list[Build] = []
        for _ in range(self.max_pages):
            if url is None:
                return BuildListing(tuple(builds), truncated=False)
            if not same_endpoint(url, endpoint):
                raise UnsafeLinkError(f"refusing to follow {url}: outside {endpoint}")
            response = self.transport.request("GET", url)
            page = response.json()
            if not isinstance(page, list):
                raise TypeError(f"{url} did not answer a JSON array")
            builds.extend(parse_build(item) for item in page if isinstance(item, Mapping))
            url = response.link("next")
        return BuildListing(tuple(builds), truncated=url is not None)

    def _query(
        self,
        branch: str | Sequence[str] | None,
        commit: str | None,
        states: Iterable[str],
        meta_data: Mapping[str, str] | None,
    ) -> list[tuple[str, str]]:
        query: list[tuple[str, str]] = []
        if isinstance(branch, str):
            query.append(("branch", branch))
        elif branch is not None:
            query.extend(("branch[]", name) for name in branch)
        if commit is not None:
            query.append(("commit", commit))
        query.extend(("state[]", str(state)) for state in states)
        query.extend((f"meta_data[{key}]", value) for key, value in (meta_data or {}).items())
        query.append(("per_page", str(self.per_page)))
        return query

    def cancel_build(self, pipeline: str, number: int) -> Build:
        """Cancel one build; Buildkite answers 422 when the build is no longer cancellable."""
        return self._put(f"{self.builds_url(pipeline)}/{int(number)}/cancel")

    def rebuild_build(self, pipeline: str, number: int) -> Build:
        """Buildkite's rebuild: a new build of the same commit, branch and settings."""
        return self._put(f"{self.builds_url(pipeline)}/{int(number)}/rebuild")

    def create_build(self, pipeline: str, build: NewBuild) -> Build:
        return self._build(self.transport.request("POST", self.builds_url(pipeline), build.payload()).json())

    def _put(self, url: str) -> Build:
        return self._build(self.transport.request("PUT", url).json())

    @staticmethod
    def _build(data: object) -> Build:
        if not isinstance(data, Mapping):
            raise TypeError("build answer is not a JSON object")
        return parse_build(data)
