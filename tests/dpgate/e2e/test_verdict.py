"""The verdict: exit status per class, the sentinel's shape, and the atomic sentinel writer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpgate.e2e.contracts import FailureClass, GateResult, Topology
from dpgate.e2e.verdict import (
    EXIT_CODES,
    EXIT_INTERRUPTED,
    RunRecord,
    StageRecord,
    WorkloadRecord,
    exit_status,
    sentinel,
    write_sentinel,
)
from tests.dpgate.e2e.support import ROOT


def record(failure: FailureClass | None = None, interrupted: bool = False, dp: int = 1) -> RunRecord:
    run = RunRecord(Topology(dp=dp), "local", "/tmp/run", interrupted=interrupted)
    run.stages.append(StageRecord("preflight", "passed", 0.5, 120.0, "ok"))
    run.workloads.append(WorkloadRecord(GateResult("smoke", True, {"calls": 4}), 1.25, 600.0))
    if failure is not None:
        run.fail(failure, "bring-up: engine-0 exited")
    return run


def test_every_class_has_its_own_non_zero_exit_status_apart_from_argparse_and_signals() -> None:
    codes = [EXIT_CODES[failure] for failure in FailureClass]
    assert len(set(codes)) == len(FailureClass) and 0 not in codes and 2 not in codes
    assert EXIT_INTERRUPTED not in codes
    assert exit_status([record()]) == 0
    for failure in FailureClass:
        assert exit_status([record(), record(failure)]) == EXIT_CODES[failure]
    assert exit_status([record(interrupted=True)]) == EXIT_INTERRUPTED


def test_the_first_failure_is_the_one_recorded() -> None:
    run = record(FailureClass.ENGINE_FAILED)
    run.fail(FailureClass.INFRA, "teardown failed")
    assert (run.failure, run.detail) == (FailureClass.ENGINE_FAILED, "bring-up: engine-0 exited")


def test_one_run_is_the_sentinel_itself_and_a_matrix_lists_its_runs() -> None:
    single = sentinel([record(FailureClass.ACCURACY_GATE)], None)
    assert single["verdict"] == "fail" and single["failure_class"] == "accuracy-gate" and single["exit_status"] == 14
    assert single["topology"] == {"dp": 1, "tp": 1, "dcp": 1, "model": "smollm2-135m-instruct",
                                  "name": "dp1-tp1-dcp1-smollm2-135m-instruct"}  # fmt: skip
    assert single["stages"] == [
        {"name": "preflight", "status": "passed", "duration_s": 0.5, "budget_s": 120.0, "detail": "ok"}
    ]
    assert single["workloads"] == [
        {"name": "smoke", "passed": True, "figures": {"calls": 4}, "detail": "", "duration_s": 1.25, "budget_s": 600.0}
    ]
    matrix = sentinel([record(), record(FailureClass.BRINGUP_TIMEOUT, dp=2)], "full")
    assert (matrix["verdict"], matrix["failure_class"], matrix["exit_status"]) == ("fail", "bring-up-timeout", 12)
    assert matrix["detail"].startswith("dp2-tp1-dcp1-smollm2-135m-instruct: ")
    assert [run["verdict"] for run in matrix["runs"]] == ["pass", "fail"]
    json.dumps(matrix)  # plain JSON all through


def test_the_sentinel_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    write_sentinel(path, {"verdict": "fail"})
    write_sentinel(path, {"verdict": "pass"})
    assert json.loads(path.read_text()) == {"verdict": "pass"}
    assert [entry.name for entry in tmp_path.iterdir()] == ["result.json"]  # no temporary file left


@pytest.mark.e2e
def test_a_crash_before_the_rename_leaves_the_old_sentinel(tmp_path: Path) -> None:
    """The writer is killed (os._exit) at the moment it would rename: the old sentinel is intact."""
    path = tmp_path / "result.json"
    write_sentinel(path, {"verdict": "pass", "run": 1})
    crash = (
        "import os, sys\n"
        "from dpgate.e2e import verdict\n"
        "os.replace = lambda *args: os._exit(9)\n"
        "verdict.write_sentinel(sys.argv[1], {'verdict': 'fail', 'run': 2})\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", crash, str(path)], env=env, cwd=ROOT, timeout=60)
    assert result.returncode == 9
    assert json.loads(path.read_text()) == {"verdict": "pass", "run": 1}
    [staging] = [entry for entry in tmp_path.iterdir() if entry.name != "result.json"]
    assert json.loads(staging.read_text()) == {"verdict": "fail", "run": 2}  # fsynced whole before the rename


def test_a_failed_write_raises_and_leaves_the_old_sentinel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "result.json"
    write_sentinel(path, {"verdict": "pass"})
    with pytest.raises(TypeError):
        write_sentinel(path, {"verdict": object.__new__(type("Unserialisable", (), {"__str__": None}))})
    assert json.loads(path.read_text()) == {"verdict": "pass"}
    assert [entry.name for entry in tmp_path.iterdir()] == ["result.json"]
