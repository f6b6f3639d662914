"""`--no-prefix-caching` (engine, and serve passing it on) and `--prefix-cache-sharing` (gateway, serve)."""

from __future__ import annotations

import argparse

import pytest

from dpgate.cli import serve as serve_command
from engines.config import EngineConfig, add_engine_arguments
from gateway import gateway_command
from gateway.config import ConfigError, GatewayConfig, validate_config


def parse(module, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dpgate")
    module.add_arguments(parser)
    return parser.parse_args(argv)


def test_the_engine_caches_prefixes_unless_told_not_to():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert EngineConfig.from_args(parser.parse_args([])).prefix_caching
    assert not EngineConfig.from_args(parser.parse_args(["--no-prefix-caching"])).prefix_caching


def test_serve_passes_no_prefix_caching_to_its_engines_only_when_given():
    assert "--no-prefix-caching" in serve_command.engine_command(parse(serve_command, ["--no-prefix-caching"]), 0, 1)
    assert "--no-prefix-caching" not in serve_command.engine_command(parse(serve_command, []), 0, 1)


def test_sharing_is_isolated_by_default_on_gateway_and_serve():
    gateway = ["--engine", "127.0.0.1:1"]
    assert gateway_command.config_from_args(parse(gateway_command, gateway)).prefix_cache_sharing == "isolated"
    shared = parse(gateway_command, [*gateway, "--prefix-cache-sharing", "shared"])
    assert gateway_command.config_from_args(shared).prefix_cache_sharing == "shared"
    args = parse(serve_command, ["--prefix-cache-sharing", "shared"])
    assert serve_command.gateway_config(args, [1001]).prefix_cache_sharing == "shared"


def test_an_unknown_sharing_mode_is_refused_naming_the_flag():
    with pytest.raises(ConfigError, match="--prefix-cache-sharing 'open' must be isolated or shared"):
        validate_config(GatewayConfig(engines=("127.0.0.1:1",), prefix_cache_sharing="open"))
    with pytest.raises(SystemExit):
        parse(gateway_command, ["--engine", "127.0.0.1:1", "--prefix-cache-sharing", "open"])
