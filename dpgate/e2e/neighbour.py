"""A neighbour for the adversarial workload and tests (issue 22): a well-behaved client that keeps
sending small calls and health probes while another client attacks, and records what it saw; and
the memory and CPU figures of the processes it shares a deployment with.

The adversarial workload (dpgate/e2e/adversarial.py), the engine-side tests
(tests/engines/serving/test_neighbours_e2e.py) and the gateway-side ones
(tests/gateway/test_gateway_neighbours_e2e.py) judge an attack by the same things: the
neighbour had no failure, its p99 latency during the attack stayed under a bound, and (through a
gateway whose metrics it can read) no breaker opened and no engine was marked unhealthy at any
probe.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dpgate.v1 import generate_pb2 as pb
from dpgate.v1 import generate_pb2_grpc

# The neighbour's p99 during an attack: generous, for a busy 2-core CI machine (load averages of
# 10-14 were seen while these ran); the stalls the fixes removed were 7-44 s on the engine, and
# a call held until the client gave up at the gateway.
BACKGROUND_P99_BOUND_S = 3.0


def scrape(port: int) -> dict[str, float]:
    """Prometheus samples of the server's metrics on 127.0.0.1:`port`, as {'name{labels}': value}."""
    return sample_values(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())


def sample_values(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {'name{labels}': value}, comments left out."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def rss_mb(pid: int) -> float:
    """VmRSS of `pid` in MB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time `pid` has used so far (/proc/PID/stat, clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime, stime; USER_HZ is 100 on Linux


class Background:
    """A neighbour: small calls and health probes, timed, on threads of its own.

    `metadata` goes with every call (an API key, a rank pin); the health probes carry none, as a
    load balancer's would. With the gateway's `metrics_port`, every probe also scrapes the
    gateway's view of its engines (only `ranks`' when given): a breaker that leaves closed or an
    engine marked unhealthy is a failure.
    """

    def __init__(
        self,
        address: str,
        metrics_port: int | None = None,
        *,
        metadata: Sequence[tuple[str, str]] = (),
        ranks: Sequence[int] | None = None,
    ) -> None:
        self.metrics_port = metrics_port
        self.metadata = tuple(metadata)
        self.rank_labels = None if ranks is None else tuple(f'rank="{rank}"' for rank in ranks)
        self.channel = grpc.insecure_channel(address)
        self.inference = generate_pb2_grpc.InferenceServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.stop = threading.Event()
        self.latencies: list[tuple[float, float]] = []  # (finished at, seconds)
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self._calls), threading.Thread(target=self._probes)]

    def __enter__(self) -> Background:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()
        self.channel.close()

    def _calls(self) -> None:
        request = pb.GenerateRequest(
            token_ids=pb.TokenIds(ids=[1, 5, 6, 7]), stopping=pb.StoppingCriteria(max_tokens=4, ignore_eos=True)
        )
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                reply = self.inference.Generate(request, timeout=30, metadata=self.metadata)
                if len(reply.token_ids) != 4:
                    self.failures.append(f"call: {len(reply.token_ids)} tokens")
            except grpc.RpcError as error:
                self.failures.append(f"call: {error.code().name} {error.details()}")
            self.latencies.append((time.monotonic(), time.monotonic() - started))
            self.stop.wait(0.1)

    def _probes(self) -> None:
        while not self.stop.is_set():
            try:
                status = self.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status
                if status != health_pb2.HealthCheckResponse.SERVING:
                    self.failures.append(f"health: {status}")
            except grpc.RpcError as error:
                self.failures.append(f"health: {error.code().name}")
            if self.metrics_port is not None:
                self._check_gateway_view()
            self.stop.wait(0.05)

    def _check_gateway_view(self) -> None:
        """The gateway's view of its engines: healthy, circuit closed (0), at every probe."""
        for name, value in scrape(self.metrics_port).items():
            if self.rank_labels is not None and not any(label in name for label in self.rank_labels):
                continue
            if name.startswith("dpgate_gateway_circuit_state{") and value != 0:
                self.failures.append(f"breaker: {name} = {value}")
            if name.startswith("dpgate_gateway_engine_healthy{") and value != 1:
                self.failures.append(f"engine health: {name} = {value}")

    def p99_since(self, since: float) -> float:
        window = sorted(seconds for at, seconds in self.latencies if at >= since)
        return window[min(len(window) - 1, int(0.99 * len(window)))] if window else 0.0

    def calls_since(self, since: float) -> int:
        return sum(1 for at, _ in self.latencies if at >= since)


class PeakRss:
    """Samples a process's RSS every 20 ms on a thread while the block runs; `peak` is the most seen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_mb(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_mb(self.pid))


class AttackWindow:
    """One attack's window: the neighbour's calls, and a process's RSS (peak sampled) and CPU.

    `with AttackWindow(name, pid, neighbour) as window:` reads the figures before (after half a
    second of the neighbour's calls warmed the process) and samples the peak; `settle()` after the
    attacker left waits for the process to free what it held and reads the figures after.
    """

    def __init__(self, name: str, pid: int, neighbour: Background) -> None:
        self.name, self.pid, self.neighbour = name, pid, neighbour
        self.peak = PeakRss(pid)
        self.p99 = 0.0
        self.calls = 0

    def __enter__(self) -> AttackWindow:
        time.sleep(0.5)
        self.rss_before, self.cpu_before = rss_mb(self.pid), cpu_seconds(self.pid)
        self.rss_after, self.cpu_after = self.rss_before, self.cpu_before
        self.started = time.monotonic()
        self.peak.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.peak.__exit__(*exc)

    def settle(self, seconds: float = 1.0) -> None:
        time.sleep(seconds)
        self.p99 = self.neighbour.p99_since(self.started)
        self.calls = self.neighbour.calls_since(self.started)
        self.rss_after, self.cpu_after = rss_mb(self.pid), cpu_seconds(self.pid)

    @property
    def cpu(self) -> float:
        return self.cpu_after - self.cpu_before

    def figures(self) -> dict[str, float | int]:
        return {
            "neighbour_calls": self.calls,
            "neighbour_failures": len(self.neighbour.failures),
            "neighbour_p99_ms": round(self.p99 * 1000),
            "rss_before_mb": round(self.rss_before),
            "rss_peak_mb": round(self.peak.peak),
            "rss_after_mb": round(self.rss_after),
            "cpu_s": round(self.cpu, 2),
        }

    def line(self, outcome: str) -> str:
        return (
            f"{self.name}: {outcome}; neighbour {self.calls} calls, p99 {self.p99 * 1000:.0f} ms, failures "
            f"{len(self.neighbour.failures)}; RSS {self.rss_before:.0f} -> peak {self.peak.peak:.0f} -> "
            f"{self.rss_after:.0f} MB, CPU {self.cpu:.2f} s"
        )

    def problems(self, p99_bound_s: float, rss_bound_mb: float) -> list[str]:
        """What the neighbour and the process's memory say went wrong (empty: nothing)."""
        found = [f"the neighbour saw {failure}" for failure in self.neighbour.failures[:3]]
        if self.p99 >= p99_bound_s:
            found.append(f"the neighbour's p99 was {self.p99:.2f} s (bound {p99_bound_s:g} s)")
        if self.rss_after >= self.rss_before + rss_bound_mb:
            before, after = self.rss_before, self.rss_after
            found.append(f"RSS stayed at {after:.0f} MB after the attack, from {before:.0f} (bound +{rss_bound_mb:g})")
        return found
