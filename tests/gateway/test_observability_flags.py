"""`--log-format` on gateway, serve and engine; serve's `--engine-metrics-port` (one port per rank)."""

from __future__ import annotations

import argparse

import pytest

from dpgate.cli import serve as serve_command
from engines.config import ConfigError as EngineConfigError
from engines.config import EngineConfig, add_engine_arguments
from gateway import gateway_command
from gateway.config import ConfigError as GatewayConfigError
from gateway.config import GatewayConfig, validate_config


def parse(module, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dpgate")
    module.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    ("argv", "log_format"), [([], "plain"), (["--log-format", "json"], "json"), (["--log-json"], "json")]
)
def test_gateway_and_serve_read_the_log_format_and_the_deprecated_flag(argv, log_format):
    assert gateway_command.config_from_args(parse(gateway_command, ["--engine", "127.0.0.1:1", *argv])).log_format == (
        log_format
    )
    assert serve_command.gateway_config(parse(serve_command, argv), [1001]).log_format == log_format


def test_the_access_log_is_on_unless_turned_off():
    gateway = ["--engine", "127.0.0.1:1"]
    assert gateway_command.config_from_args(parse(gateway_command, gateway)).access_log
    assert not gateway_command.config_from_args(parse(gateway_command, [*gateway, "--no-access-log"])).access_log
    assert not serve_command.gateway_config(parse(serve_command, ["--no-access-log"]), [1001]).access_log


def test_an_unknown_log_format_exits_2_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as info:
        parse(gateway_command, ["--log-format", "xml"])
    assert info.value.code == 2
    assert "argument --log-format: invalid choice: 'xml'" in capsys.readouterr().err


def test_a_log_format_set_in_code_is_validated_like_the_flag():
    with pytest.raises(GatewayConfigError, match=r"^--log-format xml must be one of plain, json\.$"):
        validate_config(GatewayConfig(engines=("127.0.0.1:1",), log_format="xml"))
    with pytest.raises(EngineConfigError, match=r"^--log-format xml must be one of plain, json$"):
        EngineConfig(log_format="xml").validate()


def test_the_engine_reads_its_log_format():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert EngineConfig.from_args(parser.parse_args(["--log-format", "json"])).log_format == "json"
    assert EngineConfig.from_args(parser.parse_args([])).log_format == "plain"


def test_serve_passes_the_log_format_and_a_metrics_port_per_rank_to_its_engines():
    args = parse(serve_command, ["--data-parallel-size", "2", "--log-format", "json", "--engine-metrics-port", "9100"])
    for rank in (0, 1):
        command = serve_command.engine_command(args, rank, 5000 + rank)
        assert command[command.index("--log-format") + 1] == "json"
        assert command[command.index("--metrics-port") + 1] == str(9100 + rank)
    assert "--metrics-port" not in serve_command.engine_command(parse(serve_command, []), 0, 5000)


def test_serve_shares_the_cpus_among_several_engines_and_lets_one_engine_measure_its_threads(monkeypatch):
    monkeypatch.setattr(serve_command, "usable_cores", lambda: 4)
    command = serve_command.engine_command(parse(serve_command, ["--data-parallel-size", "2"]), 1, 5001)
    assert command[command.index("--num-threads") + 1] == "2"
    assert "--num-threads" not in serve_command.engine_command(parse(serve_command, []), 0, 5000)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--engine-metrics-port", "65535"],
            "--engine-metrics-port 65535: ports 65535..65536 must lie within 1..65535.",
        ),
        (["--engine-metrics-port", "0"], "--engine-metrics-port 0: ports 0..1 must lie within 1..65535."),
        (
            ["--engine-metrics-port", "9100", "--metrics-port", "9101"],
            "--engine-metrics-port 9100: the engines' ports 9100..9101 include --metrics-port 9101.",
        ),
        (["--engine-metrics-port", "9100", "--port", "9100"], "the engines' ports 9100..9101 include --port 9100."),
    ],
)
def test_serve_refuses_engine_metrics_ports_that_cannot_work(argv, message, capsys):
    assert serve_command.run(parse(serve_command, ["--data-parallel-size", "2", *argv])) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dpgate serve: error: --engine-metrics-port") and err.endswith(message), err
    assert len(err.splitlines()) == 1
