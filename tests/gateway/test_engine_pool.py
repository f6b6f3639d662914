"""Outcome bookkeeping of the engine pool: which outcomes count against the breaker."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gateway.config import GatewayConfig, validate_config
from gateway.engine_pool import EnginePool
from gateway.handshake import EngineIdentity
from gateway.health_state import CircuitState
from gateway.metrics import GatewayMetrics


def run_with_pool(check) -> None:
    async def main() -> None:
        config = validate_config(GatewayConfig(engines=("127.0.0.1:1",), breaker_failure_threshold=3))
        pool = EnginePool(config, GatewayMetrics())
        engine = pool.engines[0]
        engine.accept(EngineIdentity(engine.address, 0, 1, "m"))
        try:
            check(pool, engine)
        finally:
            await pool.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNKNOWN,
    ],
)
def test_codes_that_do_not_blame_the_engine_never_open_the_breaker(code):
    def check(pool, engine):
        for _ in range(10):
            pool.record_outcome(engine, code.name)
        assert engine.breaker.state is CircuitState.CLOSED

    run_with_pool(check)


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.DATA_LOSS])
def test_engine_failures_open_the_breaker_and_a_success_closes_it(code):
    def check(pool, engine):
        for _ in range(3):
            pool.record_outcome(engine, code.name)
        assert engine.breaker.state is CircuitState.OPEN
        assert not pool.snapshot()[0].is_circuit_closed
        engine.breaker.open_seconds = 0
        assert pool.snapshot()[0].is_circuit_closed  # half open: let a call through
        pool.record_outcome(engine, "OK")
        assert engine.breaker.state is CircuitState.CLOSED

    run_with_pool(check)


def test_unavailable_wakes_the_watcher_for_an_immediate_probe():
    def check(pool, engine):
        assert not engine.wake.is_set()
        pool.record_outcome(engine, "UNAVAILABLE")
        assert engine.wake.is_set()

    run_with_pool(check)


def test_unconnected_engines_are_not_in_the_snapshot():
    def check(pool, engine):
        engine.identity = None
        assert pool.snapshot() == []

    run_with_pool(check)


def test_dp_size_and_routable_ranks_come_from_connected_engines():
    def check(pool, engine):
        assert pool.data_parallel_size == 1
        assert pool.routable_ranks() == set()  # handshaken but not yet probed healthy
        engine.health.record_success()
        engine.is_serving = True
        assert pool.routable_ranks() == {0}
        engine.is_serving = False  # reachable but NOT_SERVING (loading, draining)
        assert pool.routable_ranks() == set()
        engine.identity = None
        assert pool.data_parallel_size is None

    run_with_pool(check)
