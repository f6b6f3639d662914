"""How many CPUs this process may use, for sharing them out among engines and ranks.

`os.cpu_count()` counts the host's CPUs. A process pinned to a few of them (`taskset`, a
container's cpuset, Kubernetes' static CPU manager) that starts that many OpenMP threads puts
several on one CPU, and every barrier then waits for a descheduled thread: a decode step on the
2-vCPU EPYC VM went from ~7 ms to 0.5-1.8 s that way. The affinity mask is what it may run on.
A CFS quota (a plain Kubernetes `limits.cpu`) does not show in the mask; give such an engine
`--num-threads` equal to its limit.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The CPUs in this process's affinity mask (the host's count where the platform has none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
