"""A DP=1, T=1, C=1 engine of the target's model, started by a gate itself as the reference.

It is a `dpgate engine` subprocess with nothing but `--model` and a free 127.0.0.1 port, so it
serves exactly what a default T1 C1 engine serves (the same numerics, kernels and dtype choice);
only its port and log are its own. It runs alone, so the reference is never batched with anything.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dpgate.e2e.gates.calls import remaining
from dpgate.ports import free_port

# The directory holding the `dpgate` package the gate was imported from, so the reference runs
# the same code as the gate (a checkout or an installed distribution alike).
_PACKAGE_ROOT = Path(__file__).resolve().parents[3]
_LOG_LINES_ON_FAILURE = 20


class ReferenceEngineFailed(RuntimeError):
    """The reference engine exited before serving; the message ends with its last log lines."""


def _log_tail(path: Path) -> str:
    lines = path.read_text(errors="replace").splitlines()[-_LOG_LINES_ON_FAILURE:]
    return "\n".join(lines)


def _wait_serving(address: str, process: subprocess.Popen, log_path: Path, deadline: float) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if process.poll() is not None:
                status = process.returncode
                raise ReferenceEngineFailed(
                    f"the reference engine exited with status {status} before serving:\n{_log_tail(log_path)}"
                )
            with contextlib.suppress(grpc.RpcError):
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=min(1.0, remaining(deadline)))
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            time.sleep(0.1)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def reference_engine(model: str, deadline: float) -> Iterator[str]:
    """Run the reference engine for `model` until the block ends; yields its HOST:PORT once SERVING.
    Raises ReferenceEngineFailed if it exits first, TimeoutError if `deadline` passes first."""
    port = free_port()
    python_path = [str(_PACKAGE_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(python_path))
    # A model given as a relative path is resolved here, since the engine runs in a scratch folder.
    spec = str(Path(model).resolve()) if Path(model).exists() else model
    command = [sys.executable, "-m", "dpgate.cli", "engine", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--model", spec]
    with tempfile.TemporaryDirectory(prefix="dpgate-reference-") as scratch:
        log_path = Path(scratch) / "engine.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=scratch)
        try:
            address = f"127.0.0.1:{port}"
            _wait_serving(address, process, log_path, deadline)
            yield address
        finally:
            _stop(process)
