"""The cluster's capacity for the routing bench's shared-prefix calls, measured on the engines.

Issue 26 asks for Poisson arrivals at about 70% of the cluster's capacity. A fixed rate is a
different load on every machine: 2 calls/s overloaded the round-robin run on one Intel Xeon and
not on a faster one, so the throughput ratio moved from 2.21x to 1.49x with the machine. The
bench therefore measures the capacity first and derives the rate from it.

The capacity is the one a perfect cache gives: a group's first call computes its whole prompt
(a miss), every later call of the group finds the prefix cached (a hit). Both costs are measured
as closed loops straight at the engines (no gateway, no policy), each engine busy with
`--max-num-seqs` calls at a time, first on fresh prompts (misses), then on the same prefixes with
new questions (hits). With `m` the share of first calls (1 / prompts per group), the cluster
completes `1 / (m / misses_per_s + (1 - m) / hits_per_s)` calls a second.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc

from dpgate.v1 import generate_pb2 as pb
from dpgate.v1 import generate_pb2_grpc

_WAVES = 2  # calls per worker in each loop: one wave measures a batch's latency, not a rate


@dataclass(frozen=True, slots=True)
class Capacity:
    """Calls/s the cluster completes for prompts it must compute whole (misses) and for prompts
    whose prefix it holds (hits), and for the shared-prefix workload mixing them."""

    misses_per_s: float
    hits_per_s: float
    first_call_share: float

    @property
    def calls_per_s(self) -> float:
        m = self.first_call_share
        return 1 / (m / self.misses_per_s + (1 - m) / self.hits_per_s)


def measure_capacity(addresses: list[str], args) -> Capacity:
    """Both closed loops on the engines at `addresses`; leaves one prefix in each engine's cache
    (the bench resets every cache before each policy's run)."""
    rng = random.Random(9)  # not the workloads' seeds: nothing measured here is a workload's prefix
    whole = args.prefix_tokens + args.question_tokens
    misses = _closed_loop(addresses, args, lambda engine: _tokens(rng, whole))
    prefixes = [_tokens(rng, args.prefix_tokens) for _ in addresses]
    with ThreadPoolExecutor(len(addresses)) as pool:  # each engine computes its prefix once, untimed
        list(pool.map(lambda engine: _generate(addresses[engine], prefixes[engine], args.answer_tokens),
                      range(len(addresses))))  # fmt: skip
    hits = _closed_loop(addresses, args, lambda engine: prefixes[engine] + _tokens(rng, args.question_tokens))
    return Capacity(misses, hits, 1 / args.prompts_per_group)


def _closed_loop(addresses: list[str], args, prompt: Callable[[int], list[int]]) -> float:
    """Calls/s with `--max-num-seqs` workers an engine, each sending `_WAVES` calls one after another."""
    jobs = [engine for engine in range(len(addresses)) for _ in range(args.max_num_seqs)]
    prompts = {(job, wave): prompt(engine) for job, engine in enumerate(jobs) for wave in range(_WAVES)}

    def worker(job: int) -> None:
        for wave in range(_WAVES):
            _generate(addresses[jobs[job]], prompts[job, wave], args.answer_tokens)

    started = time.perf_counter()
    with ThreadPoolExecutor(len(jobs)) as pool:
        list(pool.map(worker, range(len(jobs))))
    return len(jobs) * _WAVES / (time.perf_counter() - started)


def _generate(address: str, ids: list[int], max_tokens: int) -> None:
    request = pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=ids),
        sampling=pb.SamplingParams(temperature=0.0),
        stopping=pb.StoppingCriteria(max_tokens=max_tokens, ignore_eos=True),
    )
    with grpc.insecure_channel(address) as channel:
        generate_pb2_grpc.InferenceServiceStub(channel).Generate(request, timeout=3600)


def _tokens(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(100, 49152) for _ in range(count)]
