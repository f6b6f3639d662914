"""The HTTP API's flags: `dpgate serve` serves it on 8000 unless --no-http; `dpgate gateway` only with
--http-port; the limits reach GatewayConfig."""

from __future__ import annotations

import argparse

from dpgate.cli import serve as serve_command
from gateway import gateway_command


def parse(module, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(argv)


def test_serve_serves_http_on_8000_by_default_and_no_http_turns_it_off():
    assert serve_command.gateway_config(parse(serve_command, []), [1001]).http_port == 8000
    assert serve_command.gateway_config(parse(serve_command, ["--no-http"]), [1001]).http_port is None
    assert serve_command.gateway_config(parse(serve_command, ["--http-port", "0"]), [1001]).http_port == 0


def test_the_gateway_serves_http_only_when_asked_with_its_limits():
    engine = ["--engine", "127.0.0.1:50061"]
    assert gateway_command.config_from_args(parse(gateway_command, engine)).http_port is None
    argv = [*engine, "--http-port", "8080", "--http-max-body-bytes", "100", "--http-max-header-bytes", "2048",
            "--http-max-connections", "3", "--http-idle-timeout", "2.5"]  # fmt: skip
    config = gateway_command.config_from_args(parse(gateway_command, argv))
    assert (config.http_port, config.http_max_body_bytes, config.http_max_header_bytes) == (8080, 100, 2048)
    assert (config.http_max_connections, config.http_idle_timeout_s) == (3, 2.5)
