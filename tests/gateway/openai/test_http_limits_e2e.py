"""The HTTP front door's limits and plumbing, over sockets, on the synthetic engine (no model):
body and message size (413), connections (503 past the limit), an unknown path (404 as an OpenAI
error; a wrong method 405 with Allow), invalid JSON (400), /health (GET and HEAD), the request id
echoed, and the access line of each call."""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path

import pytest

from tests.support.gateway_processes import FAST_HEALTH, GatewayProcess, running_synthetic_engine
from tests.support.waiting import wait_for


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    with running_synthetic_engine(tmp_path_factory.mktemp("http-limits-engine")) as engine:
        yield engine


def start_gateway(engine, log_dir: Path, *flags: str) -> GatewayProcess:
    process = GatewayProcess([engine.address], *FAST_HEALTH, "--http-port", "0", *flags, log_dir=log_dir)
    process.wait_ranks([0])
    return process


@pytest.fixture(scope="module")
def gateway(engine, tmp_path_factory: pytest.TempPathFactory):
    """Small body and message limits; the connection limit has a gateway of its own (below), so
    a connection the server has not yet seen close cannot push these tests past it."""
    process = start_gateway(
        engine, tmp_path_factory.mktemp("http-limits"), "--http-max-body-bytes", "2000", "--max-message-bytes", "600"
    )
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def two_connection_gateway(engine, tmp_path_factory: pytest.TempPathFactory):
    process = start_gateway(engine, tmp_path_factory.mktemp("http-connections"), "--http-max-connections", "2")
    try:
        yield process
    finally:
        process.stop()


def post(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("POST", path, body, {"Content-Type": "application/json", **(headers or {})})
        answer = connection.getresponse()
        return answer.status, dict(answer.getheaders()), json.loads(answer.read())
    finally:
        connection.close()


def test_a_completion_echoes_the_request_id(gateway):
    status, headers, body = post(gateway.http_port, "/v1/completions", b'{"prompt": "hi"}', {"x-request-id": "abc-1"})
    assert status == 200 and headers["x-request-id"] == "abc-1" and body["id"] == "cmpl-abc-1"
    # The forwarder writes its access line as the call ends, which may be just after the reply arrives.
    wait_for(lambda: "request_id=abc-1" in Path(gateway.log_path).read_text(), 10, "the access line of abc-1")


def test_a_body_over_the_http_limit_is_413(gateway):
    status, _, body = post(gateway.http_port, "/v1/completions", json.dumps({"prompt": "x" * 3000}).encode())
    assert status == 413 and "2000 bytes" in body["error"]["message"]


def test_a_request_over_the_message_limit_is_413_not_429(gateway):
    status, _, body = post(gateway.http_port, "/v1/completions", json.dumps({"prompt": "x" * 1000}).encode())
    assert status == 413 and "--max-message-bytes" in body["error"]["message"]


def test_invalid_json_and_unknown_paths_are_openai_errors(gateway):
    status, _, body = post(gateway.http_port, "/v1/completions", b"{nope")
    assert status == 400 and body["error"]["message"] == "the request body is not valid JSON"
    status, _, body = post(gateway.http_port, "/v1/embeddings", b"{}")
    assert status == 404 and body["error"]["type"] == "invalid_request_error"
    assert "/v1/embeddings" in body["error"]["message"] and "/v1/chat/completions" in body["error"]["message"]


def test_a_wrong_method_is_a_405_naming_the_allowed_ones(gateway):
    connection = http.client.HTTPConnection("127.0.0.1", gateway.http_port, timeout=10)
    try:
        connection.request("GET", "/v1/completions")
        answer = connection.getresponse()
        body = json.loads(answer.read())
        assert answer.status == 405 and answer.getheader("Allow") == "POST"
        assert body["error"]["type"] == "invalid_request_error" and "POST" in body["error"]["message"]
        connection.request("DELETE", "/health")
        answer = connection.getresponse()
        answer.read()
        assert answer.status == 405 and answer.getheader("Allow") == "GET, HEAD"
    finally:
        connection.close()


def test_a_bad_request_timeout_header_is_a_400_naming_it(gateway):
    status, _, body = post(gateway.http_port, "/v1/completions", b'{"prompt": "hi"}', {"x-request-timeout": "soon"})
    assert status == 400 and "x-request-timeout" in body["error"]["message"]
    status, _, _ = post(gateway.http_port, "/v1/completions", b'{"prompt": "hi"}', {"x-request-timeout": "30"})
    assert status == 200


def test_health_and_models(gateway):
    connection = http.client.HTTPConnection("127.0.0.1", gateway.http_port, timeout=10)
    connection.request("GET", "/health")
    answer = connection.getresponse()
    assert answer.status == 200 and json.loads(answer.read()) == {"status": "ok"}
    connection.request("HEAD", "/health")  # a GET endpoint answers HEAD: the status, no body
    answer = connection.getresponse()
    assert answer.status == 200 and answer.read() == b""
    connection.close()


def test_a_connection_past_the_limit_is_answered_503(two_connection_gateway):
    gateway = two_connection_gateway
    held = [socket.create_connection(("127.0.0.1", gateway.http_port)) for _ in range(2)]
    try:
        for sock in held:  # a request on each, so both are counted as open connections
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        with socket.create_connection(("127.0.0.1", gateway.http_port)) as extra:
            extra.settimeout(5)
            answer = extra.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503") and b"limit of 2 HTTP connections" in answer
    finally:
        for sock in held:
            sock.close()
