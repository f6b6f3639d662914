"""The load workload: many concurrent GenerateStream calls through the gateway, every token checked.

A round opens `streams` greedy streams at once (small max_tokens, over `channels` separate HTTP/2
connections, so no connection nears the gateway's --max-concurrent-streams) and checks each one
against the engines' own answer for the same prompt: the unary Generate of that greedy request,
asked of every DP rank pinned (they must agree, or the check would mean nothing). A stream passes
when it is prompt info, then deltas, then finish, and its deltas' token ids and text are exactly
the reference's, with the finish's counts matching: a token delivered twice, lost or out of order
changes the sequence. Tokens are not numbered on the wire (Delta has no offset), so the sequence
is the check.

Memory: VmRSS of every process in target.processes before the first round and `settle_s` after
each. The first round grows the processes to their working size (allocator arenas, gRPC buffers,
KV blocks touched), which they keep; a leak shows as growth again in every later, identical round.
A process fails when it grew by more than `LoadPlan.rss_tolerance_mib` (docs/e2e-load.md says
why) in each round after the first: a leak grows every round, while an allocator's high-water mark
may step up once more when a later round's routing happens to queue more streams on one engine
(measured: a tiny engine once +36 MiB in round 2, then flat). With two rounds that is the one
delta. The RSS before the first round and the growth since round 1 are reported beside it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import grpc

from dpgate.e2e.contracts import GateResult, Target
from dpgate.e2e.proc_memory import rss_mib
from dpgate.v1 import generate_pb2, generate_pb2_grpc

RANK_KEY = "x-data-parallel-rank"
PROMPTS = tuple(f"Load test prompt number {index}, please continue:" for index in range(8))
# Separate connections: gRPC shares one subchannel between channels with equal arguments otherwise.
CHANNEL_OPTIONS = (("grpc.use_local_subchannel_pool", 1),)


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """How hard to push: `streams` at once per round, `rounds` identical rounds."""

    streams: int = 1000
    max_tokens: int = 4
    channels: int = 4
    rounds: int = 3
    settle_s: float = 2.0
    # Allowed VmRSS growth of a process from round 1 to the last: slack + fraction x its RSS after
    # round 1 (docs/e2e-load.md: engines swing by up to ~12 MiB of ~490 between identical rounds
    # with no trend, the gateway by ~0.3 MiB of ~51), so ~17 MiB for an engine, ~3.5 for the gateway.
    rss_slack_mib: float = 2.0
    rss_slack_fraction: float = 0.03

    def rss_tolerance_mib(self, rss_mib: float) -> float:
        return round(self.rss_slack_mib + self.rss_slack_fraction * rss_mib, 1)


@dataclass(frozen=True, slots=True)
class StreamOutcome:
    """One stream: its tokens as delivered, how long it took, and what was wrong (None: nothing)."""

    tokens: int
    seconds: float
    problem: str | None


def greedy_stopping(max_tokens: int) -> generate_pb2.StoppingCriteria:
    return generate_pb2.StoppingCriteria(max_tokens=max_tokens, ignore_eos=True)


def stream_request(prompt: str, max_tokens: int) -> generate_pb2.GenerateStreamRequest:
    return generate_pb2.GenerateStreamRequest(
        text=prompt, sampling=generate_pb2.SamplingParams(temperature=0.0), stopping=greedy_stopping(max_tokens)
    )


def unary_request(prompt: str, max_tokens: int) -> generate_pb2.GenerateRequest:
    return generate_pb2.GenerateRequest(
        text=prompt, sampling=generate_pb2.SamplingParams(temperature=0.0), stopping=greedy_stopping(max_tokens)
    )


def check_stream(
    messages: list[generate_pb2.GenerateStreamResponse], expected: generate_pb2.GenerateResponse
) -> str | None:
    """What is wrong with a finished stream against the reference answer, in one sentence; None if nothing."""
    kinds = [message.WhichOneof("event") for message in messages]
    if len(kinds) < 2 or kinds[0] != "prompt_info" or kinds[-1] != "finish" or set(kinds[1:-1]) - {"delta"}:
        return f"messages arrived as {kinds}, not prompt_info, deltas, finish"
    tokens = [token for message in messages[1:-1] for token in message.delta.token_ids]
    text = "".join(message.delta.text for message in messages[1:-1])
    finish = messages[-1].finish
    if tokens != list(expected.token_ids):
        return f"token ids {tokens} differ from the engine's {list(expected.token_ids)}"
    if text != expected.text:
        return f"text {text!r} differs from the engine's {expected.text!r}"
    if finish.num_generated_tokens != len(tokens):
        return f"finish counts {finish.num_generated_tokens} generated tokens, {len(tokens)} were delivered"
    if finish.num_prompt_tokens != len(messages[0].prompt_info.prompt_token_ids):
        return f"finish counts {finish.num_prompt_tokens} prompt tokens, prompt info has a different count"
    if finish.reason != expected.finish.reason:
        return f"finish reason {finish.reason} differs from the engine's {expected.finish.reason}"
    return None


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of `values` (which must not be empty)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def _remaining(deadline: float) -> float:
    return max(0.1, deadline - time.monotonic())


async def references(
    channel: grpc.aio.Channel, dp_size: int, max_tokens: int, deadline: float
) -> dict[str, generate_pb2.GenerateResponse]:
    """Each prompt's greedy answer, asked of every rank pinned; raises ValueError if ranks disagree."""
    stub = generate_pb2_grpc.InferenceServiceStub(channel)
    answers = {}
    for prompt in PROMPTS:
        per_rank = [
            await stub.Generate(
                unary_request(prompt, max_tokens), metadata=((RANK_KEY, str(rank)),), timeout=_remaining(deadline)
            )
            for rank in range(dp_size)
        ]
        if any(list(answer.token_ids) != list(per_rank[0].token_ids) for answer in per_rank):
            raise ValueError(f"the ranks answer {prompt!r} differently: {[list(a.token_ids) for a in per_rank]}")
        answers[prompt] = per_rank[0]
    return answers


async def one_stream(
    stub: generate_pb2_grpc.InferenceServiceStub, prompt: str, expected: generate_pb2.GenerateResponse, plan: LoadPlan,
    deadline: float,
) -> StreamOutcome:  # fmt: skip
    started = time.monotonic()
    messages = []
    try:
        async for message in stub.GenerateStream(stream_request(prompt, plan.max_tokens), timeout=_remaining(deadline)):
            messages.append(message)
    except grpc.aio.AioRpcError as error:
        return StreamOutcome(0, time.monotonic() - started, f"{error.code().name}: {error.details()}")
    tokens = sum(len(message.delta.token_ids) for message in messages if message.HasField("delta"))
    return StreamOutcome(tokens, time.monotonic() - started, check_stream(messages, expected))


async def one_round(
    channels: list[grpc.aio.Channel], answers: dict[str, generate_pb2.GenerateResponse], plan: LoadPlan, deadline: float
) -> tuple[list[StreamOutcome], float]:
    """All `plan.streams` streams at once, spread over the channels; their outcomes and the round's seconds."""
    stubs = [generate_pb2_grpc.InferenceServiceStub(channel) for channel in channels]
    started = time.monotonic()
    outcomes = await asyncio.gather(
        *(
            one_stream(stubs[index % len(stubs)], PROMPTS[index % len(PROMPTS)], answers[PROMPTS[index % len(PROMPTS)]],
                       plan, deadline)
            for index in range(plan.streams)
        )
    )  # fmt: skip
    return list(outcomes), time.monotonic() - started


async def _run(target: Target, plan: LoadPlan) -> GateResult:
    channels = [grpc.aio.insecure_channel(target.gateway, options=CHANNEL_OPTIONS) for _ in range(plan.channels)]
    try:
        answers = await references(channels[0], target.topology.dp, plan.max_tokens, target.deadline)
        rss = [rss_mib(target.processes)]
        figures: dict = {"streams_per_round": plan.streams, "rounds": plan.rounds, "max_tokens": plan.max_tokens,
                         "channels": plan.channels, "settle_s": plan.settle_s, "rss_mib_before": rss[0]}  # fmt: skip
        problems: list[str] = []
        for round_number in range(1, plan.rounds + 1):
            outcomes, seconds = await one_round(channels, answers, plan, target.deadline)
            await asyncio.sleep(plan.settle_s)
            rss.append(rss_mib(target.processes))
            times = [outcome.seconds for outcome in outcomes]
            failed = [outcome.problem for outcome in outcomes if outcome.problem is not None]
            figures[f"round_{round_number}"] = {
                "streams_ok": len(outcomes) - len(failed), "tokens": sum(o.tokens for o in outcomes),
                "seconds": round(seconds, 2), "p50_stream_s": round(percentile(times, 0.5), 3),
                "p99_stream_s": round(percentile(times, 0.99), 3), "rss_mib_after": rss[-1],
            }  # fmt: skip
            target.log(f"load round {round_number}: {figures[f'round_{round_number}']}")
            if failed:
                problems.append(
                    f"round {round_number}: {len(failed)} of {plan.streams} streams failed, first: {failed[0]}"
                )
        growth = {name: round(rss[-1][name] - rss[1][name], 1) for name in target.processes}
        tolerance = {name: plan.rss_tolerance_mib(rss[1][name]) for name in target.processes}
        rounds = [figures[f"round_{number}"] for number in range(1, plan.rounds + 1)]
        figures["streams_ok"] = sum(each["streams_ok"] for each in rounds)
        figures["tokens"] = sum(each["tokens"] for each in rounds)
        figures["rss_mib_after"] = rss[-1]
        figures["rss_growth_after_round_1_mib"] = growth
        figures["rss_growth_tolerance_mib"] = tolerance
        if plan.rounds >= 2:
            grown = {
                name: mib
                for name, mib in growth.items()
                if all(rss[k][name] - rss[k - 1][name] > tolerance[name] for k in range(2, plan.rounds + 1))
            }
            if grown:
                problems.append(
                    f"VmRSS grew in every round after the first, by {grown} MiB in all, each round over the "
                    f"{tolerance} MiB allowed"
                )
        return GateResult("load", not problems, figures, "; ".join(problems))
    finally:
        for channel in channels:
            await channel.close()


def run(target: Target, plan: LoadPlan | None = None) -> GateResult:
    """Run the load workload against `target` (see the module docstring) and return its verdict.
    Synchronous (it runs its own event loop): call it from a thread with no loop running."""
    try:
        return asyncio.run(_run(target, plan or LoadPlan()))
    except (ValueError, grpc.aio.AioRpcError) as error:
        detail = error.details() if isinstance(error, grpc.aio.AioRpcError) else str(error)
        return GateResult("load", False, {}, f"the reference answers could not be had: {detail}")
