"""An engine's load in tokens, as cache-aware routing reads it: GetLoad's KV less what calls this
gateway saw end since then (their KV is cached-free in the engine, but the figure is up to one
health interval old), plus the prefill of calls still open."""

from __future__ import annotations

import asyncio
import time

from dpgate.v1 import control_pb2
from gateway.config import GatewayConfig, validate_config
from gateway.engine_pool import EnginePool
from gateway.handshake import EngineIdentity
from gateway.metrics import GatewayMetrics


def with_engine(check) -> None:
    async def main() -> None:
        pool = EnginePool(validate_config(GatewayConfig(engines=("127.0.0.1:1",))), GatewayMetrics())
        engine = pool.engines[0]
        engine.accept(EngineIdentity(engine.address, 0, 1, "m", kv_block_size=16))
        try:
            await check(engine)
        finally:
            await pool.close()

    asyncio.run(main())


def test_a_turn_that_just_ended_no_longer_counts_as_load():
    async def check(engine):
        engine.num_used_blocks = 100  # GetLoad: 1,600 tokens held, 1,000 of them by a call now ending
        engine.pending_prefill_tokens = 50
        assert engine.view(time.monotonic()).load_tokens == 1650
        engine.prompt_released(1000)
        assert engine.view(time.monotonic()).load_tokens == 650
        engine.prompt_released(5000)  # more than GetLoad counted (calls refused before running)
        assert engine.view(time.monotonic()).load_tokens == 50

    with_engine(check)


def test_getload_replaces_releases_made_before_it_was_asked_but_keeps_later_ones():
    async def check(engine):
        engine.prompt_released(300)

        async def get_load(request, timeout):
            engine.prompt_released(200)  # a call ends while GetLoad is on its way
            return control_pb2.GetLoadResponse(num_used_blocks=40)

        engine._get_load = get_load
        await engine.refresh_load(timeout=1.0)
        assert engine.released_tokens == 200
        assert engine.view(time.monotonic()).load_tokens == 40 * 16 - 200

    with_engine(check)
