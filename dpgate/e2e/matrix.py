"""The topology matrices and the table a run prints.

`ci` is the one topology CI runs on every change: DP2 x TP1 x DCP1 on SmolLM2 with local hosts.
Two engines behind the gateway exercise what the gateway is for (routing, pinning, the handshake
of several ranks), and on CI's two cores they get one core each; TP and DCP have their own
end-to-end tests (tests/engines/test_tensor_parallel*_e2e.py), and DP2 x TP2 would put four
processes on two cores. `full` is every DP 1-2, TP 1-2, DCP 1-2 (DCP divides TP) on both real
models, on network-namespace hosts, run by hand: 12 combinations, of which the 4 SmolLM2 TP2 ones
are left out (its 9 query heads do not split over 2 ranks), so 8 topologies.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpgate.e2e.contracts import Topology
from dpgate.e2e.verdict import RunRecord

MODELS = ("smollm2-135m-instruct", "gemma3-270m")


@dataclass(frozen=True, slots=True)
class MatrixEntry:
    topology: Topology
    workloads: tuple[str, ...]


CI_TOPOLOGY = Topology(dp=2, tp=1, dcp=1, model=MODELS[0])
# The gates that answer in seconds on the real default model; perplexity (20k tokens on both sides,
# minutes on 2 cores), load, fuzz and the netns fault stage have their own tests on smaller setups.
CI_WORKLOADS = ("smoke", "greedy-identity", "structured", "exact-match")
CI_HOSTS = "local"
# Every topology is smoked and held to the accuracy gates, and every DP2 one to the fault stage; perplexity (against
# transformers) runs once per model on the reference topology, load and fuzz once on two engines.
FULL_WORKLOADS = ("smoke", "greedy-identity", "structured", "exact-match", "fault")
FULL_HOSTS = "netns"


def full_topologies() -> list[Topology]:
    return [
        Topology(dp, tp, dcp, model)
        for model in MODELS
        for dp in (1, 2)
        for tp in (1, 2)
        for dcp in (1, 2)
        if tp % dcp == 0
    ]


def full_workloads(topology: Topology) -> tuple[str, ...]:
    # The fault stage cuts one engine's host and needs another to keep serving: DP >= 2 only.
    workloads = FULL_WORKLOADS if topology.dp > 1 else tuple(w for w in FULL_WORKLOADS if w != "fault")
    if topology.is_reference:
        workloads += ("perplexity",)
    if (topology.dp, topology.tp, topology.dcp, topology.model) == (2, 1, 1, MODELS[0]):
        workloads += ("load", "fuzz")
    return workloads


def matrix(name: str) -> list[MatrixEntry]:
    if name == "ci":
        return [MatrixEntry(CI_TOPOLOGY, CI_WORKLOADS)]
    if name == "full":
        return [MatrixEntry(topology, full_workloads(topology)) for topology in full_topologies()]
    raise ValueError(f"--matrix {name} must be ci or full")


def default_hosts(name: str | None) -> str:
    return FULL_HOSTS if name == "full" else CI_HOSTS


def _figures(record: RunRecord, width: int = 70) -> str:
    parts = []
    for workload in record.workloads:
        result = workload.result
        shown = ",".join(f"{key}={value}" for key, value in list(result.figures.items())[:3])
        parts.append(f"{result.name}:{'ok' if result.passed else 'FAIL'}" + (f"({shown})" if shown else ""))
    text = " ".join(parts) or "-"
    return text if len(text) <= width else text[: width - 3] + "..."


def table(records: list[RunRecord]) -> str:
    """One line per topology: verdict, class, each stage's seconds and the workloads' key figures."""
    stage_names = ("preflight", "launch", "bring-up", "workload", "verdict")
    header = ["topology", "verdict", "class", *stage_names, "total", "figures"]
    rows = [header]
    for record in records:
        seconds = {stage.name: stage for stage in record.stages}
        cells = [
            record.topology.name,
            "pass" if record.passed else ("interrupted" if record.interrupted else "fail"),
            "-" if record.failure is None else record.failure.value,
            *(
                f"{seconds[name].duration_s:.1f}" if name in seconds and seconds[name].status != "skipped" else "-"
                for name in stage_names
            ),
            f"{record.duration_s:.1f}",
            _figures(record),
        ]
        rows.append(cells)
    widths = [max(len(row[column]) for row in rows) for column in range(len(header) - 1)]
    lines = []
    for row in rows:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1])
    return "\n".join(line.rstrip() for line in lines)
