"""A free loopback port for a child process to bind moments later.

The usual trick, bind port 0 and close, hands out a port from the kernel's ephemeral range, the
same range every outgoing connection takes its local port from. Between the close and the
child's bind, any connection (a gRPC channel, a health probe, a metrics scrape) may take that
port, and the child then fails with "Address already in use": one run of the suite lost a
gateway that way. Ports below the ephemeral range are never handed to connections, so a port
picked there stays free unless something binds it on purpose.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOWEST = 20000  # well above the registered services a developer machine tends to run
_ATTEMPTS = 64
_PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nothing holds now, outside the ephemeral range where one exists."""
    below = _ephemeral_start()
    if below > _LOWEST:
        for port in random.sample(range(_LOWEST, below), min(_ATTEMPTS, below - _LOWEST)):
            if _can_bind(host, port):
                return port
    with socket.socket() as sock:  # no room below the ephemeral range: take the kernel's pick
        sock.bind((host, 0))
        return sock.getsockname()[1]


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
