"""The workload stage: each workload called with a Target, in a thread of its own with the
workload budget as its deadline. A workload that has not returned by then is WORKLOAD_TIMEOUT
and is abandoned (a daemon thread: it cannot hold the runner, and stopping the children ends
whatever calls it still has open). A child that exits meanwhile is ENGINE_FAILED; a workload
that raises HostsUnavailable (it needs what these hosts cannot do) is INFRA; one that fails or
raises anything else is ACCURACY_GATE, and the remaining workloads still run for their figures.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dpgate.e2e.bringup import check_children
from dpgate.e2e.children import Child
from dpgate.e2e.contracts import FailureClass, GateResult, Hosts, HostsUnavailable, Target
from dpgate.e2e.plan import Plan
from dpgate.e2e.stages import StageFailure
from dpgate.e2e.verdict import RunRecord, WorkloadRecord
from dpgate.e2e.workloads import Workload, resolve

POLL_S = 0.1


@dataclass(slots=True)
class _Outcome:
    result: GateResult | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


def make_target(plan: Plan, hosts: Hosts, children: list[Child], deadline: float, log: Callable[[str], None]) -> Target:
    return Target(
        gateway=plan.gateway.endpoint,
        engines=tuple(spec.endpoint for spec in plan.engines),
        topology=plan.settings.topology,
        deadline=deadline,
        processes={child.name: child.process.pid for child in children},
        hosts=hosts,
        health_interval_s=plan.settings.health_interval_s,
        log=log,
        gateway_metrics_port=plan.gateway_metrics_port,
    )


def run_one(name: str, workload: Workload, target: Target, children: list[Child], budget_s: float) -> GateResult:
    """Run `workload(target)` until it returns or target.deadline; raises StageFailure on a
    timeout or a child's exit."""
    outcome = _Outcome()

    def call() -> None:
        try:
            outcome.result = workload(target)
        except BaseException as error:  # (a workload's crash is its result, reported below)
            outcome.error = error
        finally:
            outcome.done.set()

    threading.Thread(target=call, name=f"workload-{name}", daemon=True).start()
    while not outcome.done.wait(POLL_S):
        check_children(children, f"during workload {name}")
        if time.monotonic() >= target.deadline:
            raise StageFailure(
                FailureClass.WORKLOAD_TIMEOUT,
                f"workload {name} did not return within its budget of {budget_s:g}s; abandoned",
            )
    if isinstance(outcome.error, HostsUnavailable):  # e.g. the fault stage on hosts without links
        raise StageFailure(FailureClass.INFRA, f"workload {name}: {outcome.error}")
    if outcome.error is not None:
        return GateResult(name, False, detail=f"raised {type(outcome.error).__name__}: {outcome.error}")
    if not isinstance(outcome.result, GateResult):
        return GateResult(name, False, detail=f"returned {type(outcome.result).__name__}, not a GateResult")
    return outcome.result


def run_workloads(
    plan: Plan, hosts: Hosts, children: list[Child], record: RunRecord, log: Callable[[str], None] = print
) -> str:
    """Every workload in turn; appends each one's record; raises StageFailure for the first failure class."""
    budget = plan.settings.budgets.workload_s
    failed: list[str] = []
    for name in plan.settings.workloads:
        started = time.monotonic()
        target = make_target(plan, hosts, children, started + budget, lambda line, name=name: log(f"[{name}] {line}"))
        try:
            result = run_one(name, resolve(name), target, children, budget)
        except StageFailure as failure:
            unfinished = GateResult(name, False, detail=failure.detail)
            record.workloads.append(WorkloadRecord(unfinished, time.monotonic() - started, budget))
            raise
        record.workloads.append(WorkloadRecord(result, time.monotonic() - started, budget))
        log(f"workload {name}: {'passed' if result.passed else 'FAILED'} {result.figures} {result.detail}".rstrip())
        if not result.passed:
            failed.append(f"{name}: {result.detail or 'failed'}")
    if failed:
        raise StageFailure(FailureClass.ACCURACY_GATE, "; ".join(failed))
    return f"{len(plan.settings.workloads)} workloads passed"
