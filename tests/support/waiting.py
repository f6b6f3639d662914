"""Waiting on a condition another process makes true (a log line written, a counter reached): the
suite's one polling loop for what has no readiness signal of its own."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Poll `condition` every 20 ms until it is truthy; fail the test naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
