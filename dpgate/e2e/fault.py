"""The fault stage: cut one engine's host off the network while streams are in flight, then heal it.

The victim is the last DP rank. Its link goes down the way a pulled cable or a dead switch port
takes a machine away: packets are dropped in silence, nothing tells the gateway (no RST, no ICMP).
What must hold (docs/e2e-hosts.md says why each bound is what it is):

1. The victim's streams end within the detection bound, F x (I + T) + T: the gateway's watcher
   marks the engine unhealthy after F failed probes, each a probe timeout T after an interval I,
   then gives each of the engine's connections one more T to answer a PING before it drops them.
   Every stream had tokens when the link went, so each ends with INTERNAL (an engine failure after
   messages were sent: DESIGN.md rule 7; UNAVAILABLE would invite a retry that repeats tokens).
2. Unpinned unary calls made during the cut all succeed, on the other ranks.
3. A call pinned to the victim during the cut gets UNAVAILABLE.
4. After heal, a call pinned to the victim succeeds within the recovery bound T + S x I + N: the
   probe in progress may still time out (T), the next one reaches the engine on a fresh
   connection, S good probes make it healthy, and N is the network's own wait: the gateway host's
   ARP entry for the victim failed during the cut, and Linux asks again every `retrans_time_ms`
   (1 s by default), so the first packets after heal may wait that long.
5. Every stream served by the other ranks ends OK.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import grpc

from dpgate.e2e.contracts import GateResult, Target
from dpgate.v1 import generate_pb2, generate_pb2_grpc

RANK_KEY = "x-data-parallel-rank"
_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """The gateway's health flags the bounds come from, and the workload's size.

    `health_timeout_s` None means the interval (the most the gateway allows). `stream_tokens` must
    make a stream outlast the detection bound at the engine's speed; `hold_s` is how long unpinned
    calls go on after the victim's streams ended; `neighbour_retry_s` is the hosts' ARP retry time
    (Linux's `net.ipv4.neigh.*.retrans_time_ms`); `slack_s` is scheduling allowance on a busy machine.
    """

    failure_threshold: int = 3
    success_threshold: int = 1
    health_timeout_s: float | None = None
    num_pinned: int = 4
    num_unpinned: int = 4
    stream_tokens: int = 400
    hold_s: float = 1.0
    neighbour_retry_s: float = 1.0
    slack_s: float = 0.5


@dataclass(slots=True)
class _Stream:
    """One GenerateStream's story, written by its thread."""

    pinned: bool
    tokens: int = 0
    started: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)
    ended_at: float = 0.0
    code: grpc.StatusCode | None = None
    rank: int | None = None


def _rank_of(metadata: object) -> int | None:
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key == RANK_KEY:
            return int(value)
    return None


def _stream(
    stub: generate_pb2_grpc.InferenceServiceStub, state: _Stream, metadata: tuple, timeout: float, tokens: int
) -> None:
    request = generate_pb2.GenerateStreamRequest(
        text="fault stage", stopping=generate_pb2.StoppingCriteria(max_tokens=tokens, ignore_eos=True)
    )
    call = stub.GenerateStream(request, metadata=metadata, timeout=timeout)
    try:
        for response in call:
            if response.HasField("delta"):
                state.tokens += max(1, len(response.delta.token_ids))
                state.started.set()
        state.code = call.code()
        state.rank = _rank_of(call.trailing_metadata())
    except grpc.RpcError as error:
        state.code = error.code()  # type: ignore[attr-defined]
        state.rank = _rank_of(error.trailing_metadata())  # type: ignore[attr-defined]
    finally:
        state.ended_at = time.monotonic()
        state.ended.set()


def _unary(
    stub: generate_pb2_grpc.InferenceServiceStub, metadata: tuple, timeout: float
) -> tuple[grpc.StatusCode, int | None]:
    request = generate_pb2.GenerateRequest(
        text="fault stage", stopping=generate_pb2.StoppingCriteria(max_tokens=2, ignore_eos=True)
    )
    try:
        _, call = stub.Generate.with_call(request, metadata=metadata, timeout=timeout)
        return call.code(), _rank_of(call.trailing_metadata())
    except grpc.RpcError as error:
        return error.code(), _rank_of(error.trailing_metadata())  # type: ignore[attr-defined]


class _UnpinnedLoop:
    """Unpinned unary calls one after another until stopped; counts outcomes and serving ranks."""

    def __init__(self, stub: generate_pb2_grpc.InferenceServiceStub, timeout: float) -> None:
        self.outcomes: list[tuple[grpc.StatusCode, int | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(stub, timeout), daemon=True)
        self._thread.start()

    def _run(self, stub: generate_pb2_grpc.InferenceServiceStub, timeout: float) -> None:
        while not self._stop.is_set():
            self.outcomes.append(_unary(stub, (), timeout))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run(target: Target, plan: FaultPlan | None = None) -> GateResult:
    """Cut the last rank's host during streaming, check the five rules above, heal it."""
    plan = plan or FaultPlan()
    hosts = target.hosts
    if hosts is None or len(target.engines) < 2:
        return GateResult("fault", False, detail="the fault stage needs netns hosts (cut/heal) and DP >= 2")
    interval = target.health_interval_s
    timeout = plan.health_timeout_s if plan.health_timeout_s is not None else interval
    detect_bound = plan.failure_threshold * (interval + timeout) + timeout + plan.slack_s
    recover_bound = timeout + plan.success_threshold * interval + plan.neighbour_retry_s + plan.slack_s
    victim = len(target.engines) - 1
    victim_host = f"engine-{victim}"
    pin = ((RANK_KEY, str(victim)),)
    figures: dict[str, object] = {"victim_rank": victim, "detect_bound_s": round(detect_bound, 3),
                                  "recover_bound_s": round(recover_bound, 3)}  # fmt: skip
    failures: list[str] = []
    with grpc.insecure_channel(target.gateway) as channel, grpc.insecure_channel(target.gateway) as unary_channel:
        stub = generate_pb2_grpc.InferenceServiceStub(channel)
        unary_stub = generate_pb2_grpc.InferenceServiceStub(unary_channel)
        code, _ = _unary(unary_stub, pin, 30)
        if code is not grpc.StatusCode.OK:
            return GateResult("fault", False, figures, f"rank {victim} did not serve before the cut: {code.name}")
        streams = [_Stream(pinned=False) for _ in range(plan.num_unpinned)]
        streams += [_Stream(pinned=True) for _ in range(plan.num_pinned)]
        left = max(1.0, target.deadline - time.monotonic())
        threads = [
            threading.Thread(
                target=_stream, args=(stub, s, pin if s.pinned else (), left, plan.stream_tokens), daemon=True
            )
            for s in streams
        ]
        for thread in threads:
            thread.start()
        if not all(s.started.wait(max(0.0, target.deadline - time.monotonic())) for s in streams):
            return GateResult("fault", False, figures, "not every stream had a token before the deadline")
        target.log(f"fault: {len(streams)} streams in flight; cutting {victim_host}")
        cut_at = time.monotonic()
        hosts.cut(victim_host)
        healed = False
        try:
            loop = _UnpinnedLoop(unary_stub, detect_bound + 5)
            pinned = [s for s in streams if s.pinned]
            wait_until = cut_at + 2 * detect_bound
            for s in pinned:
                s.ended.wait(max(0.0, wait_until - time.monotonic()))
            ended = [s for s in streams if s.ended.is_set() and s.rank == victim]
            if not all(s.ended.is_set() for s in pinned):
                failures.append(f"the victim's pinned streams were still open {2 * detect_bound:.1f} s after the cut")
            else:
                end_s = max(s.ended_at for s in ended) - cut_at
                figures["streams_ended_s"] = round(end_s, 3)
                figures["victim_streams"] = len(ended)
                figures["victim_stream_codes"] = sorted({s.code.name for s in ended if s.code is not None})
                if end_s > detect_bound:
                    failures.append(
                        f"the victim's streams ended {end_s:.2f} s after the cut, over {detect_bound:.2f} s"
                    )
                if any(s.code is not grpc.StatusCode.INTERNAL for s in ended):
                    failures.append(f"the victim's streams ended with {figures['victim_stream_codes']}, not INTERNAL")
            started = time.monotonic()
            code, _ = _unary(unary_stub, pin, detect_bound + 5)
            figures["pinned_during_cut"] = code.name
            figures["pinned_during_cut_s"] = round(time.monotonic() - started, 3)
            if code is not grpc.StatusCode.UNAVAILABLE:
                failures.append(f"a call pinned to rank {victim} during the cut got {code.name}, not UNAVAILABLE")
            time.sleep(plan.hold_s)
            loop.stop()
            succeeded = [o for o in loop.outcomes if o[0] is grpc.StatusCode.OK and o[1] != victim]
            figures["unpinned_calls_during_cut"] = len(loop.outcomes)
            figures["unpinned_succeeded_during_cut"] = len(succeeded)
            if not loop.outcomes or len(succeeded) != len(loop.outcomes):
                bad = sorted({f"{c.name}@{r}" for c, r in loop.outcomes if (c, r) not in succeeded})
                failures.append(f"{len(loop.outcomes) - len(succeeded)} of {len(loop.outcomes)} unpinned calls "
                                f"during the cut did not succeed on another rank: {bad}")  # fmt: skip
            target.log(f"fault: healing {victim_host}")
            hosts.heal(victim_host)
            healed = True
            healed_at = time.monotonic()
            served_at = None
            while time.monotonic() < healed_at + 2 * recover_bound:
                if _unary(unary_stub, pin, 1.0)[0] is grpc.StatusCode.OK:
                    served_at = time.monotonic()
                    break
                time.sleep(_POLL_S)
            if served_at is None:
                failures.append(f"rank {victim} did not serve {2 * recover_bound:.1f} s after heal")
            else:
                figures["serve_again_s"] = round(served_at - healed_at, 3)
                if served_at - healed_at > recover_bound:
                    failures.append(f"rank {victim} served again {served_at - healed_at:.2f} s after heal, "
                                    f"over {recover_bound:.2f} s")  # fmt: skip
        finally:
            if not healed:
                hosts.heal(victim_host)
        for thread in threads:
            thread.join(max(0.0, target.deadline - time.monotonic()))
        others = [s for s in streams if not s.pinned and s.rank != victim]
        figures["other_streams"] = len(others)
        if any(not s.ended.is_set() or s.code is not grpc.StatusCode.OK for s in others):
            codes = sorted({s.code.name if s.code else "open" for s in others})
            failures.append(f"streams on the other ranks did not all end OK: {codes}")
    return GateResult("fault", not failures, figures, "; ".join(failures))
