"""Workloads for the runner's own tests, named as MODULE:FUNCTION: one that hangs, one that fails
its gate, one that raises, one that cuts a link, one that returns the wrong thing, one that passes."""

from __future__ import annotations

import time

from dpgate.e2e.contracts import GateResult, Target


def hangs(target: Target) -> GateResult:
    time.sleep(3600)
    return GateResult("hangs", True)


def fails(target: Target) -> GateResult:
    return GateResult("fails", False, {"score": 0.25, "threshold": 0.5}, "score 0.25 under the threshold 0.5")


def raises(target: Target) -> GateResult:
    raise ConnectionError("the gateway hung up")


def cuts_a_link(target: Target) -> GateResult:
    assert target.hosts is not None
    target.hosts.cut("engine-0")
    return GateResult("cuts_a_link", True)


def returns_none(target: Target) -> GateResult:
    return None  # type: ignore[return-value]


def passes(target: Target) -> GateResult:
    return GateResult("passes", True, {"engines": len(target.engines), "gateway": target.gateway})
