"""The gateway-side attacks of issue 22 (items 7-9) as scenarios: each runs one attack from
127.0.0.2 while a neighbour (dpgate/e2e/neighbour.py) works from 127.0.0.1, and returns whether
the attack was refused or ended as the gateway's flags say, with the neighbour's figures and the
gateway's memory and CPU around it.

A scenario knows the gateway only through `Scene` (its address, its process, the engines'
processes) and the limits it was started with (`GatewayLimits`: its flags; the defaults are the
gateway's own), so the same scenario runs in the tests, against gateways started with small
limits, and in `dpgate e2e --workload adversarial`, against the runner's deployment.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from dpgate.e2e import gateway_attacks as attack
from dpgate.e2e.neighbour import BACKGROUND_P99_BOUND_S, AttackWindow, Background, cpu_seconds, scrape
from dpgate.v1 import control_pb2, control_pb2_grpc

DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, UNAUTHENTICATED = 4, 8, 16
RANK_KEY = "x-data-parallel-rank"


@dataclass(frozen=True, slots=True)
class GatewayLimits:
    """The gateway's flags the attacks meet; each default is the gateway's own."""

    request_body_timeout_s: float = 30.0  # --request-body-timeout
    max_connections_per_peer: int = 1024  # --max-connections-per-peer
    max_in_flight_per_peer: int | None = None  # --max-in-flight-per-peer (or half --max-in-flight)
    health_interval_s: float = 1.0  # --health-interval
    health_timeout_s: float = 1.0  # --health-timeout
    failure_threshold: int = 3  # --failure-threshold

    @property
    def detection_s(self) -> float:
        """The longest the gateway takes to mark a silent engine unhealthy (then its channel closes)."""
        return self.failure_threshold * (self.health_interval_s + self.health_timeout_s) + self.health_interval_s


@dataclass(frozen=True, slots=True)
class Scene:
    """The deployment under attack: the gateway on 127.0.0.1 and the processes behind it."""

    gateway: str  # 127.0.0.1:PORT
    gateway_pid: int
    engine_pids: tuple[int, ...]  # by rank
    limits: GatewayLimits = GatewayLimits()
    metrics_port: int | None = None  # the gateway's, when it serves metrics (breaker and health checked)
    api_key: str | None = None  # sent by the neighbour and the attackers when the gateway wants keys

    @property
    def port(self) -> int:
        return int(self.gateway.rsplit(":", 1)[1])

    def neighbour(self, pinned_rank: int | None = None) -> Background:
        metadata = [("authorization", f"Bearer {self.api_key}")] if self.api_key else []
        if pinned_rank is not None:
            metadata.append((RANK_KEY, str(pinned_rank)))
        ranks = None if pinned_rank is None else [pinned_rank]
        return Background(self.gateway, self.metrics_port, metadata=metadata, ranks=ranks)

    def in_flight(self) -> float | None:
        if self.metrics_port is None:
            return None
        return scrape(self.metrics_port)["dpgate_gateway_in_flight_requests"]


@dataclass(frozen=True, slots=True)
class AttackPlan:
    """Sizes (scaled so each attack takes seconds beyond the gateway's own timeouts) and bounds."""

    schema_depth: int = 900  # outlasts the engine's default --grammar-compile-timeout-s (10 s); 400 for 2 s
    reused_id_trials: int = 8
    body_connections: int = 10
    body_streams: int = 10
    body_bytes: int = 3_900_000  # under the default --max-message-bytes (4 MiB)
    body_frame_bytes: int = 4096
    # 1.1 s measured in 4 KiB frames; with the per-frame copy of the whole body it was over 3.4 s, and
    # the neighbour's p99 7.1 s with its health probes timing out
    bodies_cpu_bound_s: float = 3.0
    headers_only_connections: int = 4
    headers_only_streams: int = 1000
    idle_extra: int = 48  # connections past --max-connections-per-peer
    never_read_connections: int = 4
    never_read_streams: int = 2
    never_read_max_tokens: int = 1000  # must fit the model's context
    never_read_s: float = 5.0
    watch_connections: int = 4
    watch_streams: int = 1000
    abort_deadline_s: float = 30.0
    p99_bound_s: float = BACKGROUND_P99_BOUND_S
    rss_bound_mb: float = 100.0  # the gateway's; a client that never read made it hold 455 MB
    engine_rss_bound_mb: float = 300.0  # the engine's: a 4 MB prompt took it from 1.38 to 1.87 GB to stay


@dataclass(slots=True)
class AttackResult:
    name: str
    line: str  # one line of figures for a person
    figures: dict[str, float | int | str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems


def finish(
    window: AttackWindow,
    plan: AttackPlan,
    outcome: str,
    problems: list[str],
    rss_bound_mb: float | None = None,
    **figures,
) -> AttackResult:
    """The attack's result: its own problems, then the neighbour's and the memory's."""
    problems = problems + window.problems(plan.p99_bound_s, plan.rss_bound_mb if rss_bound_mb is None else rss_bound_mb)
    return AttackResult(window.name, window.line(outcome), {**window.figures(), **figures}, problems)


def judge_endings(
    endings: list[dict[int, attack.Ending]], streams: int, status: int, said: str, peer_limit: int | None = None
) -> list[str]:
    """Every stream ended with `status` and a message containing `said`; with a per-peer in-flight
    limit, the streams beyond it may instead have been refused for it."""
    found = []
    for each in endings:
        if len(each) != streams:
            found.append(f"{streams - len(each)} of {streams} streams on a connection had no answer")
        refused = []
        if peer_limit is not None:
            refused = [
                e for e in each.values() if e.status == RESOURCE_EXHAUSTED and "--max-in-flight-per-peer" in e.message
            ]
        wrong = [e for e in each.values() if (e.status != status or said not in e.message) and e not in refused]
        if wrong:
            found.append(f"{len(wrong)} streams ended otherwise, e.g. {wrong[0]}")
    return found


def _served_problem(scene: Scene) -> list[str]:
    ending = attack.is_served(scene.port, scene.api_key)
    return [] if ending is not None and ending.status == 0 else [f"a client from another address got {ending}"]


def abort_while_an_engine_is_stopped(scene: Scene, plan: AttackPlan) -> AttackResult:
    """Item 7: the last rank is SIGSTOPped and an unpinned Abort sent; it must end UNAVAILABLE
    naming that rank once the gateway drops the engine, not hang until the client's deadline."""
    rank = len(scene.engine_pids) - 1
    name = f"unpinned Abort while rank {rank} is stopped"
    with scene.neighbour(pinned_rank=0) as neighbour, AttackWindow(name, scene.gateway_pid, neighbour) as window:
        with grpc.insecure_channel(scene.gateway) as channel:
            control = control_pb2_grpc.ControlServiceStub(channel)
            metadata = [("authorization", f"Bearer {scene.api_key}")] if scene.api_key else []
            os.kill(scene.engine_pids[rank], signal.SIGSTOP)
            started = time.monotonic()
            try:
                control.Abort(
                    control_pb2.AbortRequest(request_ids=["gone"]), timeout=plan.abort_deadline_s, metadata=metadata
                )
                code, details = grpc.StatusCode.OK, ""
            except grpc.RpcError as error:
                code, details = error.code(), error.details()
            finally:
                elapsed = time.monotonic() - started
                os.kill(scene.engine_pids[rank], signal.SIGCONT)
            rejoined = wait_rank(control, rank, metadata, timeout=30)
        window.settle()
    bound = scene.limits.detection_s + 2.0
    problems = []
    if code != grpc.StatusCode.UNAVAILABLE or details != f"data parallel rank {rank} is unavailable":
        problems.append(f"the Abort ended {code.name} {details!r} (expected UNAVAILABLE naming rank {rank})")
    if elapsed >= bound:
        problems.append(
            f"the Abort took {elapsed:.1f} s (bound {bound:g} s, the client's deadline {plan.abort_deadline_s:g} s)"
        )
    if not rejoined:
        problems.append(f"rank {rank} did not rejoin within 30 s of SIGCONT")
    outcome = f"answered {code.name} in {elapsed * 1000:.0f} ms (client deadline {plan.abort_deadline_s:g} s)"
    return finish(window, plan, outcome, problems, answered_ms=round(elapsed * 1000), code=code.name)


def wait_rank(control: control_pb2_grpc.ControlServiceStub, rank: int, metadata: list, timeout: float) -> bool:
    """Whether a call pinned to `rank` succeeds within `timeout` (the gateway serves that rank)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            control.GetServerInfo(
                control_pb2.GetServerInfoRequest(), metadata=[*metadata, (RANK_KEY, str(rank))], timeout=1
            )
            return True
        except grpc.RpcError:
            time.sleep(0.1)
    return False


def bodies_without_end_stream(scene: Scene, plan: AttackPlan) -> AttackResult:
    """Item 8: multi-MB request bodies that never end are ended at --request-body-timeout, and
    collecting them costs the gateway linear CPU (the per-frame copy was quadratic)."""
    count = plan.body_connections * plan.body_streams
    name = f"{count} bodies of {plan.body_bytes / 1e6:.1f} MB without END_STREAM"
    timeout = scene.limits.request_body_timeout_s
    with scene.neighbour() as neighbour:
        with AttackWindow(name, scene.gateway_pid, neighbour) as window:
            clients = attack.big_bodies_without_end(
                scene.port,
                plan.body_connections,
                plan.body_streams,
                plan.body_bytes,
                plan.body_frame_bytes,
                scene.api_key,
            )
            # What collecting them cost: the gateway has taken all but its socket buffers' worth by
            # now; read before the wait for the deadline, where the neighbour's calls would count.
            time.sleep(0.5)
            collect_cpu = cpu_seconds(scene.gateway_pid) - window.cpu_before
            ids = attack.stream_ids(plan.body_streams)
            endings = [attack.read_endings(client, ids, timeout=timeout + 15) for client in clients]
            ended = time.monotonic() - window.started
        attack.close_all(clients)
        window.settle()
    peer_limit = scene.limits.max_in_flight_per_peer
    problems = judge_endings(endings, plan.body_streams, DEADLINE_EXCEEDED, "--request-body-timeout", peer_limit)
    if collect_cpu >= plan.bodies_cpu_bound_s:
        problems.append(f"collecting the bodies cost {collect_cpu:.2f} s of CPU (bound {plan.bodies_cpu_bound_s:g} s)")
    outcome = (
        f"collected with {collect_cpu:.2f} s of CPU, all ended {ended:.1f} s after the first byte "
        f"(--request-body-timeout {timeout:g})"
    )
    return finish(window, plan, outcome, problems, ended_s=round(ended, 2), collect_cpu_s=round(collect_cpu, 2))


def headers_only_streams(scene: Scene, plan: AttackPlan) -> AttackResult:
    """Item 8: thousands of streams that send headers only are ended at --request-body-timeout and
    their in-flight slots freed (20,000 stayed in flight for over 60 s)."""
    count = plan.headers_only_connections * plan.headers_only_streams
    timeout = scene.limits.request_body_timeout_s
    with scene.neighbour() as neighbour:
        with AttackWindow(f"{count} headers-only streams", scene.gateway_pid, neighbour) as window:
            clients = attack.headers_only(
                scene.port, plan.headers_only_connections, plan.headers_only_streams, scene.api_key
            )
            ids = attack.stream_ids(plan.headers_only_streams)
            endings = [attack.read_endings(client, ids, timeout=timeout + 15) for client in clients]
            ended = time.monotonic() - window.started
        left = scene.in_flight()
        attack.close_all(clients)
        window.settle()
    peer_limit = scene.limits.max_in_flight_per_peer
    problems = judge_endings(
        endings, plan.headers_only_streams, DEADLINE_EXCEEDED, "--request-body-timeout", peer_limit
    )
    if left is not None and left > 1:  # the neighbour's own call, at most
        problems.append(f"{left:g} calls still in flight after every stream ended")
    outcome = f"all ended {ended:.1f} s after the first (--request-body-timeout {timeout:g})"
    return finish(window, plan, outcome, problems, ended_s=round(ended, 2))


def a_client_at_its_in_flight_limit(scene: Scene, plan: AttackPlan) -> AttackResult:
    """Item 8: one client holds its --max-in-flight-per-peer slots with headers-only streams and
    asks for as many again; those are refused at once and another address is still served (with
    --max-in-flight 100, one client holding 100 locked everyone out)."""
    limit = scene.limits.max_in_flight_per_peer
    assert limit is not None, "the gateway has no per-peer in-flight limit"
    name = f"one client asking for {2 * limit} in-flight slots"
    with scene.neighbour() as neighbour, AttackWindow(name, scene.gateway_pid, neighbour) as window:
        holder = attack.headers_only(scene.port, 1, limit, scene.api_key)[0]
        time.sleep(0.3)
        started = time.monotonic()
        extra = attack.headers_only(scene.port, 1, limit, scene.api_key)[0]
        refused = attack.read_endings(extra, attack.stream_ids(limit), timeout=10)
        refused_in = time.monotonic() - started
        problems = _served_problem(scene)
        held = scene.in_flight()
        attack.close_all([holder, extra])
        window.settle()
    left = scene.in_flight()
    problems += judge_endings([refused], limit, RESOURCE_EXHAUSTED, "--max-in-flight-per-peer")
    if held is not None and not limit <= held <= limit + 1:
        problems.append(f"{held:g} calls in flight while the client held {limit}")
    if left is not None and left > 1:
        problems.append(f"{left:g} calls still in flight after the client left")
    outcome = f"{limit} held, {limit} more refused in {refused_in * 1000:.0f} ms; another address served"
    return finish(window, plan, outcome, problems, refused_ms=round(refused_in * 1000))


def idle_connection_flood(scene: Scene, plan: AttackPlan) -> AttackResult:
    """Item 9: one address opens more idle connections than --max-connections-per-peer; the rest
    are closed at once and another address can still connect and call."""
    cap = scene.limits.max_connections_per_peer
    count = cap + plan.idle_extra
    with scene.neighbour() as neighbour:
        with AttackWindow(f"{count} idle TCP connections from one address", scene.gateway_pid, neighbour) as window:
            sockets = attack.idle_connections(scene.port, count)
            closed_at = attack.closed_by_gateway(sockets, timeout=10)
            closed = [at for at in closed_at if at is not None]
            refused_in = (max(closed) - window.started) if closed else 0.0
            problems = _served_problem(scene)
        attack.close_all(sockets)
        window.settle()
    if len(closed) != plan.idle_extra:
        problems.append(f"{len(closed)} of {count} connections closed (expected the {plan.idle_extra} past {cap})")
    outcome = f"{len(closed)} of {count} closed within {refused_in * 1000:.0f} ms; another address served"
    return finish(window, plan, outcome, problems, refused_ms=round(refused_in * 1000))


def streams_never_read(scene: Scene, plan: AttackPlan) -> AttackResult:
    """Item 9: streams whose responses the client never reads, behind the widest windows HTTP/2
    allows: the gateway's memory stays bounded while they last (it held 455 MB for 96 s)."""
    count = plan.never_read_connections * plan.never_read_streams
    with scene.neighbour() as neighbour:
        with AttackWindow(f"{count} streams never read", scene.gateway_pid, neighbour) as window:
            clients = attack.never_reading_streams(
                scene.port,
                plan.never_read_connections,
                plan.never_read_streams,
                plan.never_read_max_tokens,
                scene.api_key,
            )
            time.sleep(plan.never_read_s)
        # The streams did flow: the first connection has responses waiting to be read.
        seen = clients[0].read_until(lambda frame: frame.type == attack.f.DATA, timeout=5)
        attack.close_all(clients)
        window.settle()
    problems = [] if seen.of_type(attack.f.DATA) else ["no response data reached the client: nothing was tested"]
    if window.peak.peak >= window.rss_before + plan.rss_bound_mb:
        problems.append(
            f"RSS peaked at {window.peak.peak:.0f} MB from {window.rss_before:.0f} (bound +{plan.rss_bound_mb:g})"
        )
    return finish(window, plan, f"held for {plan.never_read_s:g} s", problems)


def keyless_watch_streams(scene: Scene, plan: AttackPlan) -> AttackResult:
    """Item 9: with API keys on, thousands of health Watch streams without a key are refused
    (UNAUTHENTICATED) and cost the gateway no memory (4,000 took it from 49 to 104 MB)."""
    assert scene.api_key is not None, "the gateway has no API keys"
    count = plan.watch_connections * plan.watch_streams
    with scene.neighbour() as neighbour:
        with AttackWindow(f"{count} health Watch streams without a key", scene.gateway_pid, neighbour) as window:
            clients = attack.unauthenticated_watches(scene.port, plan.watch_connections, plan.watch_streams)
            endings = [attack.read_endings(c, attack.stream_ids(plan.watch_streams), timeout=20) for c in clients]
            refused_in = time.monotonic() - window.started
        attack.close_all(clients)
        window.settle()
    problems = judge_endings(endings, plan.watch_streams, UNAUTHENTICATED, "")
    if window.peak.peak >= window.rss_before + plan.rss_bound_mb:
        problems.append(
            f"RSS peaked at {window.peak.peak:.0f} MB from {window.rss_before:.0f} (bound +{plan.rss_bound_mb:g})"
        )
    outcome = f"all refused within {refused_in * 1000:.0f} ms"
    return finish(window, plan, outcome, problems, refused_ms=round(refused_in * 1000))


Scenario = Callable[[Scene, AttackPlan], AttackResult]


def scenarios(scene: Scene) -> tuple[list[Scenario], list[str]]:
    """The scenarios this scene can run, and a sentence for each it cannot."""
    chosen: list[Scenario] = [
        bodies_without_end_stream,
        headers_only_streams,
        idle_connection_flood,
        streams_never_read,
    ]
    skipped = []
    if len(scene.engine_pids) >= 2:
        chosen.insert(0, abort_while_an_engine_is_stopped)
    else:
        skipped.append("the Abort while an engine is stopped needs two engines or more")
    if scene.limits.max_in_flight_per_peer is not None:
        chosen.append(a_client_at_its_in_flight_limit)
    else:
        skipped.append("the per-peer in-flight attack needs --max-in-flight or --max-in-flight-per-peer")
    if scene.api_key is not None:
        chosen.append(keyless_watch_streams)
    else:
        skipped.append("the keyless Watch attack needs API keys")
    return chosen, skipped
