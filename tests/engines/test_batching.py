"""Continuous batching changes throughput, never results: a request's tokens are the same alone,
in a mixed batch, across preemptions; aborted requests give every block back."""

from __future__ import annotations

import random

import pytest
import torch

from dpgate.v1 import generate_pb2 as pb
from engines.engine import LLMEngine
from engines.loader import load
from engines.model_runner import ModelRunner
from engines.model_source import resolve_model
from engines.request_builder import ModelLimits, build_sequence
from engines.scheduler import SchedulerConfig


@pytest.fixture(scope="module")
def smollm2():
    return load(resolve_model("smollm2-135m-instruct"), torch.float32)


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
    )
    limits = ModelLimits("m", loaded.config.vocab_size, 512, loaded.tokenizer.eos_token_ids)
    return build_sequence(request, limits, loaded.tokenizer.tokenizer)


def run_to_completion(engine: LLMEngine, abort_at: dict[str, int] | None = None) -> int:
    """Step until idle, checking block accounting each step; returns the number of steps."""
    steps = 0
    while engine.has_work:
        for request_id, step in (abort_at or {}).items():
            if step == steps:
                engine.abort(request_id)
        engine.step()
        steps += 1
        engine.block_manager.check_invariants(s.block_table for s in engine.scheduler.running)
    return steps


def alone(loaded, *args, **kwargs) -> list[int]:
    engine = make_engine(loaded)
    seq = sequence(loaded, "solo", *args, **kwargs)
    engine.add(seq)
    run_to_completion(engine)
    return seq.output_ids


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
    run_to_completion(engine, abort_at=aborted)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    for request_id, prompt, max_tokens, temperature, seed in specs:
        if request_id in aborted:
            assert batch[request_id].finish_reason.value == "aborted"
            continue
        expected = alone(smollm2, prompt, max_tokens, temperature, seed)
        assert batch[request_id].output_ids == expected, request_id


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


def test_a_tiny_cache_forces_preemptions_and_outputs_stay_the_same(smollm2):
    rng = random.Random(2)
    specs = [(f"p{i}", [rng.randrange(100, 40000) for _ in range(rng.randrange(10, 30))], 24) for i in range(6)]

    def outputs(num_blocks: int) -> tuple[dict[str, list[int]], int]:
        engine = make_engine(smollm2, num_blocks=num_blocks, max_num_seqs=6)
        seqs = [sequence(smollm2, *spec) for spec in specs]
        for seq in seqs:
            engine.add(seq)
        run_to_completion(engine)
        assert engine.block_manager.num_free_blocks == num_blocks
        return {s.request_id: s.output_ids for s in seqs}, engine.scheduler.num_preemptions

    large, no_preemptions = outputs(num_blocks=256)
    small, preemptions = outputs(num_blocks=6)  # 96 tokens for six sequences of up to 54
    assert no_preemptions == 0 and preemptions > 0
    assert small == large
