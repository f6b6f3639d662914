"""The gates against real processes of the tiny model. Greedy identity: two DP ranks behind a
gateway equal the gate's own DP=1/T=1/C=1 reference in every call; an engine computing with torch's
kernels (`--no-batch-invariant`) does not, and the gate says where. Structured outputs: all valid on
both ranks. Exact match, pointed at the tiny random model while expecting SmolLM2's score (as if the
wrong weights were loaded), fails.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dpgate.e2e.contracts import Target, Topology
from dpgate.e2e.gates import exact_match, greedy_identity, structured
from dpgate.e2e.gates.calls import Output, TokenLogprob
from dpgate.e2e.gates.structured_cases import CASES
from tests.support.gateway_processes import EngineProcess, GatewayProcess


class FlaggedEngine(EngineProcess):
    def __init__(self, model_dir: Path, rank: int, size: int, log_dir: Path, *flags: str) -> None:
        super().__init__(model_dir, rank, size, log_dir)
        self.flags = flags
        self.log_path = log_dir / f"engine-{rank}{''.join(flags)}.log"

    def command(self) -> list[str]:
        return [*super().command(), *self.flags]


@contextlib.contextmanager
def serving(engines: list[EngineProcess]) -> Iterator[None]:
    """all_serving, but stopping the engines all at once: each takes seconds to shut down."""
    try:
        for engine in engines:
            engine.start()
        for engine in engines:
            engine.wait_serving()
        yield
    finally:
        for engine in engines:
            if engine.process is not None and engine.process.poll() is None:
                engine.process.terminate()
        for engine in engines:
            engine.stop()


@pytest.fixture(scope="module")
def gateways(tiny_model_dir, tmp_path_factory):
    """{"dp2": a gateway in front of two default engines, "torch": one in front of a --no-batch-invariant engine}."""
    log_dir = tmp_path_factory.mktemp("greedy-identity")
    engines = [FlaggedEngine(tiny_model_dir, rank, 2, log_dir) for rank in range(2)]
    engines.append(FlaggedEngine(tiny_model_dir, 0, 1, log_dir, "--no-batch-invariant"))
    # The gate's reference engine starts beside the others rather than after them (it is cached).
    with ThreadPoolExecutor(1) as pool:
        reference = pool.submit(greedy_identity.reference_outputs, str(tiny_model_dir), time.monotonic() + 240)
        with serving(engines):
            started = {
                "dp2": GatewayProcess([e.address for e in engines[:2]], log_dir=log_dir, name="dp2"),
                "torch": GatewayProcess([engines[2].address], log_dir=log_dir, name="torch"),
            }
            try:
                started["dp2"].wait_ranks([0, 1])
                started["torch"].wait_ranks([0])
                reference.result()
                yield started
            finally:
                for gateway in started.values():
                    gateway.stop()


def target(gateway: GatewayProcess, topology: Topology) -> Target:
    return Target(gateway=gateway.address, engines=(), topology=topology, deadline=time.monotonic() + 240)


def test_two_dp_ranks_give_the_reference_tokens_and_logprob_bits_in_every_call(gateways, tiny_model_dir):
    result = greedy_identity.run(target(gateways["dp2"], Topology(dp=2, model=str(tiny_model_dir))))
    assert result.passed, result.detail
    prompts = len(greedy_identity.PROMPTS)
    assert result.figures["calls"] == prompts * 3 * 2  # unpinned and each of 2 ranks, unary and streamed
    assert result.figures["mismatches"] == 0
    assert result.figures["prompts_over_default_prefill_chunk"] == 2
    assert result.figures["logprobs"] == "float32 bits"
    assert result.figures["max_logprob_difference"] == 0.0


def test_torch_kernels_are_not_the_served_numerics_and_the_gate_names_the_first_difference(gateways, tiny_model_dir):
    result = greedy_identity.run(target(gateways["torch"], Topology(dp=1, model=str(tiny_model_dir))))
    assert not result.passed
    assert result.figures["mismatches"] > 0
    assert result.figures["first_mismatch"].startswith("prompt ")
    assert "against the reference's" in result.detail


def test_the_first_differing_position_is_named():
    want = Output((5, 6, 7), "abc", 1, 4, ())
    assert greedy_identity.difference(Output((5, 6, 8), "abd", 1, 4), want, True) == (
        "token 2 is 8 against the reference's 7"
    )
    assert greedy_identity.difference(Output((5, 6), "ab", 1, 4), want, True) == "2 tokens against the reference's 3"
    lp = TokenLogprob(5, -0.5, ((5, -0.5), (9, -1.25)))
    near = TokenLogprob(5, -0.50000006, ((5, -0.50000006), (9, -1.25)))
    same_tokens = Output((5,), "a", 1, 4, (lp,))
    assert greedy_identity.difference(Output((5,), "a", 1, 4, (near,)), same_tokens, exact_logprobs=True)
    assert greedy_identity.difference(Output((5,), "a", 1, 4, (near,)), same_tokens, exact_logprobs=False) is None
    # The logprob figure stops at the first differing token: past it the contexts differ.
    other = TokenLogprob(6, -3.0, ())
    gap = greedy_identity._largest_logprob_gap(
        Output((5, 6), "ab", 1, 4, (near, other)), Output((5, 7), "ac", 1, 4, (lp, lp))
    )
    assert gap == abs(near.logprob - lp.logprob)


def test_every_structured_output_is_valid_greedy_and_sampled_on_both_ranks(gateways, tiny_model_dir):
    # The grammars bound every output's length, so even a random model ends each one within max_tokens.
    result = structured.run(target(gateways["dp2"], Topology(dp=2, model=str(tiny_model_dir))))
    assert result.passed, result.detail
    assert result.figures["requests"] == result.figures["valid"] == len(CASES) * len(structured.VARIANTS)
    for kind in ("json_schema", "regex", "ebnf", "choice"):
        assert result.figures[f"{kind}_valid"] == result.figures[f"{kind}_requests"] > 0


def test_exact_match_fails_below_the_threshold_when_the_weights_are_not_the_models(gateways):
    result = exact_match.run(target(gateways["dp2"], Topology(dp=2, model="smollm2-135m-instruct")))
    assert not result.passed
    assert result.figures["correct"] < result.figures["threshold"]
    assert "below the threshold" in result.detail


def test_exact_match_fails_for_a_model_with_no_baseline(gateways, tiny_model_dir):
    result = exact_match.run(target(gateways["dp2"], Topology(dp=2, model=str(tiny_model_dir))))
    assert not result.passed and "no exact-match baseline" in result.detail
