"""Hosts as Linux network namespaces: the gateway and each engine in a namespace of its own.

Every host gets a namespace and a veth pair; the root-namespace ends are ports of one bridge that
also holds the runner's address, so every host reaches every other host and the runner (the root
namespace) reaches every host, over real addresses on a private /24 no other route on the machine
covers. Only what crosses that bridge (gRPC) passes between gateway and engines.

Names: every namespace, veth and bridge carries this run's prefix (`dpg` + 6 random hex digits),
so two runs, or a run after a crashed one, never collide, and interface names stay within Linux's
15 characters (`dpg1a2b3cbr`, `dpg1a2b3ch12`). Teardown removes exactly what this object created,
in any state setup reached, and runs again at interpreter exit if the caller never got to it.

`cut(name)` sets the host's bridge-side veth down: its packets are dropped in silence (no RST, no
ICMP), as when a machine's cable is pulled or its switch port dies; `heal(name)` sets it up again
and the connections that survived resume. Needs root and `ip` (iproute2).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

from dpgate.e2e.contracts import HostsUnavailable

# Where /24s are looked for: 10.0.0.0/8's upper half, rarely used by container networks.
_POOL = ipaddress.ip_network("10.128.0.0/9")
# Serialises picking a subnet between runs on this machine (the chosen one is a route once the
# bridge has its address, so the next run sees it taken).
_LOCK_PATH = "/run/lock/dpgate-netns.lock"
_MAX_HOSTS = 250
_HOST_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")


@dataclass(frozen=True, slots=True)
class _Host:
    namespace: str  # the namespace's name, `PREFIX-NAME`
    outer: str  # the veth end in the root namespace, a port of the bridge
    inner: str  # the veth end inside the namespace
    address: str


def unavailable_reason() -> str | None:
    """Why netns hosts cannot be made here (not root, no `ip`), or None; for skips and preflight."""
    if os.geteuid() != 0:
        return "--hosts netns needs root (for ip netns and veth pairs); this process is not root"
    if _find_ip() is None:
        return "--hosts netns needs root and the `ip` command (iproute2), which is not installed"
    return None


def _find_ip() -> str | None:
    return shutil.which("ip") or next((p for p in ("/usr/sbin/ip", "/sbin/ip") if os.access(p, os.X_OK)), None)


class NetnsHosts:
    """The Hosts protocol (dpgate/e2e/contracts.py) on `ip netns` + veth + one bridge."""

    kind = "netns"

    def __init__(self, prefix: str | None = None) -> None:
        self.prefix = prefix or f"dpg{secrets.token_hex(3)}"
        if not re.fullmatch(r"[a-z0-9]{1,9}", self.prefix):
            raise ValueError(f"netns prefix {self.prefix!r} must be 1-9 lower-case letters or digits")
        self.bridge = f"{self.prefix}br"
        self.subnet: ipaddress.IPv4Network | None = None
        self._ip = _find_ip()
        self._hosts: dict[str, _Host] = {}
        # What exists now, in creation order: teardown removes exactly these.
        self._made_links: list[str] = []
        self._made_namespaces: list[str] = []
        self._at_exit = False

    # --- the protocol -------------------------------------------------------------------------

    def setup(self, names: list[str]) -> None:
        """One namespace per name, all on one bridge; raises HostsUnavailable with the reason it cannot."""
        reason = unavailable_reason()
        if reason is not None:
            raise HostsUnavailable(reason)
        if self._hosts or self._made_links or self._made_namespaces:
            raise ValueError("NetnsHosts.setup was already called; tear down and make a new NetnsHosts")
        if not names or len(set(names)) != len(names) or len(names) > _MAX_HOSTS:
            raise ValueError(f"host names must be 1 to {_MAX_HOSTS} distinct names, got {names!r}")
        for name in names:
            if not _HOST_NAME.fullmatch(name):
                raise ValueError(f"host name {name!r} must be lower-case letters, digits and '-' (at most 32)")
        if not self._at_exit:
            atexit.register(self.teardown)
            self._at_exit = True
        try:
            self._make(names)
        except BaseException:
            self.teardown()
            raise

    def address(self, name: str) -> str:
        return self._host(name).address

    @property
    def runner_address(self) -> str:
        """The root namespace's address on the bridge (what the hosts see the runner as)."""
        if self.subnet is None:
            raise RuntimeError("NetnsHosts.setup has not run")
        return str(self.subnet.network_address + 1)

    def namespace(self, name: str) -> str:
        return self._host(name).namespace

    def command(self, name: str, argv: list[str]) -> list[str]:
        host = self._host(name)
        assert self._ip is not None  # a host exists, so setup found `ip`
        return [self._ip, "netns", "exec", host.namespace, *argv]

    def cut(self, name: str) -> None:
        self._run("link", "set", self._host(name).outer, "down")

    def heal(self, name: str) -> None:
        self._run("link", "set", self._host(name).outer, "up")

    def teardown(self) -> None:
        """Remove the links (a veth's peer goes with it), the bridge, then the namespaces; idempotent."""
        for link in reversed(self._made_links):
            self._remove(["link", "delete", link], "Cannot find device")
        self._made_links.clear()
        for namespace in reversed(self._made_namespaces):
            self._remove(["netns", "delete", namespace], "No such file")
        self._made_namespaces.clear()
        self._hosts.clear()
        self.subnet = None
        if self._at_exit:
            atexit.unregister(self.teardown)
            self._at_exit = False

    # --- making -------------------------------------------------------------------------------

    def _make(self, names: list[str]) -> None:
        with _subnet_lock():
            self.subnet = self._free_subnet()
            self._run("link", "add", self.bridge, "type", "bridge")
            self._made_links.append(self.bridge)
            self._run("address", "add", f"{self.runner_address}/{self.subnet.prefixlen}", "dev", self.bridge)
        self._run("link", "set", self.bridge, "up")
        for index, name in enumerate(names):
            host = _Host(
                namespace=f"{self.prefix}-{name}",
                outer=f"{self.prefix}h{index}",
                inner=f"{self.prefix}n{index}",
                address=str(self.subnet.network_address + 2 + index),
            )
            self._run("netns", "add", host.namespace)
            self._made_namespaces.append(host.namespace)
            self._run("link", "add", host.outer, "type", "veth", "peer", "name", host.inner)
            self._made_links.append(host.outer)
            self._run("link", "set", host.inner, "netns", host.namespace)
            self._run("link", "set", host.outer, "master", self.bridge)
            self._run("link", "set", host.outer, "up")
            inside = ("-n", host.namespace)
            self._run(*inside, "address", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", host.inner)
            self._run(*inside, "link", "set", host.inner, "up")
            self._run(*inside, "link", "set", "lo", "up")
            self._hosts[name] = host

    def _free_subnet(self) -> ipaddress.IPv4Network:
        """A /24 of the pool that overlaps no address or route in the root namespace."""
        taken = self._networks_in_use()
        candidates = list(_POOL.subnets(new_prefix=24))
        start = secrets.randbelow(len(candidates))  # spread runs out; the lock makes the check safe
        for candidate in candidates[start:] + candidates[:start]:
            if not any(candidate.overlaps(network) for network in taken):
                return candidate
        raise HostsUnavailable(f"netns hosts found no free /24 in {_POOL}: every one overlaps a route here")

    def _networks_in_use(self) -> list[ipaddress.IPv4Network]:
        networks = []
        for args in (("-4", "-o", "address", "show"), ("-4", "route", "show", "table", "all")):
            for word in self._run(*args).split():
                with contextlib.suppress(ValueError):
                    if word[0].isdigit():
                        network = ipaddress.ip_network(word, strict=False)
                        if network.prefixlen > 0:  # `default` is not a word we match, 0.0.0.0/0 is
                            networks.append(network)
        return networks

    def _host(self, name: str) -> _Host:
        host = self._hosts.get(name)
        if host is None:
            raise KeyError(f"no netns host named {name!r}; hosts: {sorted(self._hosts)}")
        return host

    def _run(self, *args: str) -> str:
        assert self._ip is not None
        result = subprocess.run([self._ip, *args], capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            message = result.stderr.strip() or f"exit status {result.returncode}"
            if "Operation not permitted" in message:
                raise HostsUnavailable(
                    f"--hosts netns needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN): `ip {' '.join(args)}`: {message}"
                )
            raise HostsUnavailable(f"netns hosts: `ip {' '.join(args)}` failed: {message}")
        return result.stdout

    def _remove(self, args: list[str], gone: str) -> None:
        """Remove one object; one that is already gone is fine, anything else is said and skipped."""
        assert self._ip is not None
        result = subprocess.run([self._ip, *args], capture_output=True, text=True, timeout=30)
        if result.returncode != 0 and gone not in result.stderr:
            print(f"netns teardown: `ip {' '.join(args)}` failed: {result.stderr.strip()}", flush=True)


@contextlib.contextmanager
def _subnet_lock() -> Iterator[None]:
    directory = os.path.dirname(_LOCK_PATH)
    path = _LOCK_PATH if os.path.isdir(directory) else "/tmp/dpgate-netns.lock"
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
