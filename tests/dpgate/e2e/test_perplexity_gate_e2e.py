"""The perplexity gate against a real gateway in front of a real engine (the tiny model, in
float32 unquantized, so it must agree with transformers to float32 rounding): it passes, and it
fails with a sentence saying why when the reference is another model's."""

from __future__ import annotations

import time

import pytest

from dpgate.e2e.contracts import Target, Topology
from dpgate.e2e.gates import perplexity
from tests.support.gateway_processes import FAST_HEALTH, EngineProcess, GatewayProcess, all_serving
from tests.tiny_model import make_tiny_llama_dir

WINDOW, WINDOWS = 128, 3


class ExactEngine(EngineProcess):
    def command(self) -> list[str]:
        return [*super().command(), "--dtype", "float32", "--quantization", "none"]


@pytest.fixture(scope="module")
def gateway(tiny_model_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("perplexity-gate")
    with all_serving([ExactEngine(tiny_model_dir, 0, 1, log_dir)]) as engines:
        process = GatewayProcess([engines[0].address], *FAST_HEALTH, log_dir=log_dir)
        try:
            process.wait_ranks([0])
            yield process, engines
        finally:
            process.stop()


def target(gateway, model) -> Target:
    process, engines = gateway
    return Target(process.address, (engines[0].address,), Topology(model=str(model)), time.monotonic() + 120)


def test_the_gate_passes_on_the_same_weights(gateway, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("DPGATE_CACHE_DIR", str(tmp_path))
    result = perplexity.run(target(gateway, tiny_model_dir), window_tokens=WINDOW, max_windows=WINDOWS)
    figures = result.figures
    assert result.passed, result.detail
    assert figures["tokens_scored"] == WINDOWS * (WINDOW - 1)  # SmolLM2's tokenizer adds no BOS
    assert figures["relative_difference"] < 1e-4  # float32 against float32 on the same weights
    assert figures["served_perplexity"] > 1000  # a random model: near the 49k vocabulary, not a constant
    assert not figures["reference_cached"]
    again = perplexity.run(target(gateway, tiny_model_dir), window_tokens=WINDOW, max_windows=WINDOWS)
    assert again.figures["reference_cached"]
    assert again.figures["reference_perplexity"] == figures["reference_perplexity"]


def test_the_gate_fails_and_says_why_against_another_models_reference(gateway, tmp_path_factory):
    other = make_tiny_llama_dir(tmp_path_factory.mktemp("tiny-other"), seed=5)
    result = perplexity.run(target(gateway, other), window_tokens=WINDOW, max_windows=WINDOWS, use_cache=False)
    assert not result.passed
    assert result.detail.startswith("served perplexity ") and "the bound is 0.5%" in result.detail


def test_a_deadline_already_past_is_a_timeout(gateway, tiny_model_dir):
    late = Target(gateway[0].address, (), Topology(model=str(tiny_model_dir)), time.monotonic() - 1)
    with pytest.raises(TimeoutError, match="perplexity gate ran past its deadline"):
        perplexity.run(late, window_tokens=WINDOW, max_windows=1, use_cache=False)
