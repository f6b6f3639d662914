"""What one run will do, decided before anything starts: the settings from the flags and the plan
(every child's host, address, port, command line and log file). `--dry-run` prints the plan; the
launch stage runs exactly it, so what was printed is what runs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import dpgate
from dpgate.e2e.contracts import Hosts, Topology
from dpgate.host import usable_cores
from dpgate.ports import free_port

# The import root of this dpgate: children import the same code the runner does.
SOURCE_ROOT = Path(dpgate.__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Budgets:
    """Seconds each stage may take; the workload budget applies to each workload on its own."""

    preflight_s: float = 120.0
    launch_s: float = 30.0
    bringup_s: float = 300.0
    workload_s: float = 600.0


@dataclass(frozen=True, slots=True)
class RunSettings:
    """One topology's run as the flags asked for it."""

    topology: Topology
    hosts: str
    workloads: tuple[str, ...]
    budgets: Budgets
    run_dir: Path
    gateway_port: int | None = None
    engine_base_port: int | None = None
    model_sha256: str | None = None
    kv_cache_memory_mb: int = 512
    health_interval_s: float = 0.5


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """One process to start: `argv` as it runs on host `host` (not yet wrapped by Hosts.command)."""

    name: str
    address: str
    port: int
    argv: tuple[str, ...]
    log_path: Path

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port}"


@dataclass(frozen=True, slots=True)
class Plan:
    settings: RunSettings
    engines: tuple[ChildSpec, ...]
    gateway: ChildSpec
    gateway_metrics_port: int | None = None  # its Prometheus metrics (the adversarial workload reads them)

    @property
    def children(self) -> tuple[ChildSpec, ...]:
        """In start order: engines first (they load side by side), then the gateway."""
        return (*self.engines, self.gateway)


def host_names(topology: Topology) -> list[str]:
    return ["gateway", *(f"engine-{rank}" for rank in range(topology.dp))]


# Enough queue for the load workload's 1,000 concurrent streams on a single engine (DP=1).
ENGINE_MAX_WAITING = 1024


def threads_per_engine(dp: int) -> int:
    """Engines on one machine share its cores, as `dpgate serve` shares them."""
    return max(1, usable_cores() // dp)


def engine_argv(settings: RunSettings, rank: int, address: str, port: int) -> tuple[str, ...]:
    topology = settings.topology
    threads = threads_per_engine(topology.dp)
    argv = [
        sys.executable, "-m", "dpgate", "engine", "--host", address, "--port", str(port),
        "--model", topology.model,
        "--tensor-parallel-size", str(topology.tp), "--decode-context-parallel-size", str(topology.dcp),
        "--data-parallel-rank", str(rank), "--data-parallel-size", str(topology.dp),
        "--kv-cache-memory-mb", str(settings.kv_cache_memory_mb), "--num-threads", str(threads),
        # The load workload holds 1,000 streams over the engines at once: queue them, not refuse them.
        "--max-waiting", str(ENGINE_MAX_WAITING),
    ]  # fmt: skip
    if topology.tp > threads:  # e.g. DP2 x TP2 on 2 cores: one thread per engine, two TP ranks each
        argv.append("--allow-oversubscribe")
    return tuple(argv)


def gateway_argv(
    settings: RunSettings, address: str, port: int, engines: list[str], metrics_port: int
) -> tuple[str, ...]:
    interval = str(settings.health_interval_s)
    argv = [
        sys.executable, "-m", "dpgate", "gateway", "--host", address, "--port", str(port),
        "--metrics-port", str(metrics_port),
        "--health-interval", interval, "--health-timeout", interval,
        # The runner stops the gateway only after the workloads: nothing is left to drain.
        "--drain-grace", "0", "--shutdown-timeout", "5",
    ]  # fmt: skip
    for engine in engines:
        argv += ["--engine", engine]
    return tuple(argv)


def make_plan(settings: RunSettings, hosts: Hosts) -> Plan:
    """Ports: the flags' if given (preflight checks them), else free ones picked now."""
    engines = []
    for rank in range(settings.topology.dp):
        name = f"engine-{rank}"
        port = free_port() if settings.engine_base_port is None else settings.engine_base_port + rank
        address = hosts.address(name)
        argv = engine_argv(settings, rank, address, port)
        engines.append(ChildSpec(name, address, port, argv, settings.run_dir / f"{name}.log"))
    address = hosts.address("gateway")
    port = free_port() if settings.gateway_port is None else settings.gateway_port
    metrics_port = free_port()
    argv = gateway_argv(settings, address, port, [engine.endpoint for engine in engines], metrics_port)
    gateway = ChildSpec("gateway", address, port, argv, settings.run_dir / "gateway.log")
    return Plan(settings, tuple(engines), gateway, metrics_port)


def describe(plan: Plan, hosts: Hosts) -> str:
    """The plan as `--dry-run` prints it: stages with budgets, then each child's host, address and command."""
    settings = plan.settings
    budgets = settings.budgets
    lines = [
        f"topology {settings.topology.name} on {settings.hosts} hosts; run dir {settings.run_dir}",
        f"stages: preflight {budgets.preflight_s:g}s, launch {budgets.launch_s:g}s, "
        f"bring-up {budgets.bringup_s:g}s, workload {budgets.workload_s:g}s each "
        f"({', '.join(settings.workloads) or 'none'}), verdict",
    ]
    for child in plan.children:
        command = " ".join(hosts.command(child.name, list(child.argv)))
        lines.append(f"  {child.name} on {child.endpoint} (log {child.log_path}): {command}")
    return "\n".join(lines)
