"""The fault stage on real processes: a gateway and two synthetic engines, each in its own namespace.

Only gRPC crosses between them, over the hosts' addresses. The engines stream slowly (the fault's
semantics are the gateway's, not a model's), and the gateway probes fast so the cut is seen in
about a second: interval 0.3 s, timeout 0.2 s, two failed probes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from dpgate.e2e import fault
from dpgate.e2e.contracts import Target, Topology
from dpgate.e2e.fault import FaultPlan
from dpgate.e2e.netns import NetnsHosts
from tests.dpgate.e2e.netns_support import ip_names, needs_netns
from tests.support.gateway_processes import QUICK_DRAIN, ROOT, read_line, wait_ranks

INTERVAL, TIMEOUT, FAILURES = 0.3, 0.2, 2
ENGINE_PORT = 50051  # each host has its own ports: the same number on every namespace is fine


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")


@contextlib.contextmanager
def _started(argv: list[str], log: Path, marker: str) -> Iterator[str]:
    """Run `argv` until it prints `marker`; yields that line and stops the process by its PID on the way out.

    `ip netns exec` execs the command, so the PID is the server's own and SIGTERM reaches it."""
    with open(log, "a") as stderr:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True, env=_env(), cwd=ROOT)
    try:
        yield read_line(process, marker, timeout=30)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def test_the_fault_stage_refuses_a_target_it_cannot_cut() -> None:
    target = Target(gateway="127.0.0.1:1", engines=("127.0.0.1:2",), topology=Topology(), deadline=0.0)
    result = fault.run(target)
    assert not result.passed and "netns hosts" in result.detail


@needs_netns
def test_a_cut_engine_host_ends_its_streams_and_serves_again_after_heal(tmp_path: Path) -> None:
    before = ip_names()
    hosts = NetnsHosts()
    hosts.setup(["gateway", "engine-0", "engine-1"])
    try:
        engines = tuple(f"{hosts.address(f'engine-{rank}')}:{ENGINE_PORT}" for rank in (0, 1))
        with contextlib.ExitStack() as stack:
            for rank in (0, 1):
                name = f"engine-{rank}"
                argv = [sys.executable, str(ROOT / "bench" / "synthetic_engine.py"), "--host", hosts.address(name),
                        "--port", str(ENGINE_PORT), "--data-parallel-rank", str(rank), "--data-parallel-size", "2",
                        "--token-delay", "0.01"]  # fmt: skip
                stack.enter_context(_started(hosts.command(name, argv), tmp_path / f"{name}.log", "listening on"))
            argv = [sys.executable, "-m", "dpgate.cli", "gateway", "--host", hosts.address("gateway"),
                    "--port", "0", "--health-interval", str(INTERVAL), "--health-timeout", str(TIMEOUT),
                    "--failure-threshold", str(FAILURES), *QUICK_DRAIN,
                    *(flag for engine in engines for flag in ("--engine", engine))]  # fmt: skip
            log = tmp_path / "gateway.log"
            line = stack.enter_context(_started(hosts.command("gateway", argv), log, "listening on"))
            gateway = line.split("listening on ", 1)[1].split()[0].rstrip(",")
            wait_ranks(gateway, [0, 1])
            target = Target(
                gateway=gateway,
                engines=engines,
                topology=Topology(dp=2, model="synthetic"),
                deadline=time.monotonic() + 60,
                hosts=hosts,
                health_interval_s=INTERVAL,
            )
            plan = FaultPlan(failure_threshold=FAILURES, health_timeout_s=TIMEOUT, stream_tokens=400)
            result = fault.run(target, plan)
            print(result.figures)
            assert result.passed, f"{result.detail}; figures {result.figures}; gateway log: {log.read_text()[-3000:]}"
            assert result.figures["victim_streams"] >= plan.num_pinned
            assert result.figures["unpinned_succeeded_during_cut"] > 0
    finally:
        hosts.teardown()
    assert ip_names() == before
