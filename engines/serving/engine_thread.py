"""The one thread of an engine process that runs torch: it loads the model, warms it up, measures
its threads and then steps the engine, so one OpenMP thread team does all of the process's work.

Why one thread: torch's CPU kernels (and dpgate's, through `at::parallel_for`) run on libgomp, and
libgomp keeps a separate worker team for every thread that opens a parallel region, for as long as
that thread lives. Its workers spin for a few milliseconds between regions (the fast path of a
step's hundreds of small regions) only while the threads of all teams together are no more than
the CPUs (`do_spin` in libgomp's config/linux/wait.h); past that they sleep on a futex and every
region pays a wake-up. Before this thread existed the model was loaded and warmed on an executor
thread and stepped on a second one: two teams of two threads on a 2-CPU machine, so every worker
slept between regions, and the served engine decoded at a third of its in-process speed (49 vs
174 tok/s at batch 1, Intel Xeon; reproduced on the 2-vCPU EPYC VM: a second thread's team
changes the rate whichever way the machine's load makes spinning good or bad). Nothing else in
the serving process may open parallel regions: the event loop and the grammar compiler's threads
only tokenize, compile grammars and move Python objects.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import queue
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_STOP = object()
_PR_SET_NAME = 15  # prctl(2): the calling thread's name, at most 15 bytes


def name_native_thread(name: str) -> None:
    """Give the calling thread `name` in the kernel too (top -H, /proc/PID/task/*/comm); the
    OpenMP workers it starts inherit it, so a thread listing shows whose team a worker is in."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


class EngineThread:
    """Runs submitted calls one after another on one long-lived thread, in submission order."""

    def __init__(self, name: str = "dpgate-engine"):
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._calls.put((future, fn, args))
        return future

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` on the engine thread and await its result from the event loop."""
        return await asyncio.wrap_future(self.submit(fn, *args))

    def is_current(self) -> bool:
        return threading.current_thread() is self.thread

    def stop(self, timeout: float) -> None:
        """Let the calls already submitted finish (up to `timeout` seconds), then end the thread."""
        self._calls.put(_STOP)
        self.thread.join(timeout)

    def _serve(self) -> None:
        name_native_thread(self.thread.name)
        while True:
            item = self._calls.get()
            if item is _STOP:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as error:  # handed to the caller, who decides what it means
                future.set_exception(error)
