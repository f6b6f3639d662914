"""The processes a run started: each in its own process group (so TP workers and any host wrapper
go with it), its stdout and stderr in its own log file, stopped by its process group only."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections import deque
from dataclasses import dataclass

from dpgate.e2e.plan import SOURCE_ROOT, ChildSpec

STOP_TIMEOUT_S = 15.0
TAIL_LINES = 20


@dataclass(slots=True)
class Child:
    spec: ChildSpec
    process: subprocess.Popen

    @property
    def name(self) -> str:
        return self.spec.name

    def exited(self) -> int | None:
        """The exit status if the process has ended, else None."""
        return self.process.poll()

    def tail(self, lines: int = TAIL_LINES) -> str:
        """The last `lines` lines of the child's log, for a failure's detail."""
        try:
            with self.spec.log_path.open(errors="replace") as log:
                return "".join(deque(log, maxlen=lines)).rstrip()
        except OSError as error:
            return f"(log {self.spec.log_path} unreadable: {error})"


def child_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    python_path = str(SOURCE_ROOT) if not path else f"{SOURCE_ROOT}{os.pathsep}{path}"
    return dict(os.environ, PYTHONPATH=python_path, PYTHONUNBUFFERED="1")


def start(spec: ChildSpec, argv: list[str]) -> Child:
    """Start `argv` (the spec's command as its host runs it) with output to the spec's log."""
    spec.log_path.parent.mkdir(parents=True, exist_ok=True)
    with spec.log_path.open("ab") as log:  # the child holds its own copy of the descriptor
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env(),
            start_new_session=True,
        )
    return Child(spec, process)


def stop_all(children: list[Child], timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM every child's process group, wait, then SIGKILL the groups still there. The group
    is signalled even after its leader exited, so orphaned TP workers go too."""
    for child in children:
        _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.process.wait(max(0.0, deadline - time.monotonic()))
    for child in children:
        _signal_group(child, signal.SIGKILL)
        child.process.wait()


def _signal_group(child: Child, signum: int) -> None:
    # start_new_session made the child the leader of a group whose id is its PID.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.process.pid, signum)
