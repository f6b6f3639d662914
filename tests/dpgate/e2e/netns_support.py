"""What the netns tests share: the skip, the names `ip` shows, and a TCP echo server on a host."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

from dpgate.e2e.contracts import HostsUnavailable
from dpgate.e2e.netns import NetnsHosts, unavailable_reason


def _probe() -> str | None:
    """Why netns hosts cannot be made here: not root, no `ip`, or (root in a container without
    CAP_NET_ADMIN/CAP_SYS_ADMIN) the kernel refusing; None when one host can be made and removed."""
    reason = unavailable_reason()
    if reason is not None:
        return reason
    hosts = NetnsHosts()
    try:
        hosts.setup(["probe"])
    except HostsUnavailable as error:
        return str(error)
    finally:
        hosts.teardown()
    return None


_REASON = _probe()
needs_netns = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")

# Answers each connection with the address it came from, then echoes what it is sent.
_ECHO_SERVER = """
import socket, sys, threading
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((sys.argv[1], 0))
server.listen()
print(server.getsockname()[1], flush=True)
def serve(conn, peer):
    conn.sendall(peer[0].encode() + b"\\n")
    while data := conn.recv(100):
        conn.sendall(data)
while True:
    threading.Thread(target=serve, args=server.accept(), daemon=True).start()
"""


def ip_names() -> set[str]:
    """Every namespace and link name in the root namespace, as `ip` lists them."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    names = {line.split()[0] for line in namespaces.splitlines() if line.strip()}
    names |= {line.split(":")[1].strip().split("@")[0] for line in links.splitlines() if line.strip()}
    return names


@contextlib.contextmanager
def echo_server(hosts: NetnsHosts, name: str) -> Iterator[int]:
    """An echo server bound to host `name`'s address; yields its port."""
    argv = hosts.command(name, [sys.executable, "-c", _ECHO_SERVER, hosts.address(name)])
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        yield int(process.stdout.readline())
    finally:
        process.kill()
        process.wait()


def connect_from(hosts: NetnsHosts, name: str | None, address: str, port: int, timeout: float = 1.0) -> str:
    """Connect from host `name` (None: the root namespace); the server's first line, or the error's name."""
    script = (
        "import socket, sys\n"
        "try:\n"
        "    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))\n"
        "    print(c.makefile().readline().strip())\n"
        "except OSError as error:\n"
        "    print(type(error).__name__)\n"
    )
    argv = [sys.executable, "-c", script, address, str(port), str(timeout)]
    if name is not None:
        argv = hosts.command(name, argv)
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout.strip()
