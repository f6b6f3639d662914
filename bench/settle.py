"""Wait for the machine to go quiet before the next system is measured.

Benchmarks here run two servers one after the other on a 2-core machine. A server can keep
working after its last response (vLLM's CPU build burns a whole core for about a second after a
16-request batch), and whatever runs next is measured against that. Waiting until the machine's
CPU is idle gives each system the machine the other one had.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

IDLE_FRACTION_OF_A_CORE = 0.1  # busy CPU below which the machine counts as quiet
WINDOW_S = 0.5


def busy_and_total_ticks() -> tuple[int, int]:
    """CPU ticks of every core since boot: (busy, total), from /proc/stat's first line."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


async def until_quiet(timeout_s: float = 15.0) -> float:
    """Return after a WINDOW_S in which the machine used under a tenth of one core; the seconds waited."""
    started = time.monotonic()
    cores = max(1, len(Path("/proc/stat").read_text().split("\ncpu")) - 1)
    while time.monotonic() - started < timeout_s:
        busy_before, total_before = busy_and_total_ticks()
        await asyncio.sleep(WINDOW_S)
        busy_after, total_after = busy_and_total_ticks()
        elapsed = total_after - total_before
        if elapsed and (busy_after - busy_before) / elapsed * cores < IDLE_FRACTION_OF_A_CORE:
            break
    return time.monotonic() - started
