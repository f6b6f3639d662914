"""Preflight without launching: ports, model files and their shipped checksums, the memory estimate."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dpgate.e2e import preflight
from dpgate.e2e.contracts import FailureClass, Topology
from dpgate.e2e.local_hosts import LocalHosts
from dpgate.e2e.plan import Budgets, RunSettings, make_plan
from dpgate.e2e.stages import StageFailure
from engines.model.source import resolve_model


def plan(tmp_path: Path, **fields):
    topology = fields.pop("topology", Topology(dp=2, tp=2))
    settings = RunSettings(topology, "local", (), Budgets(), tmp_path, **fields)
    return make_plan(settings, LocalHosts())


def test_the_default_model_is_checked_against_the_sha256_its_wheel_records() -> None:
    path = resolve_model("smollm2-135m-instruct").path
    expected = preflight.shipped_sha256("smollm2-135m-instruct", path)
    assert expected is not None and len(expected) == 64
    assert preflight.check_model("smollm2-135m-instruct", None) == (
        path,
        f"sha256 {expected[:12]}... matches its package",
    )


def test_a_directory_model_is_checked_for_its_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(StageFailure, match="holds no model weights") as failure:
        preflight.check_model(str(tmp_path), None)
    assert failure.value.failure is FailureClass.INFRA
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    path, checksum = preflight.check_model(str(tmp_path), None)
    assert path == tmp_path.resolve() and checksum.startswith("no sha256 shipped")
    assert preflight.model_bytes(path) == 10


def test_the_memory_estimate_counts_every_process_and_fails_when_over(tmp_path: Path) -> None:
    the_plan = plan(tmp_path, kv_cache_memory_mb=100)
    weights = 50 * preflight.MIB
    per_process = 50 + 100 + preflight.ENGINE_PROCESS_OVERHEAD_MIB
    needed = preflight.memory_needed_mib(the_plan, weights)
    assert needed == 4 * per_process + preflight.GATEWAY_OVERHEAD_MIB  # DP2 x TP2
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: 99999999 kB\nMemAvailable: {(needed - 1) * 1024} kB\n")
    assert preflight.mem_available_mib(meminfo) == needed - 1
    original = preflight.mem_available_mib
    preflight.mem_available_mib = lambda: original(meminfo)  # type: ignore[assignment]
    try:
        with pytest.raises(StageFailure, match=f"needs about {needed} MiB .* MemAvailable is {needed - 1} MiB"):
            preflight.check_memory(the_plan, weights)
    finally:
        preflight.mem_available_mib = original  # type: ignore[assignment]


def test_every_planned_port_is_checked(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(StageFailure, match=f"port {port} on gateway .* in use"):  # the last one checked
            preflight.check_ports(plan(tmp_path, gateway_port=port), LocalHosts())
    assert preflight.check_ports(plan(tmp_path), LocalHosts()) == "3 ports free"
