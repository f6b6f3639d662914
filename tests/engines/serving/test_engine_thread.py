"""The engine thread: every call on one thread, in order, results and errors handed back; the
async engine steps on the thread it is given (the one the model was loaded and warmed on)."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from engines.kv.block_manager import BlockManager
from engines.scheduling.scheduler import Scheduler, SchedulerConfig
from engines.serving.async_engine import AsyncEngine
from engines.serving.engine_thread import EngineThread


def test_calls_run_in_order_on_one_named_thread_and_errors_reach_the_caller():
    thread = EngineThread("dpgate-test")
    try:
        seen = [thread.submit(lambda i=i: (i, threading.current_thread())).result(5) for i in range(5)]
        assert [i for i, _ in seen] == list(range(5))
        assert {owner for _, owner in seen} == {thread.thread}
        assert thread.thread is not threading.current_thread()
        with open(f"/proc/self/task/{thread.thread.native_id}/comm") as comm:
            assert comm.read().strip() == "dpgate-test"  # its OpenMP workers inherit this name
        with pytest.raises(ZeroDivisionError):
            thread.submit(lambda: 1 / 0).result(5)
        assert thread.submit(lambda: "still serving").result(5) == "still serving"
    finally:
        thread.stop(timeout=5)
    assert not thread.thread.is_alive()


def test_torch_threads_set_on_the_engine_thread_hold_there():
    thread = EngineThread()
    try:
        before = thread.submit(torch.get_num_threads).result(5)
        thread.submit(torch.set_num_threads, 1).result(5)
        assert thread.submit(torch.get_num_threads).result(5) == 1
    finally:
        thread.submit(torch.set_num_threads, before).result(5)
        thread.stop(timeout=5)


class RecordingEngine:
    """An LLMEngine stand-in that records which thread steps it."""

    def __init__(self):
        self.step_threads: set[threading.Thread] = set()
        self.has_work = True
        self.num_running = self.num_waiting = 0
        self.kv_usage = 0.0
        self.block_manager = BlockManager(num_blocks=4, block_size=16)  # the bridge reports its counts
        self.scheduler = Scheduler(SchedulerConfig(), self.block_manager)  # its max_waiting bounds preparing

    def step(self):
        self.step_threads.add(threading.current_thread())
        self.has_work = False
        return []


def test_the_async_engine_steps_on_the_thread_the_model_was_loaded_on():
    thread = EngineThread()
    loaded_on = thread.submit(threading.current_thread).result(5)
    engine = RecordingEngine()

    async def scenario():
        async_engine = AsyncEngine(engine, asyncio.get_running_loop(), thread=thread)
        for _ in range(100):
            if engine.step_threads:
                break
            await asyncio.sleep(0.01)
        async_engine.shutdown()

    asyncio.run(scenario())
    assert engine.step_threads == {loaded_on}
    assert not thread.thread.is_alive()
