"""Every invalid flag combination exits 2 with one sentence naming the flag (DESIGN.md rule 4)."""

from __future__ import annotations

import argparse
import socket
import subprocess

import pytest

from dpgate.cli import serve as serve_command
from gateway import gateway_command
from gateway.config import ConfigError, GatewayConfig, validate_config
from tests.support.gateway_processes import PYTHON, ROOT

E = ["--engine", "127.0.0.1:50061"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("config")
    pem = root / "cert.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    not_pem = root / "not.pem"
    not_pem.write_text("hello")
    empty_keys = root / "keys.txt"
    empty_keys.write_text("# no keys here\n\n")
    return {"pem": str(pem), "not_pem": str(not_pem), "missing": str(root / "missing.pem"), "keys": str(empty_keys)}


# (id, argv with {placeholders} for files, the flag the sentence must name)
MATRIX = [
    ("no engine", [], "--engine"),
    ("engine without port", ["--engine", "127.0.0.1"], "--engine"),
    ("engine with bad port", ["--engine", "127.0.0.1:http"], "--engine"),
    ("engine port zero", ["--engine", "127.0.0.1:0"], "--engine"),
    ("engine port too large", ["--engine", "127.0.0.1:70000"], "--engine"),
    ("engine empty host", ["--engine", ":50061"], "--engine"),
    ("engine bad bracket", ["--engine", "[::1:50061"], "--engine"),
    ("duplicate engine", [*E, *E], "--engine"),
    ("duplicate engine by case", [*E, "--engine", "LOCALHOST:50061", "--engine", "localhost:50061"], "--engine"),
    ("engine is the gateway", ["--engine", "127.0.0.1:50051", "--port", "50051"], "--engine"),
    ("engine dns without port", ["--engine-dns", "dpgate-engine"], "--engine-dns"),
    ("engine dns bad name", ["--engine-dns", "bad_name:50061"], "--engine-dns"),
    ("engine dns twice", ["--engine-dns", "a:1", "--engine-dns", "A:1"], "--engine-dns"),
    ("engine dns interval zero", ["--engine-dns", "a:1", "--engine-dns-interval", "0"], "--engine-dns-interval"),
    ("dns server without engine dns", [*E, "--dns-server", "127.0.0.1:53"], "--dns-server"),
    ("dns server not an address", ["--engine-dns", "a:1", "--dns-server", "ns.example:53"], "--dns-server"),
    ("dns server without port", ["--engine-dns", "a:1", "--dns-server", "127.0.0.1"], "--dns-server"),
    ("port negative", [*E, "--port", "-1"], "--port"),
    ("port too large", [*E, "--port", "65536"], "--port"),
    ("metrics port too large", [*E, "--metrics-port", "70000"], "--metrics-port"),
    ("metrics port is the port", [*E, "--port", "9000", "--metrics-port", "9000"], "--metrics-port"),
    ("empty host", [*E, "--host", ""], "--host"),
    ("http port too large", [*E, "--http-port", "70000"], "--http-port"),
    ("http port is the port", [*E, "--port", "9000", "--http-port", "9000"], "--http-port"),
    ("http port is the metrics port", [*E, "--metrics-port", "9001", "--http-port", "9001"], "--http-port"),
    ("http body limit zero", [*E, "--http-port", "0", "--http-max-body-bytes", "0"], "--http-max-body-bytes"),
    ("http header limit small", [*E, "--http-port", "0", "--http-max-header-bytes", "9"], "--http-max-header-bytes"),
    ("http connections zero", [*E, "--http-port", "0", "--http-max-connections", "0"], "--http-max-connections"),
    ("http idle timeout zero", [*E, "--http-port", "0", "--http-idle-timeout", "0"], "--http-idle-timeout"),
    ("cert without key", [*E, "--tls-cert", "{pem}"], "--tls-cert"),
    ("key without cert", [*E, "--tls-key", "{pem}"], "--tls-cert"),
    ("client ca without tls", [*E, "--tls-client-ca", "{pem}"], "--tls-client-ca"),
    ("cert missing", [*E, "--tls-cert", "{missing}", "--tls-key", "{pem}"], "--tls-cert"),
    ("key missing", [*E, "--tls-cert", "{pem}", "--tls-key", "{missing}"], "--tls-key"),
    ("cert not pem", [*E, "--tls-cert", "{not_pem}", "--tls-key", "{pem}"], "--tls-cert"),
    ("client ca missing", [*E, "--tls-cert", "{pem}", "--tls-key", "{pem}", "--tls-client-ca", "{missing}"],
     "--tls-client-ca"),
    ("grace equals shutdown", [*E, "--drain-grace", "30", "--shutdown-timeout", "30"], "--drain-grace"),
    ("grace longer than shutdown", [*E, "--drain-grace", "40"], "--drain-grace"),
    ("grace negative", [*E, "--drain-grace", "-1"], "--drain-grace"),
    ("shutdown zero", [*E, "--drain-grace", "0", "--shutdown-timeout", "0"], "--shutdown-timeout"),
    ("health interval zero", [*E, "--health-interval", "0"], "--health-interval"),
    ("health timeout zero", [*E, "--health-timeout", "0"], "--health-timeout"),
    ("health timeout over interval", [*E, "--health-interval", "1", "--health-timeout", "2"], "--health-timeout"),
    ("failure threshold zero", [*E, "--failure-threshold", "0"], "--failure-threshold"),
    ("success threshold zero", [*E, "--success-threshold", "0"], "--success-threshold"),
    ("breaker threshold zero", [*E, "--breaker-failure-threshold", "0"], "--breaker-failure-threshold"),
    ("breaker open zero", [*E, "--breaker-open-seconds", "0"], "--breaker-open-seconds"),
    ("keepalive time zero", [*E, "--keepalive-time", "0"], "--keepalive-time"),
    ("keepalive timeout negative", [*E, "--keepalive-timeout", "-5"], "--keepalive-timeout"),
    ("min ping interval zero", [*E, "--min-client-ping-interval", "0"], "--min-client-ping-interval"),
    ("max message zero", [*E, "--max-message-bytes", "0"], "--max-message-bytes"),
    ("max message over int", [*E, "--max-message-bytes", str(2**31)], "--max-message-bytes"),
    ("max in flight zero", [*E, "--max-in-flight", "0"], "--max-in-flight"),
    ("api key empty", [*E, "--api-key", ""], "--api-key"),
    ("api key with space", [*E, "--api-key", "a b"], "--api-key"),
    ("api key file missing", [*E, "--api-key-file", "{missing}"], "--api-key-file"),
    ("api key file empty", [*E, "--api-key-file", "{keys}"], "--api-key-file"),
    ("unknown policy", [*E, "--policy", "random"], "--policy"),
    ("negative prefill weight", [*E, "--cache-prefill-weight", "-1"], "--cache-prefill-weight"),
    ("infinite load weight", [*E, "--cache-load-weight", "inf"], "--cache-load-weight"),
    ("balance ratio below 1", [*E, "--cache-balance-ratio", "0.9"], "--cache-balance-ratio"),
    ("negative balance slack", [*E, "--cache-balance-slack", "-1"], "--cache-balance-slack"),
    ("port not a number", [*E, "--port", "http"], "--port"),
]


def run_command(module, argv: list[str], capsys) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="dpgate")
    module.add_arguments(parser)
    try:
        status = module.run(parser.parse_args(argv))
    except SystemExit as exit_:  # argparse's own refusals (types, choices)
        status = exit_.code
    return status, capsys.readouterr().err.strip()


@pytest.mark.parametrize(("name", "argv", "flag"), MATRIX, ids=[row[0] for row in MATRIX])
def test_invalid_configuration_exits_2_with_one_sentence(name, argv, flag, files, capsys):
    status, err = run_command(gateway_command, [arg.format(**files) for arg in argv], capsys)
    assert status == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 or lines[0].startswith("usage:"), err  # argparse prints usage, then one line
    assert flag in lines[-1], err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [(["--data-parallel-size", "0"], "--data-parallel-size"), (["--port", "65536"], "--port")],
)
def test_serve_refuses_bad_flags_before_starting_anything(argv, flag, capsys):
    status, err = run_command(serve_command, argv, capsys)
    assert status == 2 and flag in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("size", "text"),
    [(0, "--data-parallel-size 0 must be at least 1."), (3, "--data-parallel-size 3 needs at least 3 engines")],
)
def test_readiness_size_is_validated_with_the_rest(size, text):
    """`dpgate serve` sets ready_data_parallel_size; it must be reachable with the engines given."""
    config = GatewayConfig(engines=("127.0.0.1:1", "127.0.0.1:2"), ready_data_parallel_size=size)
    with pytest.raises(ConfigError) as info:
        validate_config(config)
    assert str(info.value).startswith(text)


def test_engine_dns_alone_is_enough_and_is_parsed():
    config = GatewayConfig(engines=(), engine_dns=("Dpgate-Engine:50061",), dns_server="[::1]:5353")
    config = validate_config(config)
    assert config.engine_addresses == ()
    assert config.engine_dns_targets == (("dpgate-engine", 50061),)
    assert config.dns_server_address == ("[::1]", 5353)


def test_serve_waits_for_all_the_engines_it_starts():
    parser = argparse.ArgumentParser(prog="dpgate")
    serve_command.add_arguments(parser)
    args = parser.parse_args(["--data-parallel-size", "3"])
    assert serve_command.gateway_config(args, [1001, 1002, 1003]).ready_data_parallel_size == 3
    assert validate_config(GatewayConfig(engines=("127.0.0.1:1",))).ready_data_parallel_size is None


def test_valid_configuration_passes_and_keeps_parsed_addresses():
    config = validate_config(GatewayConfig(engines=("Engine-A:1", "[::1]:2"), port=0))
    assert config.engine_addresses == (("engine-a", 1), ("[::1]", 2))


def test_default_keepalive_accepts_a_client_pinging_every_10_seconds():
    assert GatewayConfig(engines=()).min_client_ping_interval_s <= 10


@pytest.mark.e2e
def test_the_real_command_line_exits_2():
    result = subprocess.run(
        [PYTHON, "-m", "dpgate.cli", "gateway", "--engine", "127.0.0.1:1", "--drain-grace", "99"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "dpgate gateway: error: --drain-grace 99.0 must be shorter than --shutdown-timeout 30.0, "
        "or in-flight calls get no time to finish."
    )


@pytest.mark.e2e
@pytest.mark.parametrize("flag", ["--port", "--metrics-port"])
def test_a_port_in_use_exits_2_naming_the_flag(flag):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        argv = ["--port", port] if flag == "--port" else ["--port", "0", "--metrics-port", port]
        result = subprocess.run(
            [PYTHON, "-m", "dpgate.cli", "gateway", "--engine", "127.0.0.1:1", *argv],
            capture_output=True, text=True, cwd=ROOT, timeout=60,
        )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"dpgate gateway: error: {flag} {port}: cannot bind"), lines
