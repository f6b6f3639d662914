"""Running `python -m dpgate e2e` as a subprocess, as CI and a cluster job run it, and reading
what it left: its exit status, its output, its sentinel and its run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]  # tests/dpgate/e2e/support.py -> the repository


@dataclass
class E2ERun:
    returncode: int
    stdout: str
    stderr: str
    run_dir: Path
    sentinel_path: Path

    @property
    def sentinel(self) -> dict[str, Any]:
        return json.loads(self.sentinel_path.read_text())

    def stage(self, name: str) -> dict[str, Any]:
        return next(stage for stage in self.sentinel["stages"] if stage["name"] == name)

    def launched_pids(self) -> list[int]:
        """The PIDs the launch stage reports ("engine-0 pid 123, ...")."""
        detail = self.stage("launch")["detail"]
        return [int(part.rsplit(" ", 1)[1]) for part in detail.split(", ")]

    def logs(self) -> list[str]:
        return sorted(path.name for path in self.run_dir.glob("*.log"))


def run_e2e(run_dir: Path, *flags: str, timeout: float = 300) -> E2ERun:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    result = subprocess.run(
        [sys.executable, "-m", "dpgate", "e2e", "--run-dir", str(run_dir), *flags],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT,
    )  # fmt: skip
    return E2ERun(result.returncode, result.stdout, result.stderr, run_dir, run_dir / "result.json")


def process_gone(pid: int) -> bool:
    """No such process, or only its zombie (an orphan waits there for an init that may not reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"
