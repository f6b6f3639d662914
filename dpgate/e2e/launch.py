"""Launch: the plan's engines, then its gateway, each through its host (Hosts.command) with its
own log file. Engines start first so they load their models side by side."""

from __future__ import annotations

from dpgate.e2e.children import Child, start
from dpgate.e2e.contracts import Hosts
from dpgate.e2e.plan import Plan


def launch(plan: Plan, hosts: Hosts, children: list[Child]) -> str:
    """Start every child, appending each to `children` as soon as it exists (so a failure part
    way still stops the ones already started)."""
    for spec in plan.children:
        children.append(start(spec, hosts.command(spec.name, list(spec.argv))))
    return ", ".join(f"{child.name} pid {child.process.pid}" for child in children)
