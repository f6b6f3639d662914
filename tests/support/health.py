"""The suite's one health poller: grpc.health.v1 Check until SERVING, for every test that waits on
a server (an engine, a gateway, `dpgate serve`)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING


def poll_until_serving(
    target: str | grpc.Channel,
    service: str = "",
    timeout: float = 90,
    *,
    process: subprocess.Popen | None = None,
    log_path: Path | None = None,
    interval: float = 0.02,
) -> list[int]:
    """Check `service` on `target` (an address, or a channel the caller keeps) every `interval` s
    until it answers SERVING; return every answer seen, SERVING last. A server not listening yet
    counts as not serving. With `process`, its exit ends the wait at once with an error that
    carries its status and the tail of `log_path`."""
    if isinstance(target, str):
        with grpc.insecure_channel(target) as channel:
            return _poll(channel, target, service, timeout, process, log_path, interval)
    return _poll(target, "the server", service, timeout, process, log_path, interval)


def _poll(channel: grpc.Channel, name: str, service: str, timeout: float, process: subprocess.Popen | None,
          log_path: Path | None, interval: float) -> list[int]:  # fmt: skip
    stub = health_pb2_grpc.HealthStub(channel)
    seen: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            log = f": {log_path.read_text()[-2000:]}" if log_path is not None and log_path.exists() else ""
            raise RuntimeError(f"{name} exited with status {process.returncode} before serving{log}")
        try:
            seen.append(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1).status)
        except grpc.RpcError:
            pass  # not listening yet, or not answering: not serving
        else:
            if seen[-1] == SERVING:
                return seen
        time.sleep(interval)
    raise TimeoutError(f"health of {service!r} on {name} not SERVING after {timeout}s; last answers {seen[-3:]}")


def health_status(address: str, service: str = "") -> int:
    """One grpc.health.v1 Check answer (a HealthCheckResponse.ServingStatus value)."""
    with grpc.insecure_channel(address) as channel:
        request = health_pb2.HealthCheckRequest(service=service)
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=5).status


def poll_until_http_ok(
    url: str, process: subprocess.Popen | None, name: str, timeout: float = 180, interval: float = 0.5
) -> None:
    """GET `url` every `interval` s until it answers 200 (an HTTP server's readiness: `dpgate serve`'s
    /health, a peer's /v1/models); fails naming `name` if `process` exits or time runs out."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode} before serving")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(interval)
    raise RuntimeError(f"{name} did not answer 200 on {url} within {timeout:.0f} s")
