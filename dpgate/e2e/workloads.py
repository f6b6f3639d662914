"""The workloads `--workload NAME` can name: a registry of short names to "module:function", and
MODULE:FUNCTION for a user's own. Each function is `run(target: Target) -> GateResult`.

The runner calls workloads by name only and never branches on one, so a gate is added by adding
a row here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from dpgate.e2e.contracts import GateResult, Target

Workload = Callable[[Target], GateResult]

REGISTRY: dict[str, str] = {
    "smoke": "dpgate.e2e.smoke:run",
    "greedy-identity": "dpgate.e2e.gates.greedy_identity:run",
    "structured": "dpgate.e2e.gates.structured:run",
    "exact-match": "dpgate.e2e.gates.exact_match:run",
    "perplexity": "dpgate.e2e.gates.perplexity:run",
    "fault": "dpgate.e2e.fault:run",
    "load": "dpgate.e2e.load:run",
    "fuzz": "dpgate.e2e.fuzz:run",
    "adversarial": "dpgate.e2e.adversarial:run",
}


class WorkloadError(ValueError):
    """`--workload` names nothing that can be run; one sentence naming the value and the rule."""


def reference(name: str) -> str:
    """The "module:function" a --workload value stands for."""
    if name in REGISTRY:
        return REGISTRY[name]
    module, sep, function = name.partition(":")
    if not sep or not module or not function.isidentifier():
        known = ", ".join(REGISTRY)
        raise WorkloadError(f"--workload {name}: must be one of {known}, or MODULE:FUNCTION")
    return name


def resolve(name: str) -> Workload:
    """The callable behind `name`; raises WorkloadError if its module or function is missing."""
    module_name, _, function_name = reference(name).partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise WorkloadError(f"--workload {name}: cannot import module {module_name} ({error})") from error
    function = getattr(module, function_name, None)
    if not callable(function):
        raise WorkloadError(f"--workload {name}: module {module_name} has no function {function_name}")
    return function
