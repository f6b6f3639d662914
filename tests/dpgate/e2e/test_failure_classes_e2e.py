"""Each failure class injected into a real `python -m dpgate e2e` run: the class, the exit
status and the sentinel say what went wrong, and nothing started is left running."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

from dpgate.e2e.contracts import FailureClass
from dpgate.e2e.verdict import EXIT_CODES
from engines.model.source import resolve_model
from tests.dpgate.e2e.support import E2ERun, process_gone, run_e2e

SAMPLES = "tests.dpgate.e2e.sample_workloads"  # workloads a test can name: one passes, one hangs


def assert_failed(run: E2ERun, failure: FailureClass, stage: str) -> dict:
    assert run.returncode == EXIT_CODES[failure], run.stdout + run.stderr
    sentinel = run.sentinel
    assert (sentinel["verdict"], sentinel["failure_class"]) == ("fail", failure.value)
    assert sentinel["exit_status"] == EXIT_CODES[failure]
    statuses = {entry["name"]: entry["status"] for entry in sentinel["stages"]}
    assert statuses[stage] == "failed"
    names = [entry["name"] for entry in sentinel["stages"]]
    assert all(statuses[name] == "skipped" for name in names[names.index(stage) + 1 :])
    assert sentinel["detail"].startswith(f"{stage}: ")
    return sentinel


def test_a_taken_port_is_infra_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = run_e2e(tmp_path / "run", "--dp", "1", "--gateway-port", str(port))
    sentinel = assert_failed(run, FailureClass.INFRA, "preflight")
    assert f"port {port} on gateway (127.0.0.1) is not free: in use" in sentinel["detail"]
    assert run.logs() == []


def test_a_missing_model_file_is_infra(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "model.gguf"
    sentinel = assert_failed(run_e2e(tmp_path / "run", "--model", str(missing)), FailureClass.INFRA, "preflight")
    assert f"--model {missing}: no such file or directory" in sentinel["detail"]


def test_a_model_file_with_a_flipped_byte_fails_its_checksum(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    original = b"GGUF" + bytes(range(256)) * 16
    model.write_bytes(original[:100] + bytes([original[100] ^ 1]) + original[101:])
    expected = hashlib.sha256(original).hexdigest()
    run = run_e2e(tmp_path / "run", "--model", str(model), "--model-sha256", expected)
    sentinel = assert_failed(run, FailureClass.INFRA, "preflight")
    actual = hashlib.sha256(model.read_bytes()).hexdigest()
    assert f"has sha256 {actual}, expected {expected}" in sentinel["detail"]


def test_an_engine_that_exits_during_bring_up_ends_the_stage_with_its_log(tmp_path: Path) -> None:
    """A truncated copy of the real GGUF passes preflight (present, GGUF magic, its own sha256)
    and the engine dies loading it: ENGINE_FAILED at once, not a bring-up timeout."""
    model = tmp_path / "truncated.gguf"
    with resolve_model("smollm2-135m-instruct").path.open("rb") as source, model.open("wb") as out:
        out.write(source.read(2_000_000))
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    run = run_e2e(tmp_path / "run", "--dp", "1", "--model", str(model), "--model-sha256", digest)
    sentinel = assert_failed(run, FailureClass.ENGINE_FAILED, "bring-up")
    assert "engine-0 exited with status" in sentinel["detail"]
    last_line = (run.run_dir / "engine-0.log").read_text().strip().splitlines()[-1]
    assert sentinel["detail"].endswith(last_line)
    assert run.stage("bring-up")["duration_s"] < run.stage("bring-up")["budget_s"]
    assert all(process_gone(pid) for pid in run.launched_pids())


def test_an_engine_not_up_within_the_budget_is_a_bring_up_timeout(tmp_path: Path, tiny_model_dir: Path) -> None:
    run = run_e2e(tmp_path / "run", "--dp", "1", "--model", str(tiny_model_dir), "--bringup-budget", "0.3")
    sentinel = assert_failed(run, FailureClass.BRINGUP_TIMEOUT, "bring-up")
    assert "engine-0 not SERVING within the budget" in sentinel["detail"]
    assert all(process_gone(pid) for pid in run.launched_pids())


def test_a_workload_that_hangs_is_a_workload_timeout(tmp_path: Path, tiny_model_dir: Path) -> None:
    flags = ["--dp", "1", "--model", str(tiny_model_dir), "--workload-budget", "2"]
    flags += ["--workload", f"{SAMPLES}:passes", "--workload", f"{SAMPLES}:hangs"]
    run = run_e2e(tmp_path / "run", *flags)
    sentinel = assert_failed(run, FailureClass.WORKLOAD_TIMEOUT, "workload")
    assert f"workload {SAMPLES}:hangs did not return within its budget of 2s" in sentinel["detail"]
    passed, hung = sentinel["workloads"]
    assert passed["passed"] and passed["figures"]["engines"] == 1
    assert not hung["passed"] and 2 <= hung["duration_s"] < 5
    assert run.stage("bring-up")["status"] == "passed"
    assert all(process_gone(pid) for pid in run.launched_pids())
