"""Structured outputs, 100% valid: every case of structured_cases.py through the gateway, greedy
and sampled (temperature 1.0 with several seeds), unary and streamed, unpinned and pinned to each
rank in turn, all at once; each output checked by its own validator. A call that fails, or an
output cut at max_tokens (every case's complete output fits), counts as invalid.
"""

from __future__ import annotations

import functools
from collections import Counter

import grpc

from dpgate.e2e.contracts import GateResult, Target
from dpgate.e2e.gates.calls import Output, generate, generate_stream, run_all
from dpgate.e2e.gates.structured_cases import CASES, Case
from dpgate.v1 import generate_pb2 as pb
from dpgate.v1 import generate_pb2_grpc

NAME = "structured-outputs"
SAMPLING_TEMPERATURE = 1.0
SEEDS = (11, 12, 13)
# Each case is asked greedily and once per seed.
VARIANTS: tuple[int | None, ...] = (None, *SEEDS)
FIGURE_TEXT_LIMIT = 300  # a failure's sentence in the figures (`detail` has it whole)


def request(case: Case, seed: int | None) -> pb.GenerateRequest:
    """Greedy when `seed` is None, else sampled at SAMPLING_TEMPERATURE with that seed."""
    sampling = (
        pb.SamplingParams(temperature=0.0)
        if seed is None
        else pb.SamplingParams(temperature=SAMPLING_TEMPERATURE, seed=seed)
    )
    return pb.GenerateRequest(
        text=case.prompt,
        sampling=sampling,
        stopping=pb.StoppingCriteria(max_tokens=case.max_tokens),
        structured_output=case.structured_output,
    )


def judge(case: Case, result: Output | BaseException) -> str | None:
    """Why the output is not valid, in words; None when it is."""
    if isinstance(result, grpc.RpcError):
        return f"the call failed with {result.code().name}: {result.details()}"  # type: ignore[attr-defined]
    if isinstance(result, BaseException):
        raise result
    if result.finish_reason == pb.FINISH_REASON_LENGTH:
        return f"cut at max_tokens ({case.max_tokens}): {result.text!r}"
    return case.check(result.text)


def run(target: Target) -> GateResult:
    pins: list[int | None] = [None, *range(target.topology.dp)]
    jobs = [(case, seed) for case in CASES for seed in VARIANTS]
    with grpc.insecure_channel(target.gateway) as channel:
        stub = generate_pb2_grpc.InferenceServiceStub(channel)
        calls = [
            functools.partial(
                generate if n % 2 == 0 else generate_stream,
                stub,
                request(case, seed),
                pins[n % len(pins)],
                target.deadline,
            )
            for n, (case, seed) in enumerate(jobs)
        ]
        results = run_all(calls, concurrency=len(calls))
    requests, valid = Counter[str](), Counter[str]()
    invalid = []
    for (case, seed), result in zip(jobs, results, strict=True):
        requests[case.kind] += 1
        why = judge(case, result)
        if why is None:
            valid[case.kind] += 1
        else:
            invalid.append(f"{case.name} ({'greedy' if seed is None else f'seed {seed}'}): {why}")
    figures: dict[str, object] = {"requests": sum(requests.values()), "valid": sum(valid.values())}
    for kind in sorted(requests):
        figures[f"{kind}_requests"], figures[f"{kind}_valid"] = requests[kind], valid[kind]
    if invalid:
        figures["first_invalid"] = invalid[0][:FIGURE_TEXT_LIMIT]
        detail = f"{len(invalid)} of {len(jobs)} structured outputs are not valid; first: {invalid[0]}"
        return GateResult(NAME, False, figures, detail)
    return GateResult(NAME, True, figures)
