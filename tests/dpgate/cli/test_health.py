"""`dpgate health` against real grpc.health.v1 servers on 127.0.0.1: serving, not serving, unknown
service, nothing listening, TLS and mutual TLS, and bad flags (exit 2, one sentence)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dpgate.cli import main
from tests.gateway.tls_files import make_ca, make_signed
from tests.support.gateway_processes import ROOT, _env, free_port

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _health_server(
    statuses: dict[str, int], credentials: grpc.ServerCredentials | None = None
) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    for service, status in statuses.items():
        servicer.set(service, status)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    address = "127.0.0.1:0"
    port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def server_address() -> Iterator[str]:
    """ "" SERVING, one service SERVING and one NOT_SERVING."""
    server, address = _health_server({"": SERVING, "dpgate.v1.InferenceService": SERVING, "off": NOT_SERVING})
    yield address
    server.stop(None)


def _health(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, str]:
    status = main(["health", *flags])
    out, err = capsys.readouterr()
    return status, out, err


def test_serving_server_exits_0(server_address: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _health(capsys, "--address", server_address)
    assert (status, out) == (0, f"{server_address}: SERVING\n")
    status, out, _ = _health(capsys, "--address", server_address, "--service", "dpgate.v1.InferenceService")
    assert (status, out) == (0, f"{server_address}: SERVING\n")


def test_not_serving_service_exits_1(server_address: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _health(capsys, "--address", server_address, "--service", "off")
    assert (status, out) == (1, f"{server_address}: NOT_SERVING (service 'off')\n")


def test_not_serving_server_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    server, address = _health_server({"": NOT_SERVING})
    try:
        status, out, _ = _health(capsys, "--address", address)
    finally:
        server.stop(None)
    assert (status, out) == (1, f"{address}: NOT_SERVING\n")


def test_unknown_service_exits_1(server_address: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _health(capsys, "--address", server_address, "--service", "no.such.Service")
    assert status == 1
    assert out == f"{server_address}: service 'no.such.Service' is unknown to the server (NOT_FOUND)\n"


def test_absent_address_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    address = f"127.0.0.1:{free_port()}"  # bound and released: nothing listens there
    status, out, _ = _health(capsys, "--address", address, "--timeout", "2")
    assert status == 1
    assert out.startswith(f"{address}: not reachable (UNAVAILABLE: ") and out.count("\n") == 1


@pytest.mark.e2e
def test_tls_and_mutual_tls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ca = make_ca(tmp_path, "ca")
    server_pair = make_signed(tmp_path, "server", ca, "serverAuth")
    client_pair = make_signed(tmp_path, "client", ca, "clientAuth")
    credentials = grpc.ssl_server_credentials(
        [(server_pair.key.read_bytes(), server_pair.cert.read_bytes())],
        root_certificates=ca.cert.read_bytes(),
        require_client_auth=True,
    )
    server, address = _health_server({"": SERVING}, credentials)
    client = ("--tls-cert", str(client_pair.cert), "--tls-key", str(client_pair.key))
    try:
        status, out, _ = _health(capsys, "--address", address, "--tls-ca", str(ca.cert), *client)
        assert (status, out) == (0, f"{address}: SERVING\n")
        # Without the client certificate the handshake fails; plaintext never reaches the service.
        for flags in (("--tls-ca", str(ca.cert)), ()):
            status, out, _ = _health(capsys, "--address", address, "--timeout", "2", *flags)
            assert status == 1 and out.startswith(f"{address}: not reachable ("), out
    finally:
        server.stop(None)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--address", "localhost"), "--address 'localhost' must be HOST:PORT"),
        (("--address", "127.0.0.1:70000"), "--address '127.0.0.1:70000' has port 70000"),
        (("--address", "127.0.0.1:1", "--timeout", "0"), "--timeout 0.0 must be greater than 0"),
        (("--address", "127.0.0.1:1", "--tls-cert", "c.pem"), "--tls-cert and --tls-key must be given together"),
        (("--address", "127.0.0.1:1", "--tls-ca", "/no/such.pem"), "--tls-ca '/no/such.pem' cannot be read"),
    ],
)
def test_bad_flags_exit_2(flags: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = _health(capsys, *flags)
    assert status == 2 and out == ""
    assert err.startswith(f"dpgate health: error: {message}") and err.count("\n") == 1, err


@pytest.mark.e2e
def test_command_runs_without_torch(server_address: str) -> None:
    """The probe runs every few seconds in each container: it must not pay for importing torch."""
    code = (
        "import sys; from dpgate.cli import main; status = main(['health', '--address', sys.argv[1]]); "
        "print('torch' in sys.modules); sys.exit(status)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, server_address], capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{server_address}: SERVING\nFalse\n"
