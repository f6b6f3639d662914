"""What /proc says about the topology's processes: resident memory and whether each is still alive.

Read from /proc/PID/status, so it works for any process on this machine, network namespaces
included (they share the PID namespace); Linux only, like the rest of `dpgate e2e`.
"""

from __future__ import annotations

from pathlib import Path

MIB = 1 << 20


def _status(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.strip()
    return fields


def rss_bytes(pid: int) -> int:
    """VmRSS of `pid` in bytes (what it has resident now, shared pages included)."""
    kib = _status(pid)["VmRSS"].split()[0]
    return int(kib) * 1024


def rss_mib(processes: dict[str, int]) -> dict[str, float]:
    """VmRSS in MiB of each named process, rounded to 0.1 MiB."""
    return {name: round(rss_bytes(pid) / MIB, 1) for name, pid in processes.items()}


def is_alive(pid: int) -> bool:
    """True while `pid` exists and has not exited (a zombie has exited; its parent just has not reaped it)."""
    try:
        return _status(pid)["State"][:1] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, KeyError):
        return False


def dead(processes: dict[str, int]) -> list[str]:
    """The names of the processes that are no longer alive."""
    return [name for name, pid in processes.items() if not is_alive(pid)]
