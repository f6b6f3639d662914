"""One topology's run, stage by stage: preflight, launch, bring-up, workload, verdict. Whatever
happens — a failed stage, an exception, Ctrl-C or SIGTERM — every child started is stopped by its
process group and the hosts are torn down before the record is returned."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from dpgate.e2e.bringup import bring_up, check_children
from dpgate.e2e.children import Child, stop_all
from dpgate.e2e.contracts import FailureClass, Hosts, HostsUnavailable
from dpgate.e2e.launch import launch
from dpgate.e2e.local_hosts import make_hosts
from dpgate.e2e.plan import Plan, RunSettings, describe, host_names, make_plan
from dpgate.e2e.preflight import run_preflight
from dpgate.e2e.stages import StageFailure, StageRunner
from dpgate.e2e.verdict import RunRecord, StageRecord
from dpgate.e2e.workload_stage import run_workloads

VERDICT_BUDGET_S = 60.0
WORKLOAD_SLACK_S = 1.0


class _Run:
    """The state the stages share: the hosts once made, the plan, the children once started."""

    def __init__(self, settings: RunSettings, log: Callable[[str], None], dry_run: bool) -> None:
        self.settings, self.log, self.dry_run = settings, log, dry_run
        self.hosts: Hosts | None = None
        self.plan: Plan | None = None
        self.children: list[Child] = []

    def preflight(self, deadline: float) -> str:
        try:
            self.hosts = make_hosts(self.settings.hosts)
            self.hosts.setup(host_names(self.settings.topology))
        except HostsUnavailable as error:
            raise StageFailure(FailureClass.INFRA, str(error)) from error
        self.plan = make_plan(self.settings, self.hosts)
        if self.dry_run:
            self.log(describe(self.plan, self.hosts))
        return run_preflight(self.plan, self.hosts)

    def launch(self, deadline: float) -> str:
        assert self.plan is not None and self.hosts is not None
        try:
            return launch(self.plan, self.hosts, self.children)
        except OSError as error:
            raise StageFailure(FailureClass.INFRA, f"cannot start a child: {error}") from error

    def bring_up(self, deadline: float) -> str:
        assert self.plan is not None
        return bring_up(self.plan, self.children, deadline)

    def workloads(self, record: RunRecord) -> Callable[[float], str]:
        def stage(deadline: float) -> str:
            assert self.plan is not None and self.hosts is not None
            return run_workloads(self.plan, self.hosts, self.children, record, self.log)

        return stage

    def verdict(self, deadline: float) -> str:
        """The children must have lived through the workloads; then they are stopped."""
        check_children(self.children, "before the verdict")
        self.stop()
        return f"{len(self.children)} children stopped"

    def stop(self) -> None:
        stop_all(self.children)


def run_topology(settings: RunSettings, log: Callable[[str], None] = print, dry_run: bool = False) -> RunRecord:
    record = RunRecord(settings.topology, settings.hosts, str(settings.run_dir))
    run = _Run(settings, log, dry_run)
    stages = StageRunner(record, log)
    budgets = settings.budgets
    started = time.monotonic()
    try:
        stages.run("preflight", budgets.preflight_s, run.preflight, FailureClass.INFRA)
        if dry_run:
            for name in ("launch", "bring-up", "workload", "verdict"):
                record.stages.append(StageRecord(name, "skipped", detail="dry run: nothing launched"))
            return record
        stages.run("launch", budgets.launch_s, run.launch, FailureClass.INFRA)
        stages.run("bring-up", budgets.bringup_s, run.bring_up, FailureClass.BRINGUP_TIMEOUT)
        # Each workload has the workload budget; the stage their sum, plus the runner's polling.
        workload_budget = (budgets.workload_s + WORKLOAD_SLACK_S) * max(1, len(settings.workloads))
        stages.run("workload", workload_budget, run.workloads(record), FailureClass.WORKLOAD_TIMEOUT)
        stages.run("verdict", VERDICT_BUDGET_S, run.verdict, FailureClass.INFRA)
    except KeyboardInterrupt:  # in a stage (which recorded it) or between two
        record.interrupted = True
        record.detail = record.detail or "interrupted by a signal between stages"
        log(f"interrupted: stopping {len(run.children)} children")
    finally:
        _clean_up(run, record)
        record.duration_s = time.monotonic() - started
    return record


def _clean_up(run: _Run, record: RunRecord) -> None:
    """Stop the children, then tear the hosts down; a second Ctrl-C must not cut this short."""
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        run.stop()
        if run.hosts is not None:
            try:
                run.hosts.teardown()
            except Exception as error:  # (reported as the run's failure, not raised)
                record.fail(FailureClass.INFRA, f"teardown of {run.settings.hosts} hosts failed: {error}")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
