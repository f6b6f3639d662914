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


@dataclass(frozen=True, slots=True)
class Bounds:
    """The seconds each check allows, from the gateway's health flags (see the module docstring)."""

    detect_s: float
    recover_s: float

    @classmethod
    def of(cls, interval: float, plan: FaultPlan) -> Bounds:
        timeout = plan.health_timeout_s if plan.health_timeout_s is not None else interval
        return cls(
            detect_s=plan.failure_threshold * (interval + timeout) + timeout + plan.slack_s,
            recover_s=timeout + plan.success_threshold * interval + plan.neighbour_retry_s + plan.slack_s,
        )


class _FaultRun:
    """One run of the stage: its streams, figures and failures, one method per check."""

    def __init__(
        self,
        target: Target,
        plan: FaultPlan,
        stub: generate_pb2_grpc.InferenceServiceStub,
        unary_stub: generate_pb2_grpc.InferenceServiceStub,
    ) -> None:
        self.target, self.plan = target, plan
        self.bounds = Bounds.of(target.health_interval_s, plan)
        self.victim = len(target.engines) - 1
        self.pin = ((RANK_KEY, str(self.victim)),)
        self.stub, self.unary_stub = stub, unary_stub
        self.figures: dict[str, object] = {
            "victim_rank": self.victim,
            "detect_bound_s": round(self.bounds.detect_s, 3),
            "recover_bound_s": round(self.bounds.recover_s, 3),
        }
        self.failures: list[str] = []
        self.streams = [_Stream(pinned=False) for _ in range(plan.num_unpinned)]
        self.streams += [_Stream(pinned=True) for _ in range(plan.num_pinned)]
        self.threads: list[threading.Thread] = []

    def start_streams(self) -> bool:
        """Unpinned streams first (they spread over the ranks), then the pinned ones; True once all have a token."""
        left = max(1.0, self.target.deadline - time.monotonic())
        for state in self.streams:
            metadata = self.pin if state.pinned else ()
            args = (self.stub, state, metadata, left, self.plan.stream_tokens)
            self.threads.append(threading.Thread(target=_stream, args=args, daemon=True))
            self.threads[-1].start()
        return all(s.started.wait(max(0.0, self.target.deadline - time.monotonic())) for s in self.streams)

    def check_streams_end(self, cut_at: float) -> None:
        """Rule 1: every stream on the victim ends, with INTERNAL, within the detection bound."""
        pinned = [s for s in self.streams if s.pinned]
        wait_until = cut_at + 2 * self.bounds.detect_s
        for state in pinned:
            state.ended.wait(max(0.0, wait_until - time.monotonic()))
        if not all(s.ended.is_set() for s in pinned):
            self.failures.append(
                f"the victim's pinned streams were still open {2 * self.bounds.detect_s:.1f} s after the cut"
            )
            return
        ended = [s for s in self.streams if s.ended.is_set() and s.rank == self.victim]
        end_s = max(s.ended_at for s in ended) - cut_at
        codes = sorted({s.code.name for s in ended if s.code is not None})
        self.figures.update(streams_ended_s=round(end_s, 3), victim_streams=len(ended), victim_stream_codes=codes)
        if end_s > self.bounds.detect_s:
            self.failures.append(
                f"the victim's streams ended {end_s:.2f} s after the cut, over {self.bounds.detect_s:.2f} s"
            )
        if any(s.code is not grpc.StatusCode.INTERNAL for s in ended):
            self.failures.append(f"the victim's streams ended with {codes}, not INTERNAL")

    def check_pinned_unavailable(self) -> None:
        """Rule 3: a call pinned to the victim during the cut is refused with UNAVAILABLE."""
        started = time.monotonic()
        code, _ = _unary(self.unary_stub, self.pin, self.bounds.detect_s + 5)
        self.figures.update(pinned_during_cut=code.name, pinned_during_cut_s=round(time.monotonic() - started, 3))
        if code is not grpc.StatusCode.UNAVAILABLE:
            self.failures.append(f"a call pinned to rank {self.victim} during the cut got {code.name}, not UNAVAILABLE")

    def check_unpinned_succeeded(self, outcomes: list[tuple[grpc.StatusCode, int | None]]) -> None:
        """Rule 2: every unpinned call made during the cut succeeded on another rank."""
        succeeded = [o for o in outcomes if o[0] is grpc.StatusCode.OK and o[1] != self.victim]
        self.figures.update(unpinned_calls_during_cut=len(outcomes), unpinned_succeeded_during_cut=len(succeeded))
        if not outcomes or len(succeeded) != len(outcomes):
            bad = sorted({f"{code.name}@{rank}" for code, rank in outcomes if (code, rank) not in succeeded})
            self.failures.append(f"{len(outcomes) - len(succeeded)} of {len(outcomes)} unpinned calls during the cut "
                                 f"did not succeed on another rank: {bad}")  # fmt: skip

    def check_serves_again(self, healed_at: float) -> None:
        """Rule 4: a call pinned to the victim succeeds within the recovery bound of the heal."""
        bound = self.bounds.recover_s
        while time.monotonic() < healed_at + 2 * bound:
            if _unary(self.unary_stub, self.pin, 1.0)[0] is grpc.StatusCode.OK:
                served_s = time.monotonic() - healed_at
                self.figures["serve_again_s"] = round(served_s, 3)
                if served_s > bound:
                    self.failures.append(
                        f"rank {self.victim} served again {served_s:.2f} s after heal, over {bound:.2f} s"
                    )
                return
            time.sleep(_POLL_S)
        self.failures.append(f"rank {self.victim} did not serve {2 * bound:.1f} s after heal")

    def check_others_ok(self) -> None:
        """Rule 5: the streams the other ranks served all end OK."""
        for thread in self.threads:
            thread.join(max(0.0, self.target.deadline - time.monotonic()))
        others = [s for s in self.streams if not s.pinned and s.rank != self.victim]
        self.figures["other_streams"] = len(others)
        if any(not s.ended.is_set() or s.code is not grpc.StatusCode.OK for s in others):
            codes = sorted({s.code.name if s.code else "open" for s in others})
            self.failures.append(f"streams on the other ranks did not all end OK: {codes}")


def run(target: Target, plan: FaultPlan | None = None) -> GateResult:
    """Cut the last rank's host during streaming, check the five rules above, heal it."""
    plan = plan or FaultPlan()
    hosts = target.hosts
    if hosts is None or len(target.engines) < 2:
        return GateResult("fault", False, detail="the fault stage needs netns hosts (cut/heal) and DP >= 2")
    with grpc.insecure_channel(target.gateway) as channel, grpc.insecure_channel(target.gateway) as unary_channel:
        stage = _FaultRun(target, plan, generate_pb2_grpc.InferenceServiceStub(channel),
                          generate_pb2_grpc.InferenceServiceStub(unary_channel))  # fmt: skip
        victim_host = f"engine-{stage.victim}"
        code, _ = _unary(stage.unary_stub, stage.pin, 30)
        if code is not grpc.StatusCode.OK:
            return GateResult(
                "fault", False, stage.figures, f"rank {stage.victim} did not serve before the cut: {code.name}"
            )
        if not stage.start_streams():
            return GateResult("fault", False, stage.figures, "not every stream had a token before the deadline")
        target.log(f"fault: {len(stage.streams)} streams in flight; cutting {victim_host}")
        cut_at = time.monotonic()
        hosts.cut(victim_host)
        try:
            loop = _UnpinnedLoop(stage.unary_stub, stage.bounds.detect_s + 5)
            try:
                stage.check_streams_end(cut_at)
                stage.check_pinned_unavailable()
                time.sleep(plan.hold_s)
            finally:
                loop.stop()
            stage.check_unpinned_succeeded(loop.outcomes)
        finally:
            target.log(f"fault: healing {victim_host}")
            hosts.heal(victim_host)
        stage.check_serves_again(time.monotonic())
        stage.check_others_ok()
    return GateResult("fault", not stage.failures, stage.figures, "; ".join(stage.failures))
