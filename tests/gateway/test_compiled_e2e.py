"""The gateway's data path in the processes that run it: compiled where `./dev.sh install` built it,
Python where asked to be, and the Python form as correct as the compiled one (gateway/compiled.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gateway import compiled

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str, **env: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env}, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


WHICH_FORM = """
from gateway import compiled
import gateway.front_door, gateway.upstream, gateway.http2.connection
print(compiled.status())
print(all(compiled.is_compiled(m) for m in (gateway.front_door, gateway.upstream, gateway.http2.connection)))
"""


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler to build with")
def test_the_installed_gateway_runs_its_data_path_compiled() -> None:
    # ./dev.sh install builds it (python -m gateway.mypyc_build): a failed or stale build shows here.
    status, all_compiled = run_python(WHICH_FORM).splitlines()
    assert status.startswith("compiled: mypyc build "), status
    assert all_compiled == "True"


def test_the_environment_variable_keeps_the_data_path_python() -> None:
    status, all_compiled = run_python(WHICH_FORM, **{compiled.INTERPRETED_ENV: "1"}).splitlines()
    assert status == f"interpreted: {compiled.INTERPRETED_ENV} is set"
    assert all_compiled == "False"


def test_the_data_path_passes_the_http2_suite_as_python() -> None:
    # CI runs the suite against the compiled build; the Python form (no compiler, or the variable)
    # must behave the same.
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/gateway/http2",
         "--deselect", "tests/gateway/http2/test_fuzz.py::test_atheris_finds_nothing_in_100_000_inputs"],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, compiled.INTERPRETED_ENV: "1"}, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:]
