"""Children: each in its own process group, logged to its own file, stopped with its group."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from dpgate.e2e.children import start, stop_all
from dpgate.e2e.plan import ChildSpec
from tests.dpgate.e2e.support import process_gone

pytestmark = pytest.mark.e2e  # every test here starts a process


def spec(tmp_path: Path, name: str, *argv: str) -> ChildSpec:
    return ChildSpec(name, "127.0.0.1", 1, argv, tmp_path / f"{name}.log")


def test_stop_all_ends_the_whole_group_and_the_log_keeps_both_streams(tmp_path: Path) -> None:
    """A child that started a grandchild (as an engine starts TP workers) and ignores SIGTERM:
    the group is killed after the timeout, grandchild included."""
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print('worker', worker.pid, flush=True); print('to stderr', file=sys.stderr, flush=True)\n"
        "time.sleep(60)\n"
    )
    child = start(spec(tmp_path, "engine-0"), [sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while "to stderr" not in child.spec.log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    worker = int(child.tail().splitlines()[0].split()[1])
    assert child.exited() is None
    stop_all([child], timeout=0.5)
    assert child.exited() is not None and process_gone(child.process.pid)
    deadline = time.monotonic() + 5
    while not process_gone(worker) and time.monotonic() < deadline:  # reaped by init once killed
        time.sleep(0.05)
    assert process_gone(worker)


def test_tail_gives_the_last_lines(tmp_path: Path) -> None:
    child = start(spec(tmp_path, "gateway"), [sys.executable, "-c", "for i in range(50): print('line', i)"])
    child.process.wait(30)
    assert child.tail(3).splitlines() == ["line 47", "line 48", "line 49"]
    assert child.exited() == 0
    stop_all([child])
