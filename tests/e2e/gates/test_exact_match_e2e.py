"""The exact-match gate against the default model (SmolLM2) as served: one engine behind a gateway."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dpgate.e2e.contracts import Target, Topology
from dpgate.e2e.gates import exact_match
from tests.gateway.processes import EngineProcess, GatewayProcess, all_serving

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smollm2_target(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("smollm2-gates")
    with all_serving([EngineProcess(Path(MODEL), 0, 1, log_dir)]) as engines:
        gateway = GatewayProcess([engines[0].address], log_dir=log_dir)
        try:
            gateway.wait_ranks([0])
            yield lambda: Target(gateway.address, (engines[0].address,), Topology(model=MODEL), time.monotonic() + 300)
        finally:
            gateway.stop()


def test_exact_match_scores_the_recorded_baseline_exactly(smollm2_target):
    # Batch invariance makes the greedy score a function of the numerics alone: on T=1 it is the
    # recorded baseline to the question, whatever the batching or the CPU's instruction set.
    result = exact_match.run(smollm2_target())
    baseline = exact_match.load_data()["baselines"][MODEL]
    assert result.passed, result.detail
    assert (result.figures["correct"], result.figures["style"]) == (baseline["correct"], baseline["style"])
