"""`python -m dpgate e2e` end to end: the CI topology passes (this is the run .ci/run's suite makes),
and --dry-run prints the plan and launches nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dpgate.e2e.matrix import CI_TOPOLOGY
from dpgate.e2e.verdict import EXIT_INTERRUPTED
from dpgate.host import usable_cores
from tests.dpgate.e2e.support import ROOT, E2ERun, process_gone, run_e2e


def test_the_ci_topology_passes_end_to_end(tmp_path: Path) -> None:
    run = run_e2e(tmp_path / "run")
    assert run.returncode == 0, run.stdout + run.stderr
    sentinel = run.sentinel
    assert (sentinel["verdict"], sentinel["failure_class"], sentinel["exit_status"]) == ("pass", None, 0)
    assert sentinel["topology"]["name"] == CI_TOPOLOGY.name and sentinel["hosts"] == "local"
    assert [(stage["name"], stage["status"]) for stage in sentinel["stages"]] == [
        (name, "passed") for name in ("preflight", "launch", "bring-up", "workload", "verdict")
    ]
    assert all(0 <= stage["duration_s"] <= stage["budget_s"] for stage in sentinel["stages"])
    assert "matches its package" in run.stage("preflight")["detail"]  # the shipped sha256 was checked
    smoke, greedy, structured, exact = sentinel["workloads"]
    names = [w["name"] for w in sentinel["workloads"]]
    assert names == ["smoke", "greedy-identity", "structured-outputs", "exact-match"]
    assert all(w["passed"] for w in sentinel["workloads"]), sentinel["workloads"]
    assert greedy["figures"]["mismatches"] == 0 and greedy["figures"]["logprobs"] == "float32 bits"
    assert structured["figures"]["valid"] == structured["figures"]["requests"] > 0
    # Batch invariance makes the greedy score a function of the numerics alone: the recorded
    # baseline to the question, whatever the batching (two engines, all questions in flight).
    assert exact["figures"]["correct"] == exact["figures"]["baseline"]
    assert smoke["figures"]["calls"] == 2 * (1 + CI_TOPOLOGY.dp)  # unpinned and pinned to each rank
    assert run.logs() == ["engine-0.log", "engine-1.log", "gateway.log"]
    assert "OK by rank 1" in (run.run_dir / "gateway.log").read_text()
    assert all(process_gone(pid) for pid in run.launched_pids())
    assert CI_TOPOLOGY.name in run.stdout.splitlines()[-2]  # the table's row


def test_dry_run_prints_the_plan_and_launches_nothing(tmp_path: Path) -> None:
    flags = ["--dp", "2", "--tp", "2", "--dcp", "2", "--model", "gemma3-270m", "--bringup-budget", "77"]
    run = run_e2e(tmp_path / "run", "--dry-run", *flags)
    assert run.returncode == 0, run.stdout + run.stderr
    plan = [line.strip() for line in run.stdout.splitlines() if line.startswith("  ")]
    names = [line.split(" ", 1)[0] for line in plan]
    assert names == ["engine-0", "engine-1", "gateway"]
    engine_ports = []
    for rank, line in enumerate(plan[:2]):
        assert f"--data-parallel-rank {rank} --data-parallel-size 2" in line
        assert "--tensor-parallel-size 2 --decode-context-parallel-size 2" in line
        assert ("--allow-oversubscribe" in line) == (usable_cores() // 2 < 2)
        engine_ports.append(line.split("--port ", 1)[1].split()[0])
    assert all(f"--engine 127.0.0.1:{port}" in plan[2] for port in engine_ports)
    assert "bring-up 77s" in run.stdout
    assert run.logs() == []  # no child was started
    assert [stage["status"] for stage in run.sentinel["stages"]] == ["passed"] + ["skipped"] * 4


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stops_every_child_and_still_writes_the_sentinel(
    tmp_path: Path, tiny_model_dir: Path, signum: int
) -> None:
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "dpgate", "e2e", "--run-dir", str(run_dir), "--dp", "2",
               "--model", str(tiny_model_dir)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    runner = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert runner.stdout is not None
    for line in runner.stdout:  # the engines are starting: interrupt the bring-up
        if "stage launch: passed" in line:
            break
    runner.send_signal(signum)
    rest = runner.stdout.read()
    assert runner.wait(60) == EXIT_INTERRUPTED, rest
    run = E2ERun(runner.returncode, "", "", run_dir, run_dir / "result.json")
    sentinel = run.sentinel
    assert (sentinel["verdict"], sentinel["failure_class"], sentinel["exit_status"]) == ("fail", None, 130)
    assert "interrupted by a signal" in sentinel["detail"]  # in bring-up, or just before it
    assert run.stage("launch")["status"] == "passed" and "workload" not in [s["name"] for s in sentinel["stages"]]
    assert all(process_gone(pid) for pid in run.launched_pids())
