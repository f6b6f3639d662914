"""One client cannot hurt another at the front door (issue 22, items 7-9), over real sockets:
a gateway in front of two synthetic engines, a neighbour on 127.0.0.1 sending a small Generate
every 0.1 s and probing health every 0.05 s (dpgate/e2e/neighbour.py), and an attacker on
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

The scenarios are dpgate/e2e/adversarial_gateway.py's, the same `dpgate e2e --workload
adversarial` runs; here each meets a gateway started with small limits, so each takes seconds.
The synthetic engines stand in for real ones because every item here is the gateway's own
behaviour; their streamed deltas carry 4 KiB of text, so a stream nobody reads produces bytes
as fast as a busy deployment would. The figures are printed with -s.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dpgate.e2e import adversarial_gateway as scenario
from dpgate.e2e.adversarial_gateway import AttackPlan, GatewayLimits, Scene
from tests.support.gateway_processes import GatewayProcess, SyntheticEngineProcess, all_serving
from tests.support.health import poll_until_serving

KEY = "k-neighbours"
# A synthetic engine streams without end; its deltas are large, so 5 s of unread streams is a lot.
PLAN = AttackPlan(never_read_max_tokens=10**7)
# Item 7 needs the stopped engine dropped at its first failed probe (its Abort's channel is closed
# then); a probe timeout of 1 s, not FAST_HEALTH's 0.25 s, keeps a busy machine from failing rank
# 0's probes too.
DEFAULTS = GatewayLimits()  # the gateway's own
QUICK_HEALTH = GatewayLimits(health_interval_s=1.0, health_timeout_s=1.0, failure_threshold=1)


def health_flags(limits: GatewayLimits) -> tuple[str, ...]:
    return (
        "--health-interval", str(limits.health_interval_s), "--health-timeout", str(limits.health_timeout_s),
        "--failure-threshold", str(limits.failure_threshold),
    )  # fmt: skip


@pytest.fixture(scope="module")
def engines(log_dir: Path) -> Iterator[list[SyntheticEngineProcess]]:
    pair = [SyntheticEngineProcess(rank, 2, log_dir, "--delta-chars", "4096") for rank in (0, 1)]
    with all_serving(pair) as serving:
        yield serving


@pytest.fixture
def scene_with(engines, log_dir: Path):
    """`scene_with(limits, *flags, api_key=None)`: a gateway in front of both engines started with
    `limits` as flags (plus `flags`), once its health says SERVING and, without API keys, a call
    pinned to each rank succeeded; returned as the Scene the scenarios attack."""
    started: list[GatewayProcess] = []

    def start(limits: GatewayLimits = DEFAULTS, *flags: str, api_key: str | None = None) -> Scene:
        keys = ("--api-key", api_key) if api_key else ()
        gateway = GatewayProcess(
            [e.address for e in engines],
            *health_flags(limits),
            *flags,
            *keys,
            log_dir=log_dir,
            name="gateway-neighbours",
        )
        started.append(gateway)
        poll_until_serving(gateway.address, timeout=30, process=gateway.process, interval=0.1)
        if api_key is None:
            gateway.wait_ranks([0, 1])
        pids = tuple(engine.process.pid for engine in engines if engine.process is not None)
        return Scene(gateway.address, gateway.process.pid, pids, limits, gateway.metrics_port, api_key)

    yield start
    for gateway in started:
        gateway.stop()


def check(result: scenario.AttackResult) -> None:
    print(f"\n{result.line}")
    assert result.passed, result.problems


def test_an_unpinned_abort_while_an_engine_is_stopped_finishes(scene_with):
    check(scenario.abort_while_an_engine_is_stopped(scene_with(QUICK_HEALTH), PLAN))


def test_multi_megabyte_bodies_without_end_stream_are_ended_at_the_deadline(scene_with):
    limits = GatewayLimits(request_body_timeout_s=2)
    check(scenario.bodies_without_end_stream(scene_with(limits, "--request-body-timeout", "2"), PLAN))


def test_thousands_of_headers_only_streams_are_freed(scene_with):
    limits = GatewayLimits(request_body_timeout_s=2)
    check(scenario.headers_only_streams(scene_with(limits, "--request-body-timeout", "2"), PLAN))


def test_a_client_at_its_in_flight_limit_locks_nobody_else_out(scene_with):
    limits = GatewayLimits(max_in_flight_per_peer=20)  # half of --max-in-flight 40
    check(scenario.a_client_at_its_in_flight_limit(scene_with(limits, "--max-in-flight", "40"), PLAN))


def test_a_flood_of_idle_connections_leaves_room_for_others(scene_with):
    limits = GatewayLimits(max_connections_per_peer=16)
    scene = scene_with(limits, "--max-connections", "64", "--max-connections-per-peer", "16")
    check(scenario.idle_connection_flood(scene, PLAN))


def test_a_client_that_never_reads_cannot_fill_the_gateways_memory(scene_with):
    check(scenario.streams_never_read(scene_with(), PLAN))


def test_thousands_of_unauthenticated_watch_streams_are_refused(scene_with):
    check(scenario.keyless_watch_streams(scene_with(api_key=KEY), PLAN))
