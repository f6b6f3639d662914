"""X-Hub-Signature-256 verification and the optional webhook receiver."""

import hashlib
import hmac
import http.client
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from ci_commands.webhook import make_receiver, sign, verify_signature

SECRET = b"It's a Secret to Everybody"
BODY = b"Hello, World!"
# The example from GitHub's "Validating webhook deliveries" documentation.
GITHUB_EXAMPLE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"


def test_signature_matches_githubs_documented_example() -> None:
    assert sign(SECRET, BODY) == GITHUB_EXAMPLE


@pytest.mark.parametrize(
    ("secret", "body", "header", "expected"),
    [
        (SECRET, BODY, GITHUB_EXAMPLE, True),
        (b"other secret", BODY, GITHUB_EXAMPLE, False),
        (SECRET, BODY + b" ", GITHUB_EXAMPLE, False),
        (SECRET, BODY, None, False),
        (SECRET, BODY, "", False),
        (SECRET, BODY, GITHUB_EXAMPLE.upper().replace("SHA256", "sha256"), False),
        (SECRET, BODY, GITHUB_EXAMPLE.removeprefix("sha256="), False),
        (SECRET, BODY, "sha1=" + hmac.new(SECRET, BODY, hashlib.sha1).hexdigest(), False),
        (SECRET, BODY, GITHUB_EXAMPLE + "00", False),
        (b"", BODY, sign(b"", BODY), False),
    ],
    ids=[
        "valid",
        "wrong-secret",
        "tampered",
        "missing",
        "empty",
        "upper-hex",
        "no-prefix",
        "sha1",
        "long",
        "empty-secret",
    ],
)
def test_verify_signature(secret: bytes, body: bytes, header: str | None, expected: bool) -> None:
    assert verify_signature(secret, body, header) is expected


@pytest.fixture
def receiver() -> Iterator[tuple[str, list]]:
    received: list = []

    def handle(payload):
        if payload.get("explode"):
            raise RuntimeError("boom")
        received.append(payload)
        return "HANDLED"

    server = make_receiver(SECRET, handle)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def post(url: str, body: bytes, signature: str | None, event: str = "issue_comment") -> tuple[int, bytes]:
    headers = {"X-GitHub-Event": event, "Content-Type": "application/json"}
    if signature is not None:
        headers["X-Hub-Signature-256"] = signature
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_receiver_passes_signed_comment_events_on(receiver: tuple[str, list]) -> None:
    url, received = receiver
    body = json.dumps({"action": "created"}).encode()
    assert post(url, body, sign(SECRET, body)) == (200, b"HANDLED")
    assert received == [{"action": "created"}]


@pytest.mark.parametrize("signature", [None, "sha256=" + "0" * 64, sign(b"wrong", b"{}")])
def test_receiver_rejects_bad_signatures_before_parsing(
    receiver: tuple[str, list], signature: str | None
) -> None:
    url, received = receiver
    assert post(url, b"{}", signature)[0] == 401
    assert received == []


def test_receiver_acknowledges_and_drops_other_events(receiver: tuple[str, list]) -> None:
    url, received = receiver
    assert post(url, b"{}", sign(SECRET, b"{}"), event="push")[0] == 204
    assert received == []


@pytest.mark.parametrize(("body", "status"), [(b"not json", 400), (b"[1, 2]", 400), (b'{"explode": 1}', 500)])
def test_receiver_reports_bad_payloads_and_handler_errors(
    receiver: tuple[str, list], body: bytes, status: int
) -> None:
    url, received = receiver
    assert post(url, body, sign(SECRET, body))[0] == status
    assert received == []


def test_receiver_refuses_oversized_bodies_without_reading_them(receiver: tuple[str, list]) -> None:
    url, received = receiver
    connection = http.client.HTTPConnection(urlsplit(url).netloc, timeout=5)
    try:
        connection.putrequest("POST", "/")
        connection.putheader("Content-Length", str((1 << 20) + 1))
        connection.putheader("X-GitHub-Event", "issue_comment")
        connection.endheaders()  # the body is never sent: the answer must not wait for it
        assert connection.getresponse().status == 413
    finally:
        connection.close()
    assert received == []


def test_receiver_needs_a_secret() -> None:
    with pytest.raises(ValueError):
        make_receiver(b"", lambda payload: None)
