"""One client cannot hurt another (issue 22), over real gRPC, on an engine alone and through
`dpgate serve` (gateway + engine, token-locked): while a background
client sends a small Generate every 0.1 s and probes health every 0.05 s, an adversarial client
sends poison sampling parameters, a prompt of millions of characters, a JSON schema nested 400
deep, NaN in chat_template_kwargs, 100,000 stop strings and request ids reused right after a
cancel. Each attack is refused with its own code (never INTERNAL) or gets only its own output;
the background client sees no failure and no stall, and health never leaves SERVING; through
the gateway, the engine's circuit breaker never leaves closed and the gateway never marks the
engine unhealthy (the poisons are the client's fault, never the engine's).

The figures (time to refuse each attack, the background's p99 during each) are printed with -s.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from dpgate.e2e.adversarial_engine import poisons, reuse_ids_after_cancel, send
from dpgate.e2e.neighbour import BACKGROUND_P99_BOUND_S, Background, rss_mb
from dpgate.v1 import generate_pb2_grpc
from tests.support.processes import free_port, running


def children_rss_mb(pid: int) -> float:
    """The engine's child processes (its grammar workers), together."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            total += rss_mb(int(child))
    return total


@dataclass
class Target:
    address: str
    engine_pid: int  # whose RSS is measured
    metrics_port: int | None = None  # the gateway's, when the calls go through one
    gateway_pid: int | None = None  # `dpgate serve` runs its gateway in its own process


def engine_pid_of(serve_pid: int) -> int:
    for task in Path(f"/proc/{serve_pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if b"engine" in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0"):
                return int(child)
    raise AssertionError("dpgate serve started no engine")


# Through the gateway only by default (it covers the engine too, plus the breaker and the engine
# lock); DPGATE_NEIGHBOURS_ENGINE_ALONE=1 adds the engine alone, for its own figures.
TARGETS = ["gateway", "engine"] if os.environ.get("DPGATE_NEIGHBOURS_ENGINE_ALONE") else ["gateway"]


@pytest.fixture(scope="module", params=TARGETS)
def target(request, tiny_model_dir):
    port = free_port()
    budget = ["--grammar-compile-timeout-s", "2"]
    if request.param == "engine":
        flags = ["engine", "--port", str(port), "--model", str(tiny_model_dir), *budget]
        with running(flags, port, timeout=180) as proc:
            yield Target(proc.address, proc.process.pid)
    else:
        metrics_port = free_port()
        flags = ["serve", "--port", str(port), "--model", str(tiny_model_dir), "--metrics-port", str(metrics_port)]
        with running([*flags, *budget], port, timeout=240) as proc:
            yield Target(proc.address, engine_pid_of(proc.process.pid), metrics_port, proc.process.pid)


def test_attacks_are_refused_and_the_neighbour_never_notices(target):
    pid = target.engine_pid
    with (
        grpc.insecure_channel(target.address) as channel,
        Background(target.address, target.metrics_port) as background,
    ):
        inference = generate_pb2_grpc.InferenceServiceStub(channel)
        time.sleep(1.0)
        rss_before = rss_mb(pid)
        gateway_before = rss_mb(target.gateway_pid) if target.gateway_pid else 0.0
        figures = []
        for poison in poisons(schema_depth=400):  # 400 deep outlasts the 2 s compile budget
            started = time.monotonic()
            problem = send(inference, poison)
            elapsed = time.monotonic() - started
            assert problem is None, problem
            time.sleep(0.3)  # let the neighbour's next calls land in this attack's window
            figures.append((poison.name, elapsed, background.p99_since(started)))

        started = time.monotonic()
        reused_ok = reuse_ids_after_cancel(inference, trials=8)
        figures.append(
            ("request_id reused after cancel (8 trials)", time.monotonic() - started, background.p99_since(started))
        )
        time.sleep(1.0)
        rss_after = rss_mb(pid)
        grammar_workers_mb = children_rss_mb(pid)
        gateway_after = rss_mb(target.gateway_pid) if target.gateway_pid else 0.0
    print(f"\n-- through the {'gateway' if target.metrics_port else 'engine alone'}")
    for name, elapsed, p99 in figures:
        print(f"{name}: answered in {elapsed * 1000:.0f} ms; background p99 {p99 * 1000:.0f} ms")
    latencies = [seconds for _, seconds in background.latencies]
    print(
        f"background: {len(latencies)} calls, {len(background.failures)} failures, "
        f"median {statistics.median(latencies) * 1000:.0f} ms; engine RSS {rss_before:.0f} -> {rss_after:.0f} MB "
        f"(+ its grammar worker processes {grammar_workers_mb:.0f} MB); gateway RSS {gateway_before:.0f} -> "
        f"{gateway_after:.0f} MB"
    )
    assert reused_ok == 8
    assert background.failures == []
    assert max(p99 for _, _, p99 in figures) < BACKGROUND_P99_BOUND_S, figures
    assert rss_after < rss_before + 300, (rss_before, rss_after)
    assert gateway_after < gateway_before + 100, (gateway_before, gateway_after)
