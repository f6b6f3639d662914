"""NetnsHosts on the real kernel: what setup makes, what teardown leaves, reachability, cut and heal."""

from __future__ import annotations

import socket
import subprocess

import pytest

from dpgate.e2e import netns
from dpgate.e2e.contracts import HostsUnavailable
from dpgate.e2e.netns import NetnsHosts
from tests.dpgate.e2e.netns_support import connect_from, echo_server, ip_names, needs_netns

NAMES = ["gateway", "engine-0", "engine-1"]


def test_without_root_setup_says_it_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    hosts = NetnsHosts()
    with pytest.raises(HostsUnavailable, match="needs root"):
        hosts.setup(NAMES)
    hosts.teardown()  # safe after a failed setup


def test_without_ip_setup_says_what_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns, "_find_ip", lambda: None)
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    with pytest.raises(HostsUnavailable, match="needs root and the `ip` command"):
        NetnsHosts().setup(NAMES)


def test_bad_names_and_prefixes_are_refused() -> None:
    with pytest.raises(ValueError, match="prefix"):
        NetnsHosts(prefix="Too-Long-Prefix")
    if netns.unavailable_reason() is None:
        with pytest.raises(ValueError, match="distinct"):
            NetnsHosts().setup(["engine-0", "engine-0"])
        with pytest.raises(ValueError, match="host name"):
            NetnsHosts().setup(["engine 0"])


@pytest.mark.e2e
@needs_netns
def test_setup_makes_prefixed_names_and_teardown_leaves_nothing() -> None:
    before = ip_names()
    hosts = NetnsHosts()
    hosts.setup(NAMES)
    try:
        made = ip_names() - before
        assert made, "setup made nothing"
        assert all(name.startswith(hosts.prefix) for name in made), made
        assert all(len(name) <= 15 for name in made if not name.startswith(f"{hosts.prefix}-")), made  # links
        assert {hosts.namespace(name) for name in NAMES} <= made
        assert hosts.bridge in made
        addresses = [hosts.address(name) for name in NAMES]
        assert len(set(addresses)) == len(NAMES)
        assert all(netns.ipaddress.ip_address(a).is_private for a in addresses)
        argv = hosts.command("engine-0", ["true"])
        assert argv[1:4] == ["netns", "exec", hosts.namespace("engine-0")] and argv[-1] == "true"
        # lo is up inside each namespace: a server on 127.0.0.1 there answers there
        inside = hosts.command("engine-1", ["ip", "-o", "link", "show", "lo"])
        assert "UP" in subprocess.run(inside, capture_output=True, text=True, check=True).stdout
    finally:
        hosts.teardown()
    assert ip_names() == before
    hosts.teardown()  # idempotent
    assert ip_names() == before


@pytest.mark.e2e
@needs_netns
def test_two_runs_side_by_side_get_their_own_names_and_subnets() -> None:
    first, second = NetnsHosts(), NetnsHosts()
    try:
        first.setup(["gateway", "engine-0"])
        second.setup(["gateway", "engine-0"])
        assert first.prefix != second.prefix
        assert first.subnet is not None and second.subnet is not None
        assert not first.subnet.overlaps(second.subnet)
    finally:
        first.teardown()
        second.teardown()


@pytest.mark.e2e
@needs_netns
def test_a_failed_setup_removes_what_it_made_and_nothing_else() -> None:
    hosts = NetnsHosts()
    squatter = f"{hosts.prefix}h1"  # not ours: the second host's veth cannot take this name
    subprocess.run(["ip", "link", "add", squatter, "type", "bridge"], check=True)
    try:
        before = ip_names()
        with pytest.raises(HostsUnavailable, match="failed"):
            hosts.setup(NAMES)
        assert ip_names() == before  # the bridge, the first namespace and veth are gone; the squatter stays
        assert squatter in ip_names()
    finally:
        subprocess.run(["ip", "link", "delete", squatter], check=True)


@pytest.mark.e2e
@needs_netns
def test_hosts_reach_each_other_and_the_runner_reaches_every_host() -> None:
    hosts = NetnsHosts()
    hosts.setup(NAMES)
    try:
        with echo_server(hosts, "engine-0") as port0, echo_server(hosts, "gateway") as port_gateway:
            engine0 = hosts.address("engine-0")
            # the server sees each client at its own host's address: real addresses, not loopback
            assert connect_from(hosts, "gateway", engine0, port0) == hosts.address("gateway")
            assert connect_from(hosts, "engine-1", engine0, port0) == hosts.address("engine-1")
            assert connect_from(hosts, None, engine0, port0) == hosts.runner_address
            assert connect_from(hosts, "engine-0", hosts.address("gateway"), port_gateway) == engine0
            # each namespace has its own loopback: engine-0's server is not on the gateway's 127.0.0.1
            assert connect_from(hosts, "gateway", "127.0.0.1", port0) == "ConnectionRefusedError"
    finally:
        hosts.teardown()


@pytest.mark.e2e
@needs_netns
def test_cut_drops_packets_silently_and_heal_restores_the_link() -> None:
    hosts = NetnsHosts()
    hosts.setup(["gateway", "engine-0"])
    try:
        with echo_server(hosts, "engine-0") as port:
            address = hosts.address("engine-0")
            survivor = socket.create_connection((address, port), timeout=2)
            survivor.makefile().readline()
            hosts.cut("engine-0")
            # no RST, no ICMP: a connect times out rather than being refused
            assert connect_from(hosts, "gateway", address, port, timeout=0.5) == "TimeoutError"
            survivor.sendall(b"during the cut\n")
            survivor.settimeout(0.5)
            with pytest.raises(TimeoutError):
                survivor.recv(100)
            hosts.heal("engine-0")
            assert connect_from(hosts, "gateway", address, port, timeout=2) == hosts.address("gateway")
            # the connection made before the cut lived through it: TCP retransmitted what was sent
            survivor.settimeout(5)
            assert survivor.recv(100) == b"during the cut\n"
            survivor.close()
    finally:
        hosts.teardown()
