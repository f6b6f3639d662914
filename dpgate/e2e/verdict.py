"""The verdict: what a run (or a matrix of runs) ended as, its exit status, and the JSON sentinel.

The sentinel is what a cluster scheduler or CI reads after the job: it is written atomically
(a temporary file in the same directory, fsync, rename, fsync of the directory), so a reader sees
the previous complete sentinel or the new complete one, never half of one, even if the runner
is killed mid-write.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dpgate.e2e.contracts import FailureClass, GateResult, Topology

SCHEMA_VERSION = 1
# Exit status per failure class; 2 stays argparse's (bad flags) and 130 is an interrupted run.
EXIT_PASS = 0
EXIT_INTERRUPTED = 130
EXIT_CODES: dict[FailureClass, int] = {
    FailureClass.INFRA: 10,
    FailureClass.ENGINE_FAILED: 11,
    FailureClass.BRINGUP_TIMEOUT: 12,
    FailureClass.WORKLOAD_TIMEOUT: 13,
    FailureClass.ACCURACY_GATE: 14,
}


@dataclass(slots=True)
class StageRecord:
    """One stage as it ran: `status` is "passed", "failed" or "skipped" (an earlier stage failed)."""

    name: str
    status: str
    duration_s: float = 0.0
    budget_s: float = 0.0
    detail: str = ""


@dataclass(frozen=True, slots=True)
class WorkloadRecord:
    """One workload's GateResult with how long it ran and the budget it had."""

    result: GateResult
    duration_s: float
    budget_s: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self.result) | {"duration_s": round(self.duration_s, 3), "budget_s": self.budget_s}


@dataclass(slots=True)
class RunRecord:
    """One topology's run, as the sentinel carries it. `failure` is None when it passed, and also
    when it was interrupted (`interrupted` then says so)."""

    topology: Topology
    hosts: str
    run_dir: str
    stages: list[StageRecord] = field(default_factory=list)
    workloads: list[WorkloadRecord] = field(default_factory=list)
    failure: FailureClass | None = None
    detail: str = ""
    interrupted: bool = False
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.failure is None and not self.interrupted

    def fail(self, failure: FailureClass, detail: str) -> None:
        """Record the first failure only: later ones (e.g. during teardown) are consequences."""
        if self.failure is None:
            self.failure, self.detail = failure, detail

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": "pass" if self.passed else "fail",
            "failure_class": None if self.failure is None else self.failure.value,
            "exit_status": exit_status([self]),
            "detail": self.detail,
            "topology": asdict(self.topology) | {"name": self.topology.name},
            "hosts": self.hosts,
            "run_dir": self.run_dir,
            "duration_s": round(self.duration_s, 3),
            "stages": [asdict(stage) | {"duration_s": round(stage.duration_s, 3)} for stage in self.stages],
            "workloads": [workload.to_json() for workload in self.workloads],
        }


def exit_status(records: list[RunRecord]) -> int:
    """0 if every run passed, else the first failed run's class code (130 if interrupted first)."""
    for record in records:
        if record.interrupted and record.failure is None:
            return EXIT_INTERRUPTED
        if record.failure is not None:
            return EXIT_CODES[record.failure]
    return EXIT_PASS


def sentinel(
    records: list[RunRecord], matrix: str | None, left_out: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    """The sentinel document: one run's record at the top level, or a matrix's runs under "runs"
    (and under "left_out" the topologies its model cannot split, with the reason)."""
    if matrix is None and len(records) == 1:
        return {"schema": SCHEMA_VERSION, **records[0].to_json()}
    failed = next((record for record in records if not record.passed), None)
    return {
        "schema": SCHEMA_VERSION,
        "matrix": matrix,
        "verdict": "pass" if failed is None else "fail",
        "failure_class": None if failed is None or failed.failure is None else failed.failure.value,
        "exit_status": exit_status(records),
        "detail": "" if failed is None else f"{failed.topology.name}: {failed.detail}",
        "runs": [record.to_json() for record in records],
        "left_out": list(left_out or []),
    }


def write_sentinel(path: Path, document: dict[str, Any]) -> None:
    """Write `document` as JSON to `path` atomically (see the module docstring)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(document, out, indent=2, default=str)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(staging, path)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
