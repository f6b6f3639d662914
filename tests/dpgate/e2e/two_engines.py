"""A gateway in front of two real tiny-model `dpgate engine` processes, shaped for the load and fuzz
workloads, and the `Target` that points a workload at them."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dpgate.e2e.contracts import Target, Topology
from tests.support.gateway_processes import EngineProcess, GatewayProcess

# 1,000 streams split over two ranks put ~500 on each at once: a queue deeper than the default 256
# (more would be RESOURCE_EXHAUSTED, the engine's documented back-pressure, not what load tests),
# and a wider batch so the round is not 30 steps of 32.
LOAD_ENGINE_FLAGS = ("--max-waiting", "1024", "--max-num-seqs", "128", "--kv-cache-memory-mb", "64")


# The gateway keeps its default health probing (1 s interval and timeout, 3 failures): the tests'
# usual 0.25 s with one failure calls a busy engine dead on a loaded 2-core machine.


class LoadEngine(EngineProcess):
    """A real engine on the tiny model with LOAD_ENGINE_FLAGS."""

    def command(self) -> list[str]:
        return [*super().command(), *LOAD_ENGINE_FLAGS]


@dataclass
class TwoEngines:
    gateway: GatewayProcess
    engines: list[EngineProcess]
    model_dir: Path

    def target(self, budget_s: float) -> Target:
        """A target whose deadline is `budget_s` from now."""
        processes = {"gateway": self.gateway.process.pid}
        for engine in self.engines:
            assert engine.process is not None
            processes[f"engine-{engine.rank}"] = engine.process.pid
        return Target(
            gateway=self.gateway.address,
            engines=tuple(engine.address for engine in self.engines),
            topology=Topology(dp=2, model=str(self.model_dir)),
            deadline=time.monotonic() + budget_s,
            processes=processes,
            health_interval_s=1.0,
        )


@contextlib.contextmanager
def two_engines(model_dir: Path, log_dir: Path) -> Iterator[TwoEngines]:
    """Both engines start side by side and are stopped side by side (SIGTERM to both, then the waits:
    each takes seconds to shut down)."""
    engines = [LoadEngine(model_dir, rank, 2, log_dir) for rank in (0, 1)]
    gateway = None
    try:
        for engine in engines:
            engine.start()
        for engine in engines:
            engine.wait_serving()
        gateway = GatewayProcess([engine.address for engine in engines], log_dir=log_dir)
        gateway.wait_ranks([0, 1])
        yield TwoEngines(gateway, engines, model_dir)
    finally:
        if gateway is not None:
            gateway.stop()
        for engine in engines:
            if engine.process is not None and engine.process.poll() is None:
                engine.process.terminate()
        for engine in engines:
            engine.stop()  # waits for the exit (SIGKILL after 15 s)
