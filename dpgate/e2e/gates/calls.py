"""Calls through a gateway for the gates: Generate or GenerateStream, unpinned or pinned to a rank,
within the run's deadline, each answer read into one `Output` so unary and streamed calls compare.

A call that runs out of the target's deadline raises TimeoutError (the runner's workload timeout,
not a gate's verdict); any other failed call raises grpc.RpcError for the gate to count.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import grpc

from dpgate.v1 import generate_pb2 as pb
from dpgate.v1 import generate_pb2_grpc

RANK_KEY = "x-data-parallel-rank"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's logprob and its top alternatives as (token id, logprob), as sent."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True, slots=True)
class Output:
    """What one call produced; `finish_reason` is a dpgate.v1 FinishReason value."""

    token_ids: tuple[int, ...]
    text: str
    finish_reason: int
    num_prompt_tokens: int
    logprobs: tuple[TokenLogprob, ...] = ()


def float32_bits(value: float) -> int:
    """The IEEE float32 bit pattern of a logprob as the wire carried it (so -0.0 != 0.0, NaN == NaN)."""
    return struct.unpack("<I", struct.pack("<f", value))[0]


def remaining(deadline: float) -> float:
    """Seconds left before `deadline` (time.monotonic()); TimeoutError when none are."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the gate ran past the workload deadline")
    return left


def _metadata(rank: int | None) -> tuple[tuple[str, str], ...]:
    return () if rank is None else ((RANK_KEY, str(rank)),)


def _logprobs(wire: Sequence[pb.TokenLogprob]) -> tuple[TokenLogprob, ...]:
    return tuple(
        TokenLogprob(lp.token_id, lp.logprob, tuple((top.token_id, top.logprob) for top in lp.top_logprobs))
        for lp in wire
    )


def _timeout_as_timeout_error(call: Callable[[], Output]) -> Output:
    try:
        return call()
    except grpc.RpcError as error:
        if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:  # type: ignore[attr-defined]
            raise TimeoutError("a gate's call ran past the workload deadline") from None
        raise


def generate(
    stub: generate_pb2_grpc.InferenceServiceStub, request: pb.GenerateRequest, rank: int | None, deadline: float
) -> Output:
    """One unary Generate, pinned to `rank` when it is not None."""

    def call() -> Output:
        response = stub.Generate(request, metadata=_metadata(rank), timeout=remaining(deadline))
        return Output(
            tuple(response.token_ids),
            response.text,
            response.finish.reason,
            response.finish.num_prompt_tokens,
            _logprobs(response.logprobs),
        )

    return _timeout_as_timeout_error(call)


def generate_stream(
    stub: generate_pb2_grpc.InferenceServiceStub, request: pb.GenerateRequest, rank: int | None, deadline: float
) -> Output:
    """The same request as GenerateStream (the two messages share field numbers), its deltas joined."""
    streamed = pb.GenerateStreamRequest.FromString(request.SerializeToString())

    def call() -> Output:
        token_ids: list[int] = []
        text: list[str] = []
        logprobs: list[TokenLogprob] = []
        finish = pb.FinishInfo()
        for message in stub.GenerateStream(streamed, metadata=_metadata(rank), timeout=remaining(deadline)):
            event = message.WhichOneof("event")
            if event == "delta":
                token_ids += message.delta.token_ids
                text.append(message.delta.text)
                logprobs += _logprobs(message.delta.logprobs)
            elif event == "finish":
                finish = message.finish
        return Output(tuple(token_ids), "".join(text), finish.reason, finish.num_prompt_tokens, tuple(logprobs))

    return _timeout_as_timeout_error(call)


def run_all(calls: Sequence[Callable[[], T]], concurrency: int) -> list[T | BaseException]:
    """Run `calls` on `concurrency` threads at once; each result, or the exception it raised, in
    order. TimeoutError is raised rather than returned: the whole gate is out of time."""
    with ThreadPoolExecutor(max(1, min(concurrency, len(calls)))) as pool:
        futures = [pool.submit(call) for call in calls]
        results: list[T | BaseException] = []
        for future in futures:
            error = future.exception()
            if isinstance(error, TimeoutError):
                raise error
            results.append(error if error is not None else future.result())
        return results
