"""The worker processes of a tensor-parallel engine, and how rank 0 starts and watches them.

`dpgate engine --tensor-parallel-size T` is rank 0: the gRPC server, scheduler and sampler. It
creates the shared buffers, starts T - 1 workers (spawned, each given a `WorkerSpec` once), joins
the gloo group with them, and loads its own share of the model while they load theirs. A worker
then runs every step rank 0 publishes until told to stop.

Faults (issue 11): a worker that exits, or does not finish a step within the step timeout, is
reported through `on_failure` with a sentence naming its rank; rank 0 then kills the workers
(which breaks any collective it is blocked in, so in-flight calls end with a status) and the
server exits non-zero. A worker watches its parent and ends the moment rank 0 is gone, so none
outlives its engine. Workers are plain subprocesses (`python -m engines.runner.worker`), not
multiprocessing children: nothing of rank 0's main module or resource tracker is shared.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dpgate.ports import free_port
from engines.model.numerics import Numerics
from engines.model.source import ModelSource
from engines.parallel.comm import TensorParallelGroup
from engines.parallel.layers import use_tensor_parallel
from engines.parallel.plan import ParallelPlan
from engines.parallel.rank import BufferSizes, SharedNames, attach_context, create_buffers
from engines.runner.loader import LoadedModel, RankShard, load_for_serving

logger = logging.getLogger("dpgate.engine.parallel")
STEP_TIMEOUT_S = 30.0
MONITOR_INTERVAL_S = 0.25


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything a worker needs, sent once when it is spawned."""

    rank: int
    plan: ParallelPlan
    source: ModelSource
    numerics: Numerics
    max_model_len: int
    num_blocks: int
    block_size: int
    store_port: int
    names: SharedNames
    sizes: BufferSizes
    num_threads: int


def load_rank(source: ModelSource, numerics: Numerics, plan: ParallelPlan, rank: int, group: TensorParallelGroup,
              with_tokenizer: bool) -> LoadedModel:  # fmt: skip
    """A rank's share of the model on its kernels, wrapped in the tensor-parallel layers."""
    loaded = load_for_serving(source, numerics, RankShard(plan, rank), with_tokenizer=with_tokenizer)
    vocab_rows = plan.vocab_rows(loaded.config)
    use_tensor_parallel(loaded.model, loaded.config.vocab_size, rank * vocab_rows, group)
    return loaded


def _exit_with_parent(parent_pid: int) -> None:
    """A worker must not outlive its engine: when rank 0 is gone, end at once (even if blocked in
    a collective)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(MONITOR_INTERVAL_S)
        os._exit(1)

    threading.Thread(target=watch, name="dpgate-parent-watch", daemon=True).start()


def worker_main(spec: WorkerSpec, parent_pid: int) -> None:
    """A worker process: join the group, load this rank's share, run steps until shut down."""
    _exit_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group; rank 0 decides
    torch.set_num_threads(spec.num_threads)
    from engines.runner.model_runner import ModelRunner  # after the thread count is set

    group = TensorParallelGroup(spec.rank, spec.plan.tp_size, spec.store_port)
    loaded = load_rank(spec.source, spec.numerics, spec.plan, spec.rank, group, with_tokenizer=False)
    context = attach_context(spec.plan, spec.rank, group, spec.names, spec.sizes)
    runner = ModelRunner(loaded, spec.max_model_len, spec.num_blocks, spec.block_size, parallel=context)
    group.barrier()  # every rank attached: rank 0 may unlink the shared-memory names
    with torch.inference_mode():
        while (inputs := context.record.read()) is not None:
            runner.run(inputs)
            context.heartbeats[spec.rank, 0] = context.record.epoch
    group.close()


def spawn_worker(spec: WorkerSpec) -> subprocess.Popen:
    """`python -m engines.runner.worker`, given its spec (pickled, once) on standard input."""
    process = subprocess.Popen([sys.executable, "-m", "engines.runner.worker"], stdin=subprocess.PIPE)
    assert process.stdin is not None
    process.stdin.write(pickle.dumps((spec, os.getpid())))
    process.stdin.close()
    return process


class WorkerGroup:
    """Rank 0's side: starts the workers, joins them, and watches them for the engine's life."""

    def __init__(self, plan: ParallelPlan, source: ModelSource, numerics: Numerics, max_model_len: int,
                 num_blocks: int, block_size: int, sizes: BufferSizes, num_threads: int,
                 step_timeout_s: float = STEP_TIMEOUT_S):  # fmt: skip
        self.plan = plan
        self.step_timeout_s = step_timeout_s
        self.arenas = create_buffers(plan, sizes)
        record, heartbeats, exchanges = self.arenas
        names = SharedNames(record.name, heartbeats.name, tuple(arena.name for arena in exchanges))
        port = free_port()  # the group's rendezvous port, below the ephemeral range: dpgate/ports.py
        specs = [
            WorkerSpec(rank, plan, source, numerics, max_model_len, num_blocks, block_size, port, names, sizes,
                       num_threads)
            for rank in range(1, plan.tp_size)
        ]
        self.processes = [spawn_worker(spec) for spec in specs]
        self.group = TensorParallelGroup(0, plan.tp_size, port)
        self.context = attach_context(plan, 0, self.group, names, sizes, self.arenas)
        self.context.watchdog = self.step
        self.step_started: float | None = None
        self.failure: str | None = None
        self.on_failure: Callable[[str], None] | None = None
        self._stopping = False
        self._monitor = threading.Thread(target=self._watch, name="dpgate-tp-monitor", daemon=True)

    def ready(self) -> None:
        """Every rank loaded and attached: drop the shared-memory names, start watching."""
        self.group.barrier()
        for arena in (self.arenas[0], self.arenas[1], *self.arenas[2]):
            arena.unlink()
        self._monitor.start()

    # --- faults -------------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stopping and self.failure is None:
            for rank, process in enumerate(self.processes, start=1):
                if process.poll() is not None:
                    return self._fail(f"tensor parallel rank {rank} (pid {process.pid}) exited with status "
                                      f"{process.returncode}")  # fmt: skip
            started = self.step_started
            if started is not None and time.monotonic() - started > self.step_timeout_s:
                epoch = self.context.record.epoch
                lagging = [r for r in range(1, self.plan.tp_size) if int(self.context.heartbeats[r, 0]) < epoch]
                who = f"rank {lagging[0]}" if lagging else "a rank"
                return self._fail(f"tensor parallel {who} did not finish step {epoch} within {self.step_timeout_s:g} s")
            time.sleep(MONITOR_INTERVAL_S)
        return None

    def _fail(self, reason: str) -> None:
        self.failure = reason
        logger.error("%s; stopping the engine", reason)
        self.kill()
        if self.on_failure is not None:
            self.on_failure(reason)

    def step(self, run: Callable[[], object]) -> object:
        """Run one step under the watchdog."""
        self.step_started = time.monotonic()
        try:
            return run()
        finally:
            self.step_started = None

    # --- shutdown -----------------------------------------------------------------------------
    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
        for process in self.processes:
            process.wait()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Tell the workers to stop and wait for them; kill whoever lingers."""
        self._stopping = True
        if self.failure is None:
            try:
                self.context.record.shutdown()
            except RuntimeError:  # the group is broken already (a worker died meanwhile)
                logger.warning("could not tell the workers to stop; killing them")
        deadline = time.monotonic() + timeout
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.0, deadline - time.monotonic()))
        self.kill()
        self.group.close()
