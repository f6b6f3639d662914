"""The shapes every part of `dpgate e2e` agrees on: a topology, the hosts it runs on, the target a
workload or gate is pointed at, a gate's result and the failure classes a verdict names.

Plain data and one protocol, no grpc or torch, so the runner, the host placements (local or
network namespaces), the workloads and the accuracy gates are written and tested apart.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Topology:
    """One deployment: `dp` engines behind one gateway, each engine `tp` worker processes of which
    `dcp` split the KV cache's tokens (dcp divides tp), all serving `model` (a `--model` spec)."""

    dp: int = 1
    tp: int = 1
    dcp: int = 1
    model: str = "smollm2-135m-instruct"

    @property
    def name(self) -> str:
        return f"dp{self.dp}-tp{self.tp}-dcp{self.dcp}-{self.model}"

    @property
    def is_reference(self) -> bool:
        """DP=1, T=1, C=1: the topology every other one's greedy outputs must equal."""
        return self.dp == 1 and self.tp == 1 and self.dcp == 1


class FailureClass(enum.Enum):
    """Why a run failed, as the sentinel and the exit status name it (see dpgate/e2e/verdict.py)."""

    INFRA = "infra"  # the machine, not dpgate: a port taken, a model file missing, no root for netns
    ENGINE_FAILED = "engine-failed"  # a child process exited when it should not have
    BRINGUP_TIMEOUT = "bring-up-timeout"  # not every engine SERVING and handshaken within the budget
    WORKLOAD_TIMEOUT = "workload-timeout"  # a workload or gate did not finish within its budget
    ACCURACY_GATE = "accuracy-gate"  # it ran, and a gate's figures were outside their bounds


@dataclass(frozen=True, slots=True)
class Target:
    """What a workload or gate is pointed at: a running gateway in front of a running topology.

    `gateway` is HOST:PORT as the runner reaches it (127.0.0.1 locally, the gateway host's address
    with netns hosts); `engines[i]` is DP rank i's HOST:PORT; `deadline` is a time.monotonic() value
    by which the workload must have returned (it checks it; the runner also enforces it);
    `processes` maps each host name ("gateway", "engine-0", ...) to the PID of its main process
    (for memory figures from /proc); `hosts` is the placement, for workloads that cut a link;
    `gateway_metrics_port` is the port of the gateway's Prometheus metrics on its host, if any."""

    gateway: str
    engines: tuple[str, ...]
    topology: Topology
    deadline: float
    processes: dict[str, int] = field(default_factory=dict)
    hosts: Hosts | None = None
    health_interval_s: float = 1.0
    log: Callable[[str], None] = print
    gateway_metrics_port: int | None = None


@dataclass(frozen=True, slots=True)
class GateResult:
    """One workload's or gate's outcome: `figures` are JSON-serialisable numbers and short strings
    (they go into the sentinel as they are); `detail` is one sentence a human reads on failure."""

    name: str
    passed: bool
    figures: dict[str, Any] = field(default_factory=dict)
    detail: str = ""


class Hosts(Protocol):
    """Where the gateway and each engine run: one machine's loopback, or a network namespace each.

    Host names are the runner's: "gateway", "engine-0", "engine-1", ...; the gateway host must
    reach every engine host and the runner (the root namespace) must reach every host."""

    kind: str  # "local" or "netns"

    def setup(self, names: list[str]) -> None:
        """Make the hosts (a no-op locally); raises HostsUnavailable with the reason it cannot."""
        ...

    def address(self, name: str) -> str:
        """The IP address host `name` binds its servers to and the others reach it at."""
        ...

    def command(self, name: str, argv: list[str]) -> list[str]:
        """`argv` as it must be run to run on host `name` (e.g. wrapped in `ip netns exec`)."""
        ...

    def cut(self, name: str) -> None:
        """Take host `name` off the network (its link down) until heal(name)."""
        ...

    def heal(self, name: str) -> None:
        """Bring host `name`'s link back up."""
        ...

    def teardown(self) -> None:
        """Remove everything setup made; safe to call twice and after a failed setup."""
        ...


class HostsUnavailable(RuntimeError):
    """The hosts cannot be made here (e.g. netns needs root); the message says why. An INFRA failure,
    or a skip with that reason in tests."""
