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

from dpgate.ports import free_port as free_port  # re-exported: the tests import it from here
from tests.support.health import poll_until_serving


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


@contextlib.contextmanager
def running(
    args: Sequence[str], port: int, timeout: float = 120.0, log_path: str | None = None
) -> Iterator[RunningProcess]:
    """Run `dpgate ARGS` until the block ends, then SIGTERM it (SIGKILL if it lingers)."""
    log = open(log_path or os.devnull, "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(dpgate_command(*args), stdout=log, stderr=subprocess.STDOUT)
    try:
        address = f"127.0.0.1:{port}"
        started = time.monotonic()
        poll_until_serving(address, timeout=timeout, process=process, interval=0.1)
        yield RunningProcess(process, address, time.monotonic() - started)
    finally:
        stop_process(process)
        log.close()


def stop_process(process: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM a child we started, SIGKILL it if it lingers past `timeout`, and reap it."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
