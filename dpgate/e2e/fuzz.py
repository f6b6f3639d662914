"""The fuzz workload: random requests through the gateway get only documented status codes, hostile
HTTP/2 gets the error RFC 9113 names, and the servers keep serving throughout.

Part one sends `requests` cases drawn by hypothesis (dpgate/e2e/fuzz_cases.py) with `concurrency`
calls in flight: gRPC calls with raw bodies over grpc.aio, and raw HTTP/2 calls (lying gRPC
framing, connections cut mid-frame) in worker threads. Every `check_every` cases, and at the end, a
known-good greedy Generate must return exactly what it returned before the fuzzing. Part two sends
each RFC violation (dpgate/e2e/h2_violations.py) on its own connection while a GenerateStream on
another connection is in flight, and that stream must finish with every token. At the end every
engine's health must be SERVING and no process in target.processes may have exited.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dpgate.e2e import fuzz_verdict, h2_violations
from dpgate.e2e.contracts import GateResult, Target
from dpgate.e2e.fuzz_cases import STREAMING, FuzzCase, draw_cases
from dpgate.e2e.load import check_stream, stream_request, unary_request
from dpgate.e2e.proc_memory import dead
from dpgate.e2e.raw_calls import RawConnection, cut_call
from dpgate.v1 import generate_pb2, generate_pb2_grpc

KNOWN_GOOD_PROMPT = "The known-good request of the fuzz workload:"
CHANNEL_OPTIONS = (("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 64 << 20))


@dataclass(frozen=True, slots=True)
class FuzzPlan:
    requests: int = 10_000
    seed: int = 15
    concurrency: int = 16
    raw_connections: int = 2
    check_every: int = 500
    call_timeout_s: float = 30.0
    rfc_violations: bool = True  # part two; off only where the target is no dpgate gateway (a unit test)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class Sender:
    """Sends cases and counts (kind, outcome); owns the channel and the raw connections."""

    def __init__(self, target: Target, plan: FuzzPlan) -> None:
        self.target, self.plan = target, plan
        self.host, self.port = _split(target.gateway)
        self.channel = grpc.aio.insecure_channel(target.gateway, options=CHANNEL_OPTIONS)
        self.outcomes: Counter[tuple[str, str]] = Counter()
        self.raw = asyncio.Queue()
        for _ in range(plan.raw_connections):
            self.raw.put_nowait(RawConnection(self.host, self.port, plan.call_timeout_s))

    def timeout(self) -> float:
        return max(0.5, min(self.plan.call_timeout_s, self.target.deadline - time.monotonic()))

    async def send(self, case: FuzzCase) -> None:
        self.outcomes[(case.kind, await self._outcome(case))] += 1

    async def _outcome(self, case: FuzzCase) -> str:
        if case.transport == "cut-frame":
            return await asyncio.to_thread(
                cut_call, self.host, self.port, case.path, case.body, case.keep_permille, self.plan.call_timeout_s
            )
        if case.transport == "raw":
            connection = await self.raw.get()
            try:
                return await asyncio.to_thread(connection.call, case.path, case.body)
            except OSError as error:
                connection.close()
                return f"client:{type(error).__name__}"
            finally:
                self.raw.put_nowait(connection)
        timeout, started = self.timeout(), time.monotonic()
        try:
            if case.path in STREAMING:
                async for _ in self.channel.unary_stream(case.path)(case.body, metadata=case.metadata, timeout=timeout):
                    pass
            else:
                await self.channel.unary_unary(case.path)(case.body, metadata=case.metadata, timeout=timeout)
        except grpc.aio.AioRpcError as error:
            if error.code() is grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - started < timeout - 0.05:
                return fuzz_verdict.EARLY_DEADLINE  # not the client's deadline: someone else's, passed off as ours
            return error.code().name
        return "OK"

    async def close(self) -> None:
        await self.channel.close()
        while not self.raw.empty():
            self.raw.get_nowait().close()


async def _known_good(stub, expected: generate_pb2.GenerateResponse | None, timeout: float) -> str | None:
    """None when the known-good call returns `expected` (or, with no `expected` yet, succeeds)."""
    try:
        answer = await stub.Generate(unary_request(KNOWN_GOOD_PROMPT, 8), timeout=timeout)
    except grpc.aio.AioRpcError as error:
        return f"the known-good call failed: {error.code().name} {error.details()}"
    if expected is not None and list(answer.token_ids) != list(expected.token_ids):
        return f"the known-good call returned {list(answer.token_ids)}, before {list(expected.token_ids)}"
    return None


async def _fuzz_requests(sender: Sender, cases: list[FuzzCase], problems: list[str]) -> int:
    """Send every case in chunks of check_every, a known-good call after each chunk; the known-good calls made."""
    stub = generate_pb2_grpc.InferenceServiceStub(sender.channel)
    expected = await stub.Generate(unary_request(KNOWN_GOOD_PROMPT, 8), timeout=sender.timeout())
    gate = asyncio.Semaphore(sender.plan.concurrency)
    checks = 0

    async def bounded(case: FuzzCase) -> None:
        async with gate:
            await sender.send(case)

    for start in range(0, len(cases), sender.plan.check_every):
        if time.monotonic() > sender.target.deadline:
            problems.append(f"the deadline passed after {start} of {len(cases)} requests")
            break
        await asyncio.gather(*(bounded(case) for case in cases[start : start + sender.plan.check_every]))
        checks += 1
        failure = await _known_good(stub, expected, sender.timeout())
        if failure is not None:
            problems.append(f"after {start + sender.plan.check_every} requests {failure}")
            break
    return checks


async def _violations(target: Target, problems: list[str]) -> dict[str, str]:
    """Each RFC violation with a stream in flight on another connection; the reactions seen."""
    host, port = _split(target.gateway)
    reactions = {}
    async with grpc.aio.insecure_channel(target.gateway, options=CHANNEL_OPTIONS) as channel:
        stub = generate_pb2_grpc.InferenceServiceStub(channel)
        expected = await stub.Generate(unary_request(KNOWN_GOOD_PROMPT, 24), timeout=30)
        for violation in h2_violations.VIOLATIONS:
            stream = stub.GenerateStream(stream_request(KNOWN_GOOD_PROMPT, 24), timeout=30)
            messages = [await stream.read()]  # the stream is open before the violation is sent
            reactions[violation.name] = await asyncio.to_thread(h2_violations.react, host, port, violation)
            try:
                while (message := await stream.read()) is not grpc.aio.EOF:
                    messages.append(message)
                wrong = check_stream(messages, expected)
            except grpc.aio.AioRpcError as error:
                wrong = f"{error.code().name} {error.details()}"
            if reactions[violation.name] != violation.expected:
                problems.append(f"{violation.name} (RFC {violation.rfc}): {reactions[violation.name]}, "
                                f"expected {violation.expected}")  # fmt: skip
            if wrong is not None:
                problems.append(f"the stream on another connection during {violation.name}: {wrong}")
    return reactions


async def _engines_serving(target: Target) -> list[str]:
    problems = []
    for address in target.engines:
        async with grpc.aio.insecure_channel(address) as channel:
            try:
                reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
                if reply.status != health_pb2.HealthCheckResponse.SERVING:
                    problems.append(f"engine {address} health is {reply.status} after the fuzzing, not SERVING")
            except grpc.aio.AioRpcError as error:
                problems.append(f"engine {address} health check failed after the fuzzing: {error.code().name}")
    return problems


async def _run(target: Target, plan: FuzzPlan) -> GateResult:
    started = time.monotonic()
    cases = draw_cases(plan.requests, plan.seed)
    drawn_s = time.monotonic() - started
    problems: list[str] = []
    sender = Sender(target, plan)
    try:
        checks = await _fuzz_requests(sender, cases, problems)
    finally:
        await sender.close()
    sent_s = time.monotonic() - started - drawn_s
    problems += fuzz_verdict.problems(sender.outcomes)
    reactions = await _violations(target, problems) if plan.rfc_violations else {}
    problems += await _engines_serving(target)
    problems += [f"process {name} exited" for name in dead(target.processes)]
    figures = {
        "requests": sum(sender.outcomes.values()), "seed": plan.seed,
        "codes_seen": fuzz_verdict.codes_seen(sender.outcomes),
        "kinds": dict(Counter(case.kind for case in cases).most_common()), "known_good_checks": checks,
        "draw_s": round(drawn_s, 1), "send_s": round(sent_s, 1), "rfc_violations": len(reactions),
        "rfc_reactions": dict(Counter(reactions.values()).most_common()),
        "seconds": round(time.monotonic() - started, 1),
    }  # fmt: skip
    target.log(f"fuzz: {figures}")
    return GateResult("fuzz", not problems, figures, "; ".join(problems[:5]))


def run(target: Target, plan: FuzzPlan | None = None) -> GateResult:
    """Run the fuzz workload against `target` (see the module docstring) and return its verdict.
    Synchronous (it runs its own event loop): call it from a thread with no loop running."""
    try:
        return asyncio.run(_run(target, plan or FuzzPlan()))
    except grpc.aio.AioRpcError as error:
        return GateResult("fuzz", False, {}, f"a reference call failed: {error.code().name} {error.details()}")
