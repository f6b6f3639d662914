"""The stage runner: each stage runs with a time budget, is timed, and ends as passed or failed
with a FailureClass; once one fails the later ones are recorded as skipped.

The runner's own stages (preflight, launch, bring-up) poll with the deadline they are given, so
they return by it; a stage that still overruns fails with its timeout class. Workloads are other
people's code and are run apart (dpgate/e2e/workload_stage.py) so a hang cannot hang the runner.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dpgate.e2e.contracts import FailureClass
from dpgate.e2e.verdict import RunRecord, StageRecord

STAGES = ("preflight", "launch", "bring-up", "workload", "verdict")


class StageFailure(Exception):
    """A stage's failure: its class and one sentence (with log lines where a child died)."""

    def __init__(self, failure: FailureClass, detail: str) -> None:
        super().__init__(detail)
        self.failure, self.detail = failure, detail


class StageRunner:
    """Runs the stages of one RunRecord in order, recording each."""

    def __init__(self, record: RunRecord, log: Callable[[str], None] = print) -> None:
        self.record, self.log = record, log

    @property
    def failed(self) -> bool:
        return self.record.failure is not None

    def run(self, name: str, budget_s: float, stage: Callable[[float], str], timeout_class: FailureClass) -> bool:
        """Run `stage(deadline)` (it returns a one-line summary); False if it or an earlier stage failed."""
        if self.failed or self.record.interrupted:
            self.record.stages.append(StageRecord(name, "skipped", budget_s=budget_s))
            return False
        entry = StageRecord(name, "running", budget_s=budget_s)
        self.record.stages.append(entry)
        started = time.monotonic()
        try:
            entry.detail = stage(started + budget_s)
            entry.status = "passed"
        except StageFailure as failure:
            entry.status, entry.detail = "failed", failure.detail
            self.record.fail(failure.failure, f"{name}: {failure.detail}")
        except Exception as error:  # (a runner bug still ends in a verdict and a sentinel)
            entry.status, entry.detail = "failed", f"unexpected {type(error).__name__}: {error}"
            self.record.fail(FailureClass.INFRA, f"{name}: {entry.detail}")
        except KeyboardInterrupt:
            entry.status, entry.detail = "interrupted", "interrupted by a signal"
            self.record.interrupted = True
            self.record.detail = self.record.detail or f"{name}: interrupted by a signal"
            raise
        finally:
            entry.duration_s = time.monotonic() - started
        if entry.status == "passed" and entry.duration_s > budget_s:
            entry.status = "failed"
            entry.detail = f"took {entry.duration_s:.1f}s, over its budget of {budget_s:g}s"
            self.record.fail(timeout_class, f"{name}: {entry.detail}")
        self.log(f"stage {name}: {entry.status} in {entry.duration_s:.1f}s: {entry.detail}")
        return entry.status == "passed"
