"""`dpgate e2e --workload adversarial` (dpgate/e2e/adversarial.py) against a gateway in front of two
real tiny-model engines: every attack of issue 22 is refused or ended as documented while the
neighbour sees no failure, no breaker opens and no engine is marked unhealthy. The gateway has
API keys, --max-in-flight and small limits so that every scenario runs (the runner's own gateway
skips the per-peer in-flight and keyless Watch ones) and the body deadline passes in seconds; the
engines' compile budget is 2 s so the 400-deep schema is refused quickly. Figures print with -s.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from dpgate.e2e import adversarial
from dpgate.e2e.adversarial_gateway import AttackPlan, GatewayLimits, wait_rank
from dpgate.e2e.contracts import Target, Topology
from dpgate.e2e.workloads import resolve
from dpgate.v1 import control_pb2_grpc
from tests.support.gateway_processes import EngineProcess, GatewayProcess, all_serving
from tests.support.health import poll_until_serving

KEY = "k-adversarial"
LIMITS = GatewayLimits(request_body_timeout_s=2, max_connections_per_peer=16, max_in_flight_per_peer=20)
GATEWAY_FLAGS = (
    "--api-key", KEY, "--request-body-timeout", "2", "--max-connections", "64", "--max-connections-per-peer", "16",
    "--max-in-flight", "40",  # 20 per peer
    "--health-interval", "1", "--health-timeout", "1", "--failure-threshold", "3",
)  # fmt: skip


class BudgetedEngine(EngineProcess):
    """A tiny-model engine whose grammar compiles stop at 2 s (the 400-deep schema takes longer)."""

    def command(self) -> list[str]:
        return [*super().command(), "--grammar-compile-timeout-s", "2"]


@pytest.fixture(scope="module")
def target(tiny_model_dir: Path, log_dir: Path) -> Iterator[Target]:
    engines = [BudgetedEngine(tiny_model_dir, rank, 2, log_dir) for rank in (0, 1)]
    with all_serving(engines):
        addresses = [engine.address for engine in engines]
        gateway = GatewayProcess(addresses, *GATEWAY_FLAGS, log_dir=log_dir, name="gateway-adversarial")
        try:
            poll_until_serving(gateway.address, timeout=30, process=gateway.process, interval=0.1)
            with grpc.insecure_channel(gateway.address) as channel:
                control = control_pb2_grpc.ControlServiceStub(channel)
                for rank in (0, 1):
                    assert wait_rank(control, rank, [("authorization", f"Bearer {KEY}")], timeout=30)
            processes = {"gateway": gateway.process.pid}
            processes |= {f"engine-{e.rank}": e.process.pid for e in engines if e.process is not None}
            yield Target(
                gateway=gateway.address,
                engines=tuple(addresses),
                topology=Topology(dp=2, model=str(tiny_model_dir)),
                deadline=time.monotonic() + 600,
                processes=processes,
                health_interval_s=1.0,
                gateway_metrics_port=gateway.metrics_port,
            )
        finally:
            gateway.stop()


def test_the_adversarial_workload_is_the_registered_one():
    assert resolve("adversarial") is adversarial.run


def test_every_attack_is_refused_and_the_neighbour_never_notices(target: Target):
    lines: list[str] = []
    logged = dataclasses.replace(target, log=lines.append)
    result = adversarial.run(logged, AttackPlan(schema_depth=400), LIMITS, api_key=KEY)
    print("\n" + "\n".join(lines))
    assert result.passed, result.detail
    assert result.figures["skipped"] == []
    assert len(lines) == 7 + 1 + 7  # the poisons, the reused ids, the gateway-side scenarios
