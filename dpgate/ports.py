"""A free loopback port for a child process to bind moments later.

The usual trick, bind port 0 and close, hands out a port from the kernel's ephemeral range, the
same range every outgoing connection takes its local port from. Between the close and the
child's bind, any connection (a gRPC channel, a health probe, a metrics scrape) may take that
port, and the child then fails with "Address already in use": one run of the suite lost a
gateway that way. Ports below the ephemeral range are never handed to connections, so a port
picked there stays free unless something binds it on purpose.

One thing still binds on purpose: the other children this process started. A port handed out is
free until its child binds it, seconds later for an engine that loads a model first, so a second
pick in between could hand out the same port again (one CI run lost an engine whose metrics port
another engine of the same test had bound). Ports handed out once are therefore never handed out
again by the same process.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

_LOWEST = 20000  # well above the registered services a developer machine tends to run
_ATTEMPTS = 64
_PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()  # tests pick ports from helper threads too


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nothing holds now, outside the ephemeral range where one exists."""
    with _handed_out_lock:
        port = _pick(host)
        _handed_out.add(port)
        return port


def _pick(host: str) -> int:
    below = _ephemeral_start()
    if below > _LOWEST:
        for port in random.sample(range(_LOWEST, below), min(_ATTEMPTS, below - _LOWEST)):
            if port not in _handed_out and _can_bind(host, port):
                return port
    for _ in range(_ATTEMPTS):  # no room below the ephemeral range: take the kernel's pick
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in _handed_out:
            return port
    raise OSError("no free port that this process has not handed out already")


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux's default where it cannot be read)."""
    try:
        return int(_PORT_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _can_bind(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True
