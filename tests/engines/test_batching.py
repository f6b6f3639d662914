"""Continuous batching changes throughput, never results: in the served default (float32
activations, int8 weights, batch-invariant kernels) a request's tokens and logprobs are the same
bits alone, in a mixed batch of any size, however its prompt is chunked and across preemptions;
aborted requests give every block back."""

from __future__ import annotations

import random

import pytest
import torch

from dpgate.v1 import generate_pb2 as pb
from engines.engine import LLMEngine
from engines.model.source import resolve_model
from engines.runner.loader import load
from engines.runner.model_runner import ModelRunner
from engines.scheduling.scheduler import SchedulerConfig
from engines.serving.request_builder import ModelLimits, build_sequence
from tests.engines.kernel_choice import load_with_kernels


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2 as `dpgate engine` serves it by default."""
    return load_with_kernels(resolve_model("smollm2-135m-instruct"), "batch-invariant", quantization="int8")


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load(resolve_model(str(tiny_model_dir)), torch.float32)


def make_engine(loaded, num_blocks=None, **scheduler) -> LLMEngine:
    runner = ModelRunner(loaded, 512, num_blocks=num_blocks or 512, block_size=16)
    return LLMEngine(runner, SchedulerConfig(**scheduler))


def sequence(loaded, request_id, prompt_ids, max_tokens, temperature=0.0, seed=None):
    sampling = pb.SamplingParams(temperature=temperature)
    if seed is not None:
        sampling.seed = seed
    request = pb.GenerateRequest(
        request_id=request_id,
        token_ids=pb.TokenIds(ids=prompt_ids),
        sampling=sampling,
        stopping=pb.StoppingCriteria(max_tokens=max_tokens, ignore_eos=True),
        logprobs=pb.LogprobsOptions(top_n=2),
    )
    limits = ModelLimits("m", loaded.config.vocab_size, 512, loaded.tokenizer.eos_token_ids)
    return build_sequence(request, limits, loaded.tokenizer.tokenizer)


def run_to_completion(engine: LLMEngine, abort_at: dict[str, int] | None = None) -> dict[str, list]:
    """Step until idle, checking block accounting each step; returns each request's sampled
    tokens with their logprobs and top alternatives, in order."""
    steps, sampled = 0, {}
    while engine.has_work:
        for request_id, step in (abort_at or {}).items():
            if step == steps:
                live = [*engine.scheduler.running, *engine.scheduler.waiting]
                for seq in [seq for seq in live if seq.request_id == request_id]:
                    engine.abort(seq.handle)
        for output in engine.step():
            sampled.setdefault(output.request_id, []).extend(output.logprobs)
        steps += 1
        engine.block_manager.check_invariants(s.block_table for s in engine.scheduler.running)
    return sampled


def alone(loaded, *args, **kwargs) -> list:
    engine = make_engine(loaded)
    engine.add(sequence(loaded, "solo", *args, **kwargs))
    return run_to_completion(engine)["solo"]


@pytest.mark.e2e  # runs SmolLM2
def test_greedy_and_seeded_outputs_are_the_same_alone_and_in_a_mixed_batch_of_16(smollm2):
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 40000) for _ in range(rng.randrange(3, 60))] for _ in range(16)]
    specs = []
    for i, prompt in enumerate(prompts):
        sampled = i % 4 == 1
        specs.append((f"r{i}", prompt, rng.randrange(4, 20), 0.8 if sampled else 0.0, 1000 + i if sampled else None))
    aborted = {f"r{i}": rng.randrange(1, 6) for i in (3, 7, 11)}
    engine = make_engine(smollm2, max_num_seqs=16, max_num_batched_tokens=96)  # forces chunked prefills
    batch = {spec[0]: sequence(smollm2, *spec) for spec in specs}
    for seq in batch.values():
        engine.add(seq)
    sampled = run_to_completion(engine, abort_at=aborted)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    for request_id, prompt, max_tokens, temperature, seed in specs:
        if request_id in aborted:
            assert batch[request_id].finish_reason.value == "aborted"
            continue
        assert sampled[request_id] == alone(smollm2, prompt, max_tokens, temperature, seed), request_id


@pytest.mark.e2e  # runs SmolLM2
@pytest.mark.parametrize("budget", [1, 7, 16, 64, 300])
def test_a_prompt_gives_the_same_bits_however_its_prefill_is_chunked(smollm2, budget):
    """A 300-token prompt prefilled under a token budget of 1, 7, 16, 64 or 300 per step, beside
    two sequences that are decoding (they take their share of each budget first): its tokens and
    logprobs equal the one-chunk prefill of the prompt alone."""
    rng = random.Random(5)
    prompt = [rng.randrange(100, 40000) for _ in range(300)]
    expected = alone(smollm2, prompt, 8)
    engine = make_engine(smollm2, max_num_seqs=3, max_num_batched_tokens=budget + 2)
    for i in range(2):
        engine.add(sequence(smollm2, f"busy{i}", [rng.randrange(100, 40000) for _ in range(5)], 400))
    engine.step()  # both busy sequences are decoding before the prompt arrives
    engine.add(sequence(smollm2, "prompt", prompt, 8))
    sampled, finished = [], False
    while not finished:
        for output in engine.step():
            if output.request_id == "prompt":
                sampled.extend(output.logprobs)
                finished = output.finish_reason is not None
    assert len(engine.scheduler.running) == 2  # the busy sequences decoded beside it all along
    assert sampled == expected


def test_every_block_is_free_after_200_requests_with_100_cancelled_at_random_points(tiny):
    rng = random.Random(1)
    engine = make_engine(tiny, num_blocks=64, max_num_seqs=24, max_num_batched_tokens=128, max_waiting=200)
    cancelled = set(rng.sample(range(200), 100))
    abort_at = {f"q{i}": rng.randrange(0, 40) for i in cancelled}
    for i in range(200):
        prompt = [rng.randrange(10, 40000) for _ in range(rng.randrange(1, 40))]
        engine.add(sequence(tiny, f"q{i}", prompt, rng.randrange(1, 30)))
    run_to_completion(engine, abort_at=abort_at)
    assert engine.block_manager.num_free_blocks == 64
    assert not engine.scheduler.running and not engine.scheduler.waiting


@pytest.mark.e2e  # runs SmolLM2
def test_a_tiny_cache_forces_preemptions_and_outputs_stay_the_same(smollm2):
    rng = random.Random(2)
    specs = [(f"p{i}", [rng.randrange(100, 40000) for _ in range(rng.randrange(10, 30))], 24) for i in range(6)]
    specs[1] = (*specs[1][:3], 0.8, 7)  # a seeded sampled request continues its own random stream

    def outputs(num_blocks: int) -> tuple[dict[str, list], int]:
        engine = make_engine(smollm2, num_blocks=num_blocks, max_num_seqs=6)
        for spec in specs:
            engine.add(sequence(smollm2, *spec))
        sampled = run_to_completion(engine)
        assert engine.block_manager.num_free_blocks == num_blocks
        return sampled, engine.scheduler.num_preemptions

    large, no_preemptions = outputs(num_blocks=256)
    small, preemptions = outputs(num_blocks=6)  # 96 tokens for six sequences of up to 54
    assert no_preemptions == 0 and preemptions > 0
    assert small == large
