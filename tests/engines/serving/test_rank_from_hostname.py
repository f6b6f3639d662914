"""`--data-parallel-rank-from-hostname`: a StatefulSet pod's ordinal becomes its DP rank."""

from __future__ import annotations

import argparse

import pytest

from engines import config as engine_config
from engines.config import ConfigError, EngineConfig, add_engine_arguments, rank_from_hostname
from engines.serving import engine_command


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    return parser.parse_args(list(flags))


@pytest.mark.parametrize(
    ("hostname", "rank"),
    [("dpgate-engine-0", 0), ("dpgate-engine-7", 7), ("engine-12.dpgate-engine.default.svc.cluster.local", 12)],
)
def test_the_trailing_ordinal_of_the_first_label_is_the_rank(hostname, rank):
    assert rank_from_hostname(hostname) == rank


@pytest.mark.parametrize("hostname", ["vm", "dpgate-engine", "dpgate-engine-", "dpgate-engine-01", "engine-1a", ""])
def test_a_hostname_without_an_ordinal_is_refused_naming_the_flag(hostname):
    with pytest.raises(ConfigError, match=r"^--data-parallel-rank-from-hostname: hostname .* does not end in -N"):
        rank_from_hostname(hostname)


def test_the_flag_reads_the_hostname(monkeypatch):
    monkeypatch.setattr(engine_config.socket, "gethostname", lambda: "dpgate-engine-3")
    config = EngineConfig.from_args(parse("--data-parallel-rank-from-hostname", "--data-parallel-size", "4"))
    assert config.data_parallel_rank == 3
    config.validate()


def test_without_either_flag_the_rank_is_0():
    assert EngineConfig.from_args(parse()).data_parallel_rank == 0
    assert EngineConfig.from_args(parse("--data-parallel-rank", "1")).data_parallel_rank == 1


def test_an_ordinal_beyond_the_size_fails_validation(monkeypatch):
    monkeypatch.setattr(engine_config.socket, "gethostname", lambda: "dpgate-engine-2")
    config = EngineConfig.from_args(parse("--data-parallel-rank-from-hostname", "--data-parallel-size", "2"))
    with pytest.raises(ConfigError, match=r"--data-parallel-rank 2 must be in \[0, 1\]"):
        config.validate()


@pytest.mark.parametrize(
    ("flags", "hostname", "message"),
    [
        (
            ["--data-parallel-rank-from-hostname"],
            "vm",
            "dpgate engine: --data-parallel-rank-from-hostname: hostname 'vm' does not end in -N",
        ),
        (
            ["--data-parallel-rank-from-hostname", "--data-parallel-rank", "1"],
            "dpgate-engine-1",
            "dpgate engine: --data-parallel-rank and --data-parallel-rank-from-hostname cannot be given together",
        ),
    ],
)
def test_the_command_exits_2_with_one_sentence(monkeypatch, capsys, flags, hostname, message):
    monkeypatch.setattr(engine_config.socket, "gethostname", lambda: hostname)
    assert engine_command.run(parse(*flags)) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err
