"""The matrices: CI's one topology, the full DP x TP x DCP x model set, and the printed table."""

from __future__ import annotations

from dpgate.e2e.contracts import FailureClass, GateResult, Topology
from dpgate.e2e.matrix import CI_TOPOLOGY, MODELS, full_topologies, full_workloads, matrix, table
from dpgate.e2e.verdict import RunRecord, StageRecord, WorkloadRecord
from dpgate.e2e.workloads import REGISTRY


def test_ci_is_one_small_topology_on_local_hosts() -> None:
    [entry] = matrix("ci")
    assert entry.topology == CI_TOPOLOGY == Topology(2, 1, 1, "smollm2-135m-instruct")
    assert entry.workloads == ("smoke", "greedy-identity", "structured", "exact-match")


def test_full_is_every_dp_tp_dcp_with_dcp_dividing_tp_on_both_models() -> None:
    topologies = full_topologies()
    assert len(topologies) == len(set(topologies)) == 12
    assert {(t.dp, t.tp, t.dcp) for t in topologies} == {(d, t, c) for d in (1, 2) for t, c in ((1, 1), (2, 1), (2, 2))}
    assert {t.model for t in topologies} == set(MODELS)
    for topology in topologies:
        workloads = full_workloads(topology)
        assert set(workloads) <= set(REGISTRY) and "smoke" in workloads and "greedy-identity" in workloads
        assert ("perplexity" in workloads) == topology.is_reference
    assert sum("load" in full_workloads(t) for t in topologies) == 1


def test_the_table_has_a_row_per_topology_with_its_class_and_stage_seconds() -> None:
    passed = RunRecord(Topology(1, 1, 1), "netns", "/tmp/a", duration_s=12.5)
    passed.stages += [StageRecord("preflight", "passed", 0.25), StageRecord("bring-up", "passed", 9.75)]
    passed.workloads.append(WorkloadRecord(GateResult("smoke", True, {"calls": 4}), 1.0, 60.0))
    failed = RunRecord(Topology(2, 2, 2, "gemma3-270m"), "netns", "/tmp/b", duration_s=3.0)
    failed.stages += [StageRecord("preflight", "passed", 0.5), StageRecord("bring-up", "failed", 2.5)]
    failed.fail(FailureClass.ENGINE_FAILED, "bring-up: engine-1 exited")
    header, first, second = table([passed, failed]).splitlines()
    assert header.split() == [
        "topology", "verdict", "class", "preflight", "launch", "bring-up", "workload", "verdict", "total", "figures"
    ]  # fmt: skip
    assert first.split() == ["dp1-tp1-dcp1-smollm2-135m-instruct", "pass", "-", "0.2", "-", "9.8", "-", "-", "12.5",
                             "smoke:ok(calls=4)"]  # fmt: skip
    assert second.split()[:3] == ["dp2-tp2-dcp2-gemma3-270m", "fail", "engine-failed"]
