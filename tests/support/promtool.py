"""Running Prometheus's `promtool` in tests; ./dev.sh test installs it (Debian package `prometheus`)."""

from __future__ import annotations

import shutil
import subprocess

import pytest


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `promtool ARGS`; a missing promtool fails the test (CI must run these checks, never skip them)."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed: ./dev.sh test installs it (apt-get install prometheus)")
    return subprocess.run([path, *args], input=stdin, capture_output=True, text=True, timeout=60, check=False)
