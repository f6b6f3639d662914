"""Start dpgate processes for end-to-end tests: free ports on 127.0.0.1, health polling, and a
stop that ends only the process the test started."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dpgate.ports import free_port as free_port  # re-exported: the tests import it from here


def pinned_to_one_cpu() -> None:
    """A `preexec_fn`: the child may run on one CPU only, as in a one-CPU cpuset."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def dpgate_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "dpgate.cli", *args]


@dataclass
class RunningProcess:
    process: subprocess.Popen
    address: str
    seconds_to_serving: float


def wait_until_serving(address: str, process: subprocess.Popen, timeout: float) -> float:
    """Poll grpc.health.v1 until SERVING; fail early if the process exits."""
    started = time.monotonic()
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() - started < timeout:
            if process.poll() is not None:
                raise RuntimeError(f"process exited with status {process.returncode} before serving")
            with contextlib.suppress(grpc.RpcError):
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return time.monotonic() - started
            time.sleep(0.1)
    raise TimeoutError(f"{address} did not report SERVING within {timeout} s")


@contextlib.contextmanager
def running(
    args: Sequence[str], port: int, timeout: float = 120.0, log_path: str | None = None
) -> Iterator[RunningProcess]:
    """Run `dpgate ARGS` until the block ends, then SIGTERM it (SIGKILL if it lingers)."""
    log = open(log_path or os.devnull, "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(dpgate_command(*args), stdout=log, stderr=subprocess.STDOUT)
    try:
        address = f"127.0.0.1:{port}"
        yield RunningProcess(process, address, wait_until_serving(address, process, timeout))
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()
