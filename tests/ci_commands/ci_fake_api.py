"""A fake GitHub + Buildkite API on 127.0.0.1 that records every call (fixtures: conftest.py).

The fake implements the filters and pagination the real APIs document (branch / branch[],
commit, state[], meta_data[...], per_page + Link), so tests see what the client asked for;
``ignore_filters`` makes it answer everything, to prove the local ownership re-check alone
keeps other builds safe. Errors and 429s are injected per build or per path.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

REPO = "dpgate-project/dpgate"
ORG = "dpgate"
PIPELINE = "dpgate-gpu"
GITHUB_TOKEN = "gh-test-token"
BUILDKITE_TOKEN = "bk-test-token"
BUILDS_PATH = f"/buildkite/v2/organizations/{ORG}/pipelines/{PIPELINE}/builds"
CANCELLABLE = {"scheduled", "running", "failing", "blocked"}


@dataclass(frozen=True, slots=True)
class Call:
    method: str
    path: str
    query: dict[str, list[str]]
    body: object


@dataclass(slots=True)
class FakeApi:
    """State of both fake services; tests arrange it, run code, then read ``calls``."""

    base_url: str = ""
    calls: list[Call] = field(default_factory=list)
    pulls: dict[int, dict] = field(default_factory=dict)
    permissions: dict[str, tuple[str, str]] = field(default_factory=dict)
    reviews: dict[int, list[dict]] = field(default_factory=dict)
    comments: list[tuple[int, str]] = field(default_factory=list)
    reactions: set[tuple[int, str, str]] = field(default_factory=set)
    builds: dict[int, dict] = field(default_factory=dict)
    cancel_status: dict[int, int] = field(default_factory=dict)
    throttles: list[tuple[str, str, str]] = field(default_factory=list)
    ignore_filters: bool = False
    next_link_override: str | None = None
    page_size: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    # ----- arrangement helpers -------------------------------------------------------------
    def add_pull(
        self,
        number: int = 42,
        author: str = "alice",
        ref: str = "feature-x",
        head_owner: str = "alice",
        *,
        draft: bool = False,
        labels: tuple[str, ...] = (),
        state: str = "open",
        head_sha: str = "a" * 40,
    ) -> dict:
        head_repo = f"{head_owner}/dpgate" if head_owner != REPO.split("/")[0] else REPO
        pull = {
            "number": number,
            "user": {"login": author},
            "state": state,
            "draft": draft,
            "labels": [{"name": name} for name in labels],
            "head": {
                "sha": head_sha,
                "ref": ref,
                "label": f"{head_owner}:{ref}",
                "repo": {"full_name": head_repo, "clone_url": f"https://github.com/{head_repo}.git"},
            },
            "base": {"ref": "main", "repo": {"full_name": REPO}},
        }
        self.pulls[number] = pull
        return pull

    def add_build(
        self,
        number: int,
        branch: str,
        state: str = "running",
        *,
        pr: int | None = None,
        meta: dict[str, str] | None = None,
        commit: str = "a" * 40,
    ) -> dict:
        build = {
            "number": number,
            "state": state,
            "branch": branch,
            "commit": commit,
            "web_url": f"https://buildkite.com/{ORG}/{PIPELINE}/builds/{number}",
            "pull_request": None if pr is None else {"id": str(pr), "base": "main", "repository": "x"},
            "meta_data": dict(meta or {}),
        }
        self.builds[number] = build
        return build

    def throttle(self, method: str, path_part: str, reset: str = "3") -> None:
        """Answer the next ``method`` request whose path contains ``path_part`` with one 429."""
        self.throttles.append((method, path_part, reset))

    # ----- reading helpers -----------------------------------------------------------------
    def calls_to(self, method: str, pattern: str) -> list[Call]:
        return [c for c in self.calls if c.method == method and re.search(pattern, c.path)]

    def cancelled_numbers(self) -> list[int]:
        return sorted(int(c.path.split("/")[-2]) for c in self.calls_to("PUT", r"/builds/\d+/cancel$"))

    @property
    def github_url(self) -> str:
        return self.base_url + "/github"

    @property
    def buildkite_url(self) -> str:
        return self.base_url + "/buildkite/v2"


def _route(api: FakeApi, method: str, path: str, query: dict[str, list[str]], body: object, auth: str):
    """Return (status, json body, extra headers) for one request."""
    for index, (t_method, part, reset) in enumerate(api.throttles):
        if t_method == method and part in path:
            del api.throttles[index]
            return 429, {"message": "rate limited"}, {"RateLimit-Reset": reset, "Retry-After": reset}
    if path == "/redirect":
        return 302, {}, {"Location": f"{api.base_url}/github/repos/{REPO}/pulls/42"}
    if path.startswith("/github/"):
        if auth != f"Bearer {GITHUB_TOKEN}":
            return 401, {"message": "bad token"}, {}
        return _github(api, method, path.removeprefix("/github"), query, body)
    if path.startswith("/buildkite/"):
        if auth != f"Bearer {BUILDKITE_TOKEN}":
            return 401, {"message": "bad token"}, {}
        return _buildkite(api, method, path, query, body)
    return 404, {"message": "no such service"}, {}


def _github(api: FakeApi, method: str, path: str, query: dict, body: object):
    prefix = f"/repos/{REPO}"
    if not path.startswith(prefix + "/"):
        return 404, {"message": "Not Found"}, {}
    rest = path.removeprefix(prefix)
    if method == "GET" and (m := re.fullmatch(r"/pulls/(\d+)", rest)):
        pull = api.pulls.get(int(m[1]))
        return (200, pull, {}) if pull else (404, {"message": "Not Found"}, {})
    if method == "GET" and (m := re.fullmatch(r"/pulls/(\d+)/reviews", rest)):
        return _page(api, api.reviews.get(int(m[1]), []), path, query, base="/github")
    if method == "GET" and (m := re.fullmatch(r"/collaborators/([^/]+)/permission", rest)):
        found = api.permissions.get(m[1].lower())
        if found is None:
            return 404, {"message": "Not Found"}, {}
        return 200, {"permission": found[0], "role_name": found[1]}, {}
    if method == "POST" and (m := re.fullmatch(r"/issues/(\d+)/comments", rest)):
        api.comments.append((int(m[1]), body["body"]))
        return 201, {"id": len(api.comments)}, {}
    if method == "POST" and (m := re.fullmatch(r"/issues/comments/(\d+)/reactions", rest)):
        key = (int(m[1]), body["content"], "bot")
        existed = key in api.reactions
        api.reactions.add(key)
        return (200 if existed else 201), {"content": body["content"]}, {}
    return 404, {"message": "Not Found"}, {}


def _matches(build: dict, query: dict[str, list[str]]) -> bool:
    branches = query.get("branch[]", []) + query.get("branch", [])
    if branches and build["branch"] not in branches:
        return False
    if "commit" in query and build["commit"] not in query["commit"]:
        return False
    states = query.get("state[]", []) + query.get("state", [])
    if states and build["state"] not in states:
        return False
    for key, values in query.items():
        if (m := re.fullmatch(r"meta_data\[(.+)\]", key)) and build["meta_data"].get(m[1]) not in values:
            return False
    return True


def _page(api: FakeApi, items: list, path: str, query: dict, base: str = ""):
    per_page = api.page_size or int(query.get("per_page", ["30"])[0])
    page = int(query.get("page", ["1"])[0])
    chunk = items[(page - 1) * per_page : page * per_page]
    headers = {}
    if api.next_link_override is not None:
        headers["Link"] = f'<{api.next_link_override}>; rel="next"'
    elif page * per_page < len(items):
        next_query = {k: v for k, v in query.items() if k != "page"} | {"page": [str(page + 1)]}
        url = f"{api.base_url}{base}{path}?{urlencode(next_query, doseq=True)}"
        headers["Link"] = f'<{url}>; rel="next", <{url}>; rel="last"'
    return 200, chunk, headers


def _buildkite(api: FakeApi, method: str, path: str, query: dict, body: object):
    if not path.startswith(BUILDS_PATH):
        return 404, {"message": "No pipeline found"}, {}
    rest = path.removeprefix(BUILDS_PATH)
    if method == "GET" and rest == "":
        found = [b for b in api.builds.values() if api.ignore_filters or _matches(b, query)]
        found.sort(key=lambda b: b["number"], reverse=True)
        return _page(api, found, path, query)
    if method == "POST" and rest == "":
        number = max(api.builds, default=0) + 1
        build = api.add_build(
            number, body["branch"], "scheduled", meta=body.get("meta_data"), commit=body["commit"]
        )
        if "pull_request_id" in body:
            build["pull_request"] = {
                "id": str(body["pull_request_id"]),
                "base": body.get("pull_request_base_branch"),
            }
        return 201, build, {}
    m = re.fullmatch(r"/(\d+)/(cancel|rebuild)", rest)
    if method != "PUT" or not m or int(m[1]) not in api.builds:
        return 404, {"message": "Not Found"}, {}
    build = api.builds[int(m[1])]
    if m[2] == "rebuild":
        number = max(api.builds) + 1
        new = api.add_build(
            number, build["branch"], "scheduled", meta=build["meta_data"], commit=build["commit"]
        )
        new["pull_request"] = build["pull_request"]
        return 200, new, {}
    if int(m[1]) in api.cancel_status:
        return api.cancel_status[int(m[1])], {"message": "Build can't be canceled"}, {}
    if build["state"] not in CANCELLABLE:
        return 422, {"message": "Build can't be canceled because it's already finished"}, {}
    build["state"] = "canceled"
    return 200, build, {}


def _handler(api: FakeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            query = parse_qs(parts.query)
            with api.lock:
                api.calls.append(Call(self.command, parts.path, query, body))
                status, payload, headers = _route(
                    api, self.command, parts.path, query, body, self.headers.get("Authorization", "")
                )
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = _serve

        def log_message(self, format: str, *args: object) -> None:
            """Keep test output quiet; ``api.calls`` is the log."""

    return Handler


def start(api: FakeApi) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """Serve ``api`` on 127.0.0.1 on a free port; the caller shuts the server down."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
    api.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    return server, thread
