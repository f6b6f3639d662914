"""dpgate.ports.free_port: a bindable port, outside the range outgoing connections take theirs from."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dpgate import ports


def _ephemeral_range() -> tuple[int, int]:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low), int(high)


def _bind(port: int) -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    return sock


@pytest.mark.skipif(not Path("/proc/sys/net/ipv4/ip_local_port_range").exists(), reason="Linux only")
def test_the_port_is_below_the_ephemeral_range_and_bindable():
    low, _ = _ephemeral_range()
    for _ in range(20):
        port = ports.free_port()
        assert 20000 <= port < low
        _bind(port).close()


def test_a_taken_port_is_passed_over(monkeypatch, tmp_path):
    (tmp_path / "range").write_text("30000\t60999\n")
    monkeypatch.setattr(ports, "_PORT_RANGE_FILE", tmp_path / "range")
    with _bind(0) as holder:
        taken = holder.getsockname()[1]
        monkeypatch.setattr(ports.random, "sample", lambda population, k: [taken, *population[:k]])
        holder.listen()
        port = ports.free_port()
        assert port != taken and 20000 <= port < 30000


def test_without_room_below_the_ephemeral_range_the_kernel_picks(monkeypatch, tmp_path):
    (tmp_path / "range").write_text("1024 65535\n")
    monkeypatch.setattr(ports, "_PORT_RANGE_FILE", tmp_path / "range")
    _bind(ports.free_port()).close()
    monkeypatch.setattr(ports, "_PORT_RANGE_FILE", tmp_path / "missing")
    assert ports._ephemeral_start() == 32768


def test_a_port_handed_out_is_not_handed_out_again_before_its_child_binds_it(monkeypatch, tmp_path):
    # Two engines of one test pick their ports before either binds: the same draw twice must still
    # give two ports (a CI run lost an engine whose metrics port a sibling had bound first).
    (tmp_path / "range").write_text("30000\t60999\n")
    monkeypatch.setattr(ports, "_PORT_RANGE_FILE", tmp_path / "range")
    monkeypatch.setattr(ports, "_handed_out", set())
    monkeypatch.setattr(ports.random, "sample", lambda population, k: list(population[:k]))
    picked = [ports.free_port() for _ in range(10)]
    assert len(set(picked)) == 10
    assert all(20000 <= port < 30000 for port in picked)


def test_the_kernels_pick_is_not_repeated_either(monkeypatch, tmp_path):
    (tmp_path / "range").write_text("1024 65535\n")
    monkeypatch.setattr(ports, "_PORT_RANGE_FILE", tmp_path / "range")
    monkeypatch.setattr(ports, "_handed_out", set())
    first = ports.free_port()
    real_socket = socket.socket

    class SameKernelPick(real_socket):
        calls = 0

        def bind(self, address):
            SameKernelPick.calls += 1
            super().bind((address[0], first if SameKernelPick.calls == 1 else 0))

    monkeypatch.setattr(ports.socket, "socket", SameKernelPick)
    second = ports.free_port()
    assert second != first and SameKernelPick.calls >= 2
