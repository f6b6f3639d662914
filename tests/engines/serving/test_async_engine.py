"""The async bridge hands a step's outputs to the event loop with one wake-up, whatever the batch."""

from __future__ import annotations

import asyncio
import threading

from engines.kv.block_manager import BlockManager
from engines.scheduling.scheduler import Scheduler, SchedulerConfig
from engines.scheduling.sequence import FinishReason, StepOutput
from engines.serving.async_engine import AsyncEngine


class OneStepEngine:
    """An engine core with one step of work: it finishes every request it was given at once."""

    def __init__(self) -> None:
        self.pending: list[tuple[int, str]] = []
        self.num_running = self.num_waiting = 0
        self.kv_usage = 0.0
        self.block_manager = BlockManager(num_blocks=4, block_size=16)  # the bridge reports its counts
        self.scheduler = Scheduler(SchedulerConfig(), self.block_manager)  # its max_waiting bounds preparing

    @property
    def has_work(self) -> bool:
        return len(self.pending) == 3  # step only once all three requests are in: one batch

    def add(self, seq) -> None:
        self.pending.append((seq.handle, seq.request_id))

    def step(self) -> list[StepOutput]:
        done, self.pending = self.pending, []
        return [StepOutput(handle, rid, "x", [1], [], finish_reason=FinishReason.LENGTH) for handle, rid in done]

    def abort(self, request_id: str) -> None:
        return None


class Seq:
    def __init__(self, handle: int, request_id: str) -> None:
        self.handle = handle
        self.request_id = request_id
        self.grammar_spec = None


def test_one_step_wakes_the_loop_once_for_all_its_outputs() -> None:
    loop = asyncio.new_event_loop()
    wake_ups = []
    real = loop.call_soon_threadsafe

    def counting(callback, *args):
        if threading.current_thread() is not threading.main_thread():
            wake_ups.append(callback)
        return real(callback, *args)

    loop.call_soon_threadsafe = counting
    bridge = AsyncEngine(OneStepEngine(), loop)

    async def one(handle: int, request_id: str) -> list[str]:
        return [output.text async for output in bridge.generate(Seq(handle, request_id))]

    async def three() -> list[list[str]]:
        return await asyncio.gather(one(1, "a"), one(2, "b"), one(3, "c"))

    try:
        assert loop.run_until_complete(three()) == [["x"], ["x"], ["x"]]
        assert len(wake_ups) == 1
    finally:
        bridge.shutdown()
        loop.close()
