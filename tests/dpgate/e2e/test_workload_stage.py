"""The workload stage without engines: each workload's outcome becomes its class, a hang is
abandoned at its budget, and a child that dies meanwhile ends the stage as ENGINE_FAILED."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from dpgate.e2e.children import start, stop_all
from dpgate.e2e.contracts import FailureClass, Topology
from dpgate.e2e.local_hosts import LocalHosts
from dpgate.e2e.plan import Budgets, RunSettings, make_plan
from dpgate.e2e.stages import StageFailure
from dpgate.e2e.verdict import RunRecord
from dpgate.e2e.workload_stage import run_workloads

SAMPLES = "tests.dpgate.e2e.sample_workloads"


def stage(tmp_path: Path, *workloads: str, budget: float = 5.0, children=()):
    settings = RunSettings(Topology(dp=2), "local", workloads, Budgets(workload_s=budget), tmp_path)
    plan = make_plan(settings, LocalHosts())
    record = RunRecord(settings.topology, "local", str(tmp_path))
    lines: list[str] = []
    try:
        summary = run_workloads(plan, LocalHosts(), list(children), record, lines.append)
    except StageFailure as failure:
        return record, failure, lines
    return record, summary, lines


def test_workloads_get_the_target_and_their_results_are_kept(tmp_path: Path) -> None:
    record, summary, lines = stage(tmp_path, f"{SAMPLES}:passes", f"{SAMPLES}:passes")
    assert summary == "2 workloads passed"
    assert [workload.result.figures["engines"] for workload in record.workloads] == [2, 2]
    assert lines[0].startswith(f"workload {SAMPLES}:passes: passed")


@pytest.mark.parametrize(
    ("workload", "detail"),
    [("fails", "score 0.25 under the threshold 0.5"), ("raises", "raised ConnectionError: the gateway hung up"),
     ("returns_none", "returned NoneType, not a GateResult")],
)  # fmt: skip
def test_a_failing_or_broken_workload_is_an_accuracy_gate_failure_and_the_rest_still_run(
    tmp_path: Path, workload: str, detail: str
) -> None:
    record, failure, _ = stage(tmp_path, f"{SAMPLES}:{workload}", f"{SAMPLES}:passes")
    assert isinstance(failure, StageFailure) and failure.failure is FailureClass.ACCURACY_GATE
    assert detail in failure.detail
    assert [workload.result.passed for workload in record.workloads] == [False, True]


def test_a_workload_the_hosts_cannot_serve_is_infra(tmp_path: Path) -> None:
    _, failure, _ = stage(tmp_path, f"{SAMPLES}:cuts_a_link")
    assert isinstance(failure, StageFailure) and failure.failure is FailureClass.INFRA
    assert "local hosts share the loopback: a link cannot be cut" in failure.detail


def test_a_hanging_workload_is_abandoned_at_its_budget(tmp_path: Path) -> None:
    started = time.monotonic()
    record, failure, _ = stage(tmp_path, f"{SAMPLES}:hangs", f"{SAMPLES}:passes", budget=0.5)
    assert time.monotonic() - started < 3
    assert isinstance(failure, StageFailure) and failure.failure is FailureClass.WORKLOAD_TIMEOUT
    assert [workload.result.name for workload in record.workloads] == [f"{SAMPLES}:hangs"]  # the rest not run


@pytest.mark.e2e
def test_a_child_that_dies_during_a_workload_is_engine_failed(tmp_path: Path) -> None:
    settings = RunSettings(Topology(dp=1), "local", (), Budgets(), tmp_path)
    spec = make_plan(settings, LocalHosts()).engines[0]
    child = start(spec, [sys.executable, "-c", "import sys; print('out of memory'); sys.exit(3)"])
    try:
        _, failure, _ = stage(tmp_path, f"{SAMPLES}:hangs", budget=30, children=[child])
    finally:
        stop_all([child])
    assert isinstance(failure, StageFailure) and failure.failure is FailureClass.ENGINE_FAILED
    assert failure.detail.startswith(f"engine-0 exited with status 3 during workload {SAMPLES}:hangs")
    assert failure.detail.endswith("out of memory")
