"""EnginePool.set_discovered: new addresses join, vanished ones retire after their calls in flight."""

from __future__ import annotations

import asyncio

from gateway.config import GatewayConfig, validate_config
from gateway.engine_pool import EnginePool
from gateway.handshake import EngineIdentity, check_engine
from gateway.metrics import GatewayMetrics

CONFIGURED = "127.0.0.1:1"


def run(check) -> None:
    async def main() -> None:
        # A long health interval: the watchers stay asleep, the test drives the pool by hand.
        config = validate_config(GatewayConfig(engines=(CONFIGURED,), health_interval_s=60, health_timeout_s=1))
        pool = EnginePool(config, GatewayMetrics())
        await pool.start()
        try:
            await check(pool)
        finally:
            await pool.close()

    asyncio.run(main())


def test_new_addresses_join_and_configured_engines_never_retire():
    async def check(pool: EnginePool) -> None:
        pool.set_discovered({"10.0.0.1:5", "10.0.0.2:5"})
        assert set(pool.by_address) == {CONFIGURED, "10.0.0.1:5", "10.0.0.2:5"}
        pool.set_discovered({CONFIGURED})
        assert sorted(pool.by_address) == [CONFIGURED]
        pool.set_discovered(set())
        assert sorted(pool.by_address) == [CONFIGURED]

    run(check)


def test_a_retired_engine_leaves_routing_at_once_and_closes_after_its_last_call():
    async def check(pool: EnginePool) -> None:
        pool.set_discovered({"10.0.0.1:5"})
        engine = pool.by_address["10.0.0.1:5"]
        engine.accept(EngineIdentity(engine.address, 1, 2, "m"))
        engine.num_in_flight = 1
        pool.set_discovered(set())
        assert "10.0.0.1:5" not in pool.by_address and engine not in pool.connected()
        assert pool.retiring == [engine]
        await asyncio.sleep(0.2)
        assert pool.retiring == [engine], "retired with a call still in flight"
        engine.num_in_flight = 0
        await asyncio.sleep(0.2)
        assert pool.retiring == []

    run(check)


def test_a_replacement_at_a_new_address_may_take_the_retired_engines_rank():
    async def check(pool: EnginePool) -> None:
        pool.set_discovered({"10.0.0.1:5"})
        old = pool.by_address["10.0.0.1:5"]
        old.accept(EngineIdentity(old.address, 1, 2, "m"))
        old.num_in_flight = 1  # still finishing calls
        pool.set_discovered({"10.0.0.9:5"})  # the pod came back with a new IP
        accepted = [engine.identity for engine in pool.connected() if engine.identity is not None]
        assert check_engine(EngineIdentity("10.0.0.9:5", 1, 2, "m"), accepted) is None
        old.num_in_flight = 0

    run(check)
