"""Sampling parameters a client can send must never break the engine for anyone else (issue 22,
item 1): values the sampler cannot compute with are refused where they enter, naming the field and
the rule, and a row that still yields no probability distribution ends only its own request, as
the client's error (INVALID_ARGUMENT), never the batch."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from dpgate.v1 import generate_pb2 as pb
from engines.engine import LLMEngine
from engines.model.source import resolve_model
from engines.runner.loader import load
from engines.runner.model_runner import ModelRunner
from engines.sampling.params import InvalidRequestError, SamplingParams, StoppingParams
from engines.sampling.sampler import sample
from engines.scheduling.scheduler import SchedulerConfig
from engines.scheduling.sequence import FinishReason, Sequence
from engines.serving.async_engine import AsyncEngine
from engines.serving.request_builder import ModelLimits, build_sequence

VOCAB = 49152
POISON = [
    ({"temperature": 1e-40}, "sampling.temperature"),
    ({"temperature": math.inf}, "sampling.temperature"),
    ({"temperature": 1e-30, "top_p": 0.5}, "sampling.temperature"),
    ({"temperature": 1.0, "repetition_penalty": 1e-40}, "sampling.repetition_penalty"),
    ({"temperature": 1.0, "repetition_penalty": math.inf}, "sampling.repetition_penalty"),
]


def wire_request(sampling: dict, **stopping) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=[1, 2, 3]),
        sampling=pb.SamplingParams(**sampling),
        stopping=pb.StoppingCriteria(max_tokens=4, **stopping),
    )


class _Decoder:
    def decode(self, token_ids, skip_special_tokens=True):
        return "".join(chr(97 + t % 26) for t in token_ids)


@pytest.mark.parametrize(("sampling", "field"), POISON)
def test_values_the_sampler_cannot_compute_with_are_refused_naming_the_field(sampling, field):
    limits = ModelLimits("m", VOCAB, 512, frozenset({2}))
    with pytest.raises(InvalidRequestError, match=field) as refused:
        build_sequence(wire_request(sampling, min_tokens=2), limits, _Decoder())
    assert "must be" in str(refused.value)


@pytest.mark.parametrize("temperature", [0.0, 1e-3, 0.7, 2.0, 100.0])
def test_ordinary_temperatures_still_pass(temperature):
    SamplingParams(temperature=temperature, repetition_penalty=1.3).validate(VOCAB)


@pytest.mark.parametrize("sampling", [POISON[0][0], POISON[1][0], POISON[3][0]])
def test_a_row_that_gives_no_distribution_raises_the_clients_error_not_a_torch_error(sampling):
    logits = torch.randn(64) * 20
    params = SamplingParams(**sampling)  # unvalidated: the defence behind the validation
    with pytest.raises(InvalidRequestError, match="no valid probability distribution"):
        sample(logits, params, torch.Generator().manual_seed(0), [1, 2, 3, 40], [5, 6], blocked_token_ids=[7])


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load(resolve_model(str(tiny_model_dir)), torch.float32)


def raw_sequence(loaded, request_id: str, sampling: SamplingParams, max_tokens: int = 8) -> Sequence:
    """A sequence as the engine holds it, built without validation (as if a rule were missing)."""
    return Sequence(
        request_id=request_id,
        prompt_ids=[1, 20, 30, 40],
        sampling=sampling,
        stopping=StoppingParams(max_tokens=max_tokens, min_tokens=2, ignore_eos=True),
        stop_token_ids=frozenset({2}),
        decoder=loaded.tokenizer.tokenizer,
    )


def test_a_poisoned_row_ends_only_its_own_request_in_the_engine_step(tiny):
    engine = LLMEngine(ModelRunner(tiny, 256, num_blocks=64, block_size=16), SchedulerConfig())
    good = raw_sequence(tiny, "good", SamplingParams(temperature=0.8, seed=1))
    bad = raw_sequence(tiny, "bad", SamplingParams(temperature=1e-40, seed=1))
    engine.add(good)
    engine.add(bad)
    outputs = {}
    while engine.has_work:
        for output in engine.step():
            outputs.setdefault(output.request_id, []).append(output)
    assert isinstance(outputs["bad"][-1].error, InvalidRequestError)
    assert outputs["bad"][-1].finish_reason is FinishReason.ABORTED
    assert outputs["good"][-1].error is None and outputs["good"][-1].finish_reason is FinishReason.LENGTH
    assert outputs["good"][-1].num_generated_tokens == 8
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_through_the_async_engine_the_neighbour_finishes_and_only_the_poisoned_call_fails(tiny):
    async def scenario():
        engine = LLMEngine(ModelRunner(tiny, 256, num_blocks=64, block_size=16), SchedulerConfig())
        runner = AsyncEngine(engine, asyncio.get_running_loop())
        try:

            async def drain(seq):
                return [output async for output in runner.generate(seq)]

            good = raw_sequence(tiny, "good", SamplingParams(temperature=0.8, seed=1), max_tokens=32)
            bad = raw_sequence(tiny, "bad", SamplingParams(temperature=1.0, repetition_penalty=1e-40, seed=1))
            return await asyncio.gather(drain(good), drain(bad), return_exceptions=True)
        finally:
            runner.shutdown()

    good, bad = asyncio.run(scenario())
    assert isinstance(bad, InvalidRequestError), bad
    assert not isinstance(good, BaseException), good
    assert good[-1].finish_reason is FinishReason.LENGTH and good[-1].num_generated_tokens == 32
