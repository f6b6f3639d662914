"""Shared by the prefix-cache exactness tests: cold and warm runs of the same prompts on one engine.

Cold: each request carries a salt of its own, so it can share no block with anything. Warm: the
requests share one salt; seed requests first cache prefixes that end at the split points, then
the full prompts run (beside noise streams when asked) and must report cached tokens. A request's
tokens, logprobs and top alternatives must be the same bits both ways.
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc

from dpgate.v1 import control_pb2 as cpb
from dpgate.v1 import control_pb2_grpc, generate_pb2_grpc
from dpgate.v1 import generate_pb2 as pb

NUM_TOKENS = 12


def split_points(prompt_len: int, positions_per_block: int) -> list[int]:
    """Shared-prefix lengths: on a block boundary, one token either side, and the whole prompt but one."""
    boundary = 2 * positions_per_block
    return sorted({boundary - 1, boundary, boundary + 1, prompt_len - 1})


def request(tokens: list[int], salt: str, max_tokens: int = NUM_TOKENS, prompt_logprobs: bool = False):
    message = pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=tokens),
        sampling=pb.SamplingParams(temperature=0.0),
        stopping=pb.StoppingCriteria(max_tokens=max_tokens, ignore_eos=True),
        logprobs=pb.LogprobsOptions(top_n=3),
        cache_salt=salt,
    )
    if prompt_logprobs:
        message.prompt_logprobs.top_n = 2
    return message


def noise(stub, seed: int, started: threading.Event) -> None:
    call = stub.GenerateStream(
        pb.GenerateStreamRequest(
            text=f"Noise {seed}: say anything about",
            sampling=pb.SamplingParams(temperature=0.9, seed=seed),
            stopping=pb.StoppingCriteria(max_tokens=40, ignore_eos=True),
            cache_salt=f"noise-{seed}",
        ),
        timeout=600,
    )
    for _ in call:
        started.set()


def cold_and_warm(address: str, base: list[int], splits: list[int], with_noise: bool = False):
    """For each split k: the prompt `base[:k] + tail_k` cold and warm (after seeding `base[:k]`
    with a different continuation)... every prompt is `base` cut or extended so its first k tokens
    are shared with its seed. Returns [(split, cold, warm)]."""
    rng = random.Random(len(base))
    cases = []
    for k in splits:
        prompt = base[:k] + [rng.randrange(100, 40000) for _ in range(len(base) - k)] if k < len(base) else base
        cases.append((k, prompt))
    with grpc.insecure_channel(address) as channel:
        stub = generate_pb2_grpc.InferenceServiceStub(channel)
        cold = [stub.Generate(request(prompt, f"cold-{i}"), timeout=600) for i, (_, prompt) in enumerate(cases)]
        warm = []
        with ThreadPoolExecutor(8) as pool:
            started = threading.Event()
            streams = [pool.submit(noise, stub, seed, started) for seed in range(4)] if with_noise else []
            if with_noise:
                assert started.wait(120)
            for i, (k, prompt) in enumerate(cases):
                salt = f"warm-{i}"  # each case its own seed: the split is exactly k
                stub.Generate(request([*prompt[:k], 7], salt, max_tokens=1), timeout=600)
                warm.append(pool.submit(stub.Generate, request(prompt, salt), timeout=600).result())
            for stream in streams:
                stream.result()
    return [(k, c, w) for (k, _), c, w in zip(cases, cold, warm, strict=True)]


def assert_same_bits(results) -> None:
    for k, cold, warm in results:
        assert cold.finish.num_cached_prompt_tokens == 0, k
        assert warm.finish.num_cached_prompt_tokens > 0, f"split {k}: nothing was cached (a vacuous pass)"
        assert list(warm.token_ids) == list(cold.token_ids), f"split {k}"
        assert list(warm.logprobs) == list(cold.logprobs), f"split {k}"  # logprob and top-3, bit for bit


def server_info(address: str) -> cpb.GetServerInfoResponse:
    with grpc.insecure_channel(address) as channel:
        return control_pb2_grpc.ControlServiceStub(channel).GetServerInfo(cpb.GetServerInfoRequest())


def load(address: str) -> cpb.GetLoadResponse:
    with grpc.insecure_channel(address) as channel:
        return control_pb2_grpc.ControlServiceStub(channel).GetLoad(cpb.GetLoadRequest())
