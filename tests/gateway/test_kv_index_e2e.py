"""The gateway's exact index against two real engines: after 1,000 random requests on small KV
caches (evictions all along), with one engine killed and restarted mid-way, the index equals the
union of the engines' cached sets (each engine's own fresh WatchKvEvents snapshot); an engine that
goes away drops out of it."""

from __future__ import annotations

import asyncio
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from dpgate.v1 import control_pb2 as cpb
from dpgate.v1 import control_pb2_grpc, generate_pb2_grpc
from dpgate.v1 import generate_pb2 as pb
from gateway.config import GatewayConfig, validate_config
from gateway.engine_pool import EnginePool
from gateway.metrics import GatewayMetrics
from tests.support.gateway_processes import EngineProcess
from tests.tiny_model import make_tiny_llama_dir


class SmallCacheEngine(EngineProcess):
    """An engine with 48 KV blocks, so random traffic evicts all the time."""

    def command(self) -> list[str]:
        return [*super().command(), "--num-kv-blocks", "48", "--max-model-len", "256"]


def cached_set(address: str) -> tuple[str, set[int]]:
    """The engine's incarnation and cached block hashes, from a fresh subscription's snapshot."""
    with grpc.insecure_channel(address) as channel:
        call = control_pb2_grpc.ControlServiceStub(channel).WatchKvEvents(cpb.WatchKvEventsRequest())
        first = next(iter(call))
        call.cancel()
    return first.incarnation_id, {block.block_hash for block in first.snapshot.blocks}


def send(address: str, prompts: list[list[int]]) -> None:
    with grpc.insecure_channel(address) as channel, ThreadPoolExecutor(4) as pool:
        stub = generate_pb2_grpc.InferenceServiceStub(channel)
        stopping = pb.StoppingCriteria(max_tokens=2, ignore_eos=True)

        def one(prompt: list[int]) -> None:
            stub.Generate(pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompt), stopping=stopping), timeout=120)

        list(pool.map(one, prompts))


async def until(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.1)
    return False


def test_index_equals_the_engines_cached_sets_through_traffic_and_a_restart(tmp_path: Path):
    model_dir = make_tiny_llama_dir(tmp_path / "tiny", seed=9)
    engines = [SmallCacheEngine(model_dir, rank, 2, tmp_path) for rank in range(2)]
    rng = random.Random(7)
    prefixes = [[rng.randrange(100, 40000) for _ in range(64)] for _ in range(6)]
    prompts = [
        rng.choice(prefixes)[: rng.randrange(1, 65)] + [rng.randrange(100, 40000) for _ in range(rng.randrange(20))]
        for _ in range(1000)
    ]
    for engine in engines:
        engine.start()
    try:
        for engine in engines:
            engine.wait_serving(180)
        asyncio.run(_drive(engines, prompts))
    finally:
        for engine in engines:
            engine.stop()


async def _drive(engines: list[SmallCacheEngine], prompts: list[list[int]]) -> None:
    loop = asyncio.get_running_loop()
    addresses = [engine.address for engine in engines]
    config = validate_config(GatewayConfig(engines=tuple(addresses), health_interval_s=0.3, health_timeout_s=0.3))
    pool = EnginePool(config, GatewayMetrics())
    await pool.start()
    index = pool.kv_index

    seen: list[str] = []

    async def matches() -> bool:
        for address in addresses:
            _, blocks = await loop.run_in_executor(None, cached_set, address)
            if index.blocks_of(address) != blocks:
                states = pool.kv_watch.states
                seen[:] = [f"{address}: index {index.num_blocks(address)}, engine {len(blocks)}, {states}"]
                return False
        return True

    try:
        assert await until(lambda: _true(all(pool.kv_watch.is_watching(a) for a in addresses)))

        def traffic(part: list[list[int]]) -> None:
            with ThreadPoolExecutor(2) as both:
                list(both.map(send, addresses, [part[0::2], part[1::2]]))

        await loop.run_in_executor(None, traffic, prompts[:500])
        assert await until(matches), f"index differs from the engines' cached sets: {seen}"
        old_incarnation, old_blocks = await loop.run_in_executor(None, cached_set, addresses[1])
        assert len(old_blocks) > 10

        await loop.run_in_executor(None, engines[1].kill)  # mid-way: everything it held is void
        assert await until(lambda: _true(index.num_blocks(addresses[1]) == 0))
        engines[1].start()
        await loop.run_in_executor(None, engines[1].wait_serving, 180)
        await loop.run_in_executor(None, traffic, prompts[500:])
        assert await until(matches), f"index differs from the engines' cached sets after the restart: {seen}"
        new_incarnation, _ = await loop.run_in_executor(None, cached_set, addresses[1])
        assert new_incarnation != old_incarnation
        assert pool.kv_watch.states[addresses[1]].incarnation_id == new_incarnation
        union = set().union(*(index.blocks_of(a) for a in addresses))
        for block_hash in union:
            assert index.holders(block_hash) == {a for a in addresses if block_hash in index.blocks_of(a)}

        await loop.run_in_executor(None, engines[0].stop)  # an engine that leaves drops out
        assert await until(lambda: _true(addresses[0] not in index.addresses()))
        assert index.num_blocks(addresses[1]) > 0
    finally:
        await pool.close()


async def _true(value: bool) -> bool:
    return value
