"""The adversarial workload's decisions without a deployment: which scenarios a gateway's flags
allow, the refusal off loopback, and how streams' endings are judged."""

from __future__ import annotations

import time

import pytest

from dpgate.e2e import adversarial_gateway as scenario
from dpgate.e2e.adversarial import scene_of
from dpgate.e2e.adversarial_gateway import GatewayLimits, Scene, scenarios
from dpgate.e2e.contracts import HostsUnavailable, Target, Topology
from dpgate.e2e.gateway_attacks import Ending


def target(gateway: str = "127.0.0.1:5000", engines: int = 2) -> Target:
    processes = {"gateway": 10} | {f"engine-{rank}": 20 + rank for rank in range(engines)}
    addresses = tuple(f"127.0.0.1:{6000 + rank}" for rank in range(engines))
    return Target(gateway, addresses, Topology(dp=engines), time.monotonic() + 60, processes, health_interval_s=0.5)


def test_the_runner_s_gateway_is_met_with_its_defaults_and_its_probe_timing():
    scene = scene_of(target())
    assert scene.engine_pids == (20, 21) and scene.gateway_pid == 10 and scene.port == 5000
    assert scene.limits == GatewayLimits(health_interval_s=0.5, health_timeout_s=0.5)
    assert scene.limits.detection_s == 3 * (0.5 + 0.5) + 0.5


def test_off_loopback_the_attackers_cannot_reach_the_gateway():
    with pytest.raises(HostsUnavailable, match="--hosts local"):
        scene_of(target("10.0.0.1:5000"))


def test_scenarios_that_need_flags_or_engines_are_skipped_with_a_reason():
    chosen, skipped = scenarios(Scene("127.0.0.1:1", 1, (2,)))
    assert scenario.abort_while_an_engine_is_stopped not in chosen
    assert scenario.a_client_at_its_in_flight_limit not in chosen and scenario.keyless_watch_streams not in chosen
    assert len(skipped) == 3
    limits = GatewayLimits(max_in_flight_per_peer=4)
    chosen, skipped = scenarios(Scene("127.0.0.1:1", 1, (2, 3), limits, api_key="k"))
    assert skipped == [] and len(chosen) == 7 and chosen[0] is scenario.abort_while_an_engine_is_stopped


def test_endings_are_judged_by_code_and_message():
    late = Ending(4, "the request message did not arrive within 2 s (--request-body-timeout)")
    refused = Ending(8, "this client is at its limit of 2 calls in flight (--max-in-flight-per-peer)")
    judge = scenario.judge_endings
    assert judge([{1: late, 3: late}], 2, 4, "--request-body-timeout") == []
    assert judge([{1: late}], 2, 4, "--request-body-timeout") == ["1 of 2 streams on a connection had no answer"]
    # Refused for the per-peer limit: right only where the gateway has one.
    assert judge([{1: late, 3: refused}], 2, 4, "--request-body-timeout", peer_limit=1) == []
    assert judge([{1: late, 3: refused}], 2, 4, "--request-body-timeout") != []
