"""One client cannot hurt another at the front door (issue 22, items 7-9), over real sockets:
a gateway in front of two synthetic engines, a neighbour on 127.0.0.1 sending a small Generate
every 0.1 s and probing health every 0.05 s (tests/support/neighbours.py), and an attacker on
127.0.0.2 (another client address to the gateway) that
- sends an unpinned Abort while an engine is stopped (SIGSTOP) for a few seconds (item 7: the
  Abort hung until the client gave up, 392 s);
- sends multi-MB request bodies without END_STREAM, thousands of headers-only streams, and holds
  its per-peer in-flight limit (item 8: bodies held with no deadline and copied quadratically,
  20,000 headers-only streams in flight for over 60 s, one client locking every other out);
- floods idle TCP connections, opens streams whose responses it never reads, and opens
  thousands of health Watch streams without a key while API keys are on (item 9: new clients
  could not connect, the gateway held 455 MB for a client that never read, Watch streams took it
  from 49 to 104 MB).
For each: the attack is refused or ended promptly, the neighbour has no failure and its p99
stays under a bound, no breaker opens and no engine is marked unhealthy at any probe, and the
gateway's RSS returns within a bound afterwards.

The synthetic engines stand in for real ones because every item here is the gateway's own
behaviour; their streamed deltas carry 4 KiB of text, so a stream nobody reads produces bytes
as fast as a busy deployment would. The figures are printed with -s.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from dpgate.v1 import control_pb2, control_pb2_grpc
from tests.gateway import gateway_attacks as attack
from tests.gateway.raw_grpc import RawCall, message
from tests.support.gateway_processes import (
    RANK_KEY,
    GatewayProcess,
    SyntheticEngineProcess,
    all_serving,
    generate_request,
)
from tests.support.health import poll_until_serving
from tests.support.neighbours import BACKGROUND_P99_BOUND_S, Background, PeakRss, cpu_seconds, rss_mb

BODIES_CPU_BOUND_S = 3.0  # measured 1.0-1.2 s on a busy 2-core machine
RSS_BOUND_MB = 100.0  # the gateway's growth that must not remain after an attack (455 MB before)
KEY = "k-neighbours"
GENERATE = "/dpgate.v1.InferenceService/Generate"
DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, UNAUTHENTICATED = 4, 8, 16


@pytest.fixture(scope="module")
def engines(log_dir: Path) -> Iterator[list[SyntheticEngineProcess]]:
    pair = [SyntheticEngineProcess(rank, 2, log_dir, "--delta-chars", "4096") for rank in (0, 1)]
    with all_serving(pair) as serving:
        yield serving


# Item 7 needs the stopped engine dropped at its first failed probe (its Abort's channel is closed
# then); a probe timeout of 1 s, not FAST_HEALTH's 0.25 s, keeps a busy machine from failing rank
# 0's probes too.
QUICK_HEALTH = ("--health-interval", "1", "--health-timeout", "1", "--failure-threshold", "1")
STOPPED_S = 4.0  # how long the engine stays unreachable: past one probe interval plus its timeout


@pytest.fixture
def start_gateway(engines, log_dir: Path):
    """`start_gateway(*flags, key=None)`: a gateway in front of both engines (the default health
    probing unless the flags say otherwise), once its health says SERVING and, without API keys,
    a call pinned to each rank succeeded."""
    started: list[GatewayProcess] = []

    def start(*flags: str, key: str | None = None) -> GatewayProcess:
        gateway = GatewayProcess([e.address for e in engines], *flags, log_dir=log_dir, name="gateway-neighbours")
        started.append(gateway)
        poll_until_serving(gateway.address, timeout=30, process=gateway.process, interval=0.1)
        if key is None:
            gateway.wait_ranks([0, 1])
        return gateway

    yield start
    for gateway in started:
        gateway.stop()


class Watched:
    """One attack's window: the neighbour's p99 and the gateway's RSS and CPU around it."""

    def __init__(self, name: str, gateway: GatewayProcess, background: Background) -> None:
        self.name, self.pid, self.background = name, gateway.process.pid, background
        self.peak = PeakRss(self.pid)

    def __enter__(self) -> Watched:
        time.sleep(0.5)  # the neighbour's first calls warm the gateway before "before" is read
        self.rss_before, self.cpu_before = rss_mb(self.pid), cpu_seconds(self.pid)
        self.started = time.monotonic()
        self.peak.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.peak.__exit__(*exc)

    def settle(self, seconds: float = 1.0) -> None:
        """After the attacker left: let the gateway free what it held, then read the figures."""
        time.sleep(seconds)
        self.p99 = self.background.p99_since(self.started)
        self.calls = self.background.calls_since(self.started)
        self.rss_after, self.cpu_after = rss_mb(self.pid), cpu_seconds(self.pid)

    def report(self, outcome: str) -> None:
        print(
            f"\n{self.name}: {outcome}; neighbour {self.calls} calls, p99 {self.p99 * 1000:.0f} ms, "
            f"failures {len(self.background.failures)}; gateway RSS {self.rss_before:.0f} -> peak "
            f"{self.peak.peak:.0f} -> {self.rss_after:.0f} MB, CPU {self.cpu_after - self.cpu_before:.2f} s"
        )

    def check(self) -> None:
        assert self.background.failures == [], self.background.failures
        assert self.p99 < BACKGROUND_P99_BOUND_S, (self.name, self.p99)
        assert self.rss_after < self.rss_before + RSS_BOUND_MB, (self.name, self.rss_before, self.rss_after)


def other_client_is_served(port: int) -> None:
    call = RawCall(port, GENERATE, source_host=attack.OTHER_CLIENT)
    call.send(message(generate_request(2).SerializeToString()))
    answer = call.finish(timeout=10)
    assert answer.status == 0, answer


def in_flight(gateway: GatewayProcess) -> float:
    return gateway.metrics()["dpgate_gateway_in_flight_requests"]


# --- item 7 -------------------------------------------------------------------------------------


def test_an_unpinned_abort_while_an_engine_is_stopped_finishes(engines, start_gateway):
    gateway = start_gateway(*QUICK_HEALTH)
    stopped = engines[1].process
    assert stopped is not None
    # The neighbour is rank 0's client: the stopped engine is rank 1, which the gateway must mark
    # unhealthy (that is how the Abort's channel gets closed under it).
    with (
        Background(gateway.address, gateway.metrics_port, metadata=[(RANK_KEY, "0")], ranks=[0]) as background,
        Watched("unpinned Abort while rank 1 is stopped", gateway, background) as watched,
        grpc.insecure_channel(gateway.address) as channel,
    ):
        control = control_pb2_grpc.ControlServiceStub(channel)
        os.kill(stopped.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as failed:
                control.Abort(control_pb2.AbortRequest(request_ids=["gone"]), timeout=30)
            elapsed = time.monotonic() - started
            time.sleep(max(0.0, STOPPED_S - elapsed))
        finally:
            os.kill(stopped.pid, signal.SIGCONT)
        gateway.wait_ranks([0, 1])  # rank 1 rejoins
        watched.settle()
    watched.report(f"answered {failed.value.code().name} in {elapsed * 1000:.0f} ms (client deadline 30 s)")
    # UNAVAILABLE naming rank 1: the Abort reached the stopped engine and was cut off with it.
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, failed.value
    assert failed.value.details() == "data parallel rank 1 is unavailable"
    assert elapsed < 5.0
    watched.check()


# --- item 8 -------------------------------------------------------------------------------------


def test_multi_megabyte_bodies_without_end_stream_are_ended_at_the_deadline(start_gateway):
    gateway = start_gateway("--request-body-timeout", "2")
    connections, streams, body_bytes = 10, 10, 3_900_000
    with Background(gateway.address, gateway.metrics_port) as background:
        with Watched(f"{connections * streams} bodies of 3.9 MB without END_STREAM", gateway, background) as watched:
            clients = attack.big_bodies_without_end(gateway.port, connections, streams, body_bytes)
            sent = time.monotonic() - watched.started
            endings = [attack.read_endings(c, attack.stream_ids(streams), timeout=15) for c in clients]
            ended = time.monotonic() - watched.started
        attack.close_all(clients)
        watched.settle()
    watched.report(f"sent in {sent:.1f} s, all ended {ended:.1f} s after the first byte (--request-body-timeout 2)")
    for each in endings:
        assert sorted(each) == attack.stream_ids(streams)
        for ending in each.values():
            assert ending.status == DEADLINE_EXCEEDED and "--request-body-timeout" in ending.message, ending
    # Collecting 390 MB costs about a second of the gateway's CPU; appending bytes to bytes (the
    # copy of the whole body per frame) cost 4.6 s here and 5.1 s in the issue.
    assert watched.cpu_after - watched.cpu_before < BODIES_CPU_BOUND_S
    watched.check()


def test_thousands_of_headers_only_streams_are_freed(start_gateway):
    gateway = start_gateway("--request-body-timeout", "2")
    connections, streams = 4, 1000
    with Background(gateway.address, gateway.metrics_port) as background:
        with Watched(f"{connections * streams} headers-only streams", gateway, background) as watched:
            clients = attack.headers_only(gateway.port, connections, streams)
            endings = [attack.read_endings(c, attack.stream_ids(streams), timeout=20) for c in clients]
            ended = time.monotonic() - watched.started
        left_in_flight = in_flight(gateway)
        attack.close_all(clients)
        watched.settle()
    watched.report(f"all ended {ended:.1f} s after the first (--request-body-timeout 2)")
    for each in endings:
        assert len(each) == streams
        assert {ending.status for ending in each.values()} == {DEADLINE_EXCEEDED}
    assert left_in_flight <= 1  # the neighbour's own call, at most
    watched.check()


def test_a_client_at_its_in_flight_limit_locks_nobody_else_out(start_gateway):
    gateway = start_gateway("--max-in-flight", "40", "--request-body-timeout", "30")  # per peer: 20
    with Background(gateway.address, gateway.metrics_port) as background:
        with Watched("one client asking for all 40 in-flight slots", gateway, background) as watched:
            holder = attack.headers_only(gateway.port, 1, 20)[0]
            time.sleep(0.3)
            started = time.monotonic()
            extra = attack.headers_only(gateway.port, 1, 20)[0]  # would fill --max-in-flight
            refused = attack.read_endings(extra, attack.stream_ids(20), timeout=10)
            refused_in = time.monotonic() - started
            other_client_is_served(gateway.port)
            held = in_flight(gateway)
        attack.close_all([holder, extra])
        watched.settle()
        after = in_flight(gateway)
    watched.report(f"20 held, 20 more refused in {refused_in * 1000:.0f} ms; another address served")
    assert len(refused) == 20
    for ending in refused.values():
        assert ending.status == RESOURCE_EXHAUSTED and "--max-in-flight-per-peer" in ending.message, ending
    assert 20 <= held <= 21  # the holder's 20, and perhaps the neighbour's call
    assert after <= 1  # its slots were freed when it left
    watched.check()


# --- item 9 -------------------------------------------------------------------------------------


def test_a_flood_of_idle_connections_leaves_room_for_others(start_gateway):
    gateway = start_gateway("--max-connections", "64", "--max-connections-per-peer", "16")
    with Background(gateway.address, gateway.metrics_port) as background:
        with Watched("64 idle TCP connections from one address", gateway, background) as watched:
            sockets = attack.idle_connections(gateway.port, 64)
            closed_at = attack.closed_by_gateway(sockets, timeout=5)
            refused_in = max(at for at in closed_at if at is not None) - watched.started
            other_client_is_served(gateway.port)
        attack.close_all(sockets)
        watched.settle()
    closed = sum(at is not None for at in closed_at)
    watched.report(f"{closed} of 64 closed by the gateway within {refused_in * 1000:.0f} ms; another address served")
    assert closed == 64 - 16  # --max-connections-per-peer
    watched.check()


def test_a_client_that_never_reads_cannot_fill_the_gateways_memory(start_gateway):
    gateway = start_gateway()
    connections, streams = 4, 2
    with Background(gateway.address, gateway.metrics_port) as background:
        with Watched(f"{connections * streams} streams never read", gateway, background) as watched:
            clients = attack.never_reading_streams(gateway.port, connections, streams)
            time.sleep(5.0)
        # The streams did flow: the first connection still has responses to read.
        seen = clients[0].read_until(lambda frame: frame.type == attack.f.DATA, timeout=5)
        attack.close_all(clients)
        watched.settle()
    watched.report("held for 5 s")
    assert seen.of_type(attack.f.DATA)
    assert watched.peak.peak < watched.rss_before + RSS_BOUND_MB, (watched.rss_before, watched.peak.peak)
    watched.check()


def test_thousands_of_unauthenticated_watch_streams_are_refused(start_gateway):
    gateway = start_gateway("--api-key", KEY, key=KEY)
    connections, streams = 4, 1000
    with Background(gateway.address, gateway.metrics_port, metadata=[("authorization", f"Bearer {KEY}")]) as background:
        with Watched(f"{connections * streams} health Watch streams without a key", gateway, background) as watched:
            clients = attack.unauthenticated_watches(gateway.port, connections, streams)
            endings = [attack.read_endings(c, attack.stream_ids(streams), timeout=20) for c in clients]
            refused_in = time.monotonic() - watched.started
        attack.close_all(clients)
        watched.settle()
    watched.report(f"all refused within {refused_in * 1000:.0f} ms")
    for each in endings:
        assert len(each) == streams
        assert {ending.status for ending in each.values()} == {UNAUTHENTICATED}
    assert watched.peak.peak < watched.rss_before + RSS_BOUND_MB
    watched.check()
