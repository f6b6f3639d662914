"""The front door's limit flags: defaults a public front door can live with, refusals naming the flag."""

from __future__ import annotations

import argparse

import pytest

from gateway import gateway_command
from gateway.config import GatewayConfig
from gateway.front_door import front_door_limits
from gateway.http2 import frames as f
from tests.gateway.test_config_matrix import run_command

E = ["--engine", "127.0.0.1:50061"]

LIMIT_MATRIX = [
    ("streams zero", ["--max-concurrent-streams", "0"], "--max-concurrent-streams"),
    ("streams past 2^31-1", ["--max-concurrent-streams", str(2**31)], "--max-concurrent-streams"),
    ("header list too small", ["--max-header-list-size", "1023"], "--max-header-list-size"),
    ("header list too large", ["--max-header-list-size", str(16 << 20 | 1)], "--max-header-list-size"),
    ("hpack table negative", ["--hpack-table-size", "-1"], "--hpack-table-size"),
    ("hpack table too large", ["--hpack-table-size", "65537"], "--hpack-table-size"),
    ("connections zero", ["--max-connections", "0"], "--max-connections"),
    ("continuations zero", ["--max-continuation-frames", "0"], "--max-continuation-frames"),
    ("resets zero", ["--max-resets-per-second", "0"], "--max-resets-per-second"),
    ("header timeout zero", ["--header-timeout", "0"], "--header-timeout"),
    ("idle timeout negative", ["--idle-timeout", "-1"], "--idle-timeout"),
]


@pytest.mark.parametrize(("name", "argv", "flag"), LIMIT_MATRIX, ids=[row[0] for row in LIMIT_MATRIX])
def test_a_bad_limit_exits_2_naming_its_flag(name, argv, flag, capsys):
    status, err = run_command(gateway_command, [*E, *argv], capsys)
    assert status == 2, err
    assert len(err.splitlines()) == 1 and flag in err and "Traceback" not in err


def test_the_flags_reach_the_connections_limits():
    parser = argparse.ArgumentParser(prog="dpgate")
    gateway_command.add_arguments(parser)
    argv = [*E, "--max-concurrent-streams", "7", "--max-header-list-size", "2048", "--hpack-table-size", "0",
            "--max-continuation-frames", "3", "--max-resets-per-second", "9", "--max-connections", "11",
            "--header-timeout", "1.5", "--idle-timeout", "60"]  # fmt: skip
    config = gateway_command.config_from_args(parser.parse_args(argv))
    limits = front_door_limits(config)
    assert (limits.max_concurrent_streams, limits.max_header_list_size, limits.header_table_size) == (7, 2048, 0)
    assert (limits.max_continuation_frames, limits.max_resets_per_second) == (3, 9)
    assert (config.max_connections, config.header_timeout_s, config.idle_timeout_s) == (11, 1.5, 60.0)


def test_the_defaults():
    config = GatewayConfig(engines=())
    limits = front_door_limits(config)
    assert limits.max_concurrent_streams == 1000
    assert limits.max_header_list_size == 16 * 1024
    assert limits.header_table_size == f.DEFAULT_HEADER_TABLE_SIZE
    assert limits.max_continuation_frames == 32
    assert limits.max_resets_per_second == 200
    assert (config.max_connections, config.header_timeout_s, config.idle_timeout_s) == (4096, 10.0, 300.0)
