"""The Dockerfile, compose.yaml and the Prometheus config agree with the code and with each other:
health checks name `dpgate health` with flags it accepts (and the image's check really runs), the
published and exposed ports are the ones the services listen on, Prometheus scrapes every metrics
port, and the gateway waits for every engine to be healthy."""

from __future__ import annotations

import argparse
import os
import shlex
import stat
import subprocess
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dpgate.cli import SUBCOMMANDS
from dpgate.cli import health as health_command
from tests.ops.container_files import (
    ROOT,
    console_script,
    healthcheck_command,
    interpolate,
    list_form,
    read_compose,
    read_dockerfile,
)
from tests.ops.local_stack import LOCAL_ONLY_ENV, PortMap, localize, program_argv
from tests.support.gateway_processes import free_port

SPEC = read_dockerfile()
SERVICES = read_compose({**os.environ, "DPGATE_ENGINE_TOKEN": "a-test-token"})
DEFAULT_SERVICES = {name: s for name, s in SERVICES.items() if not s.get("profiles")}


def _flags(command: list[str]) -> dict[str, str]:
    return dict(word.partition("=")[::2] for word in command if word.startswith("--") and "=" in word)


def _dockerfile_healthcheck() -> list[str]:
    """The words the image's HEALTHCHECK shell runs (`sh -c "exec dpgate health ..."`)."""
    assert SPEC.healthcheck[:2] == ["sh", "-c"], SPEC.healthcheck
    words = shlex.split(SPEC.healthcheck[2])
    return words[1:] if words[0] == "exec" else words


def _health_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpgate health", exit_on_error=False)
    health_command.add_arguments(parser)
    return parser


@pytest.mark.parametrize(
    "name", ["Dockerfile", *(f"compose:{name}" for name in DEFAULT_SERVICES)], ids=lambda name: name
)
def test_health_checks_run_dpgate_health_with_valid_flags(name: str) -> None:
    if name == "Dockerfile":
        words = _dockerfile_healthcheck()
    else:
        words = healthcheck_command(SERVICES[name.split(":", 1)[1]], name)
    program, subcommand, *flags = words
    assert program == SPEC.entrypoint[0] == "dpgate"
    assert console_script(program) == ("dpgate.cli", "main")
    assert SUBCOMMANDS[subcommand][0] == "dpgate.cli.health"
    flags = [flag.replace("${DPGATE_HEALTH_PORT}", "50051") for flag in flags]
    _health_parser().parse_args(flags)  # raises on a flag `dpgate health` does not have


@pytest.fixture
def serving_port() -> int:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port
    server.stop(None)


@pytest.mark.e2e
def test_the_image_health_check_runs(serving_port: int, tmp_path: Path) -> None:
    """The HEALTHCHECK line itself, run by sh with the image's ENV and a `dpgate` on PATH."""
    launcher = tmp_path / "dpgate"
    launcher.write_text("#!/bin/sh\nexec " + shlex.join(program_argv(["dpgate"])) + ' "$@"\n')
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR)
    image_env = {key: value for key, value in SPEC.env.items() if key not in LOCAL_ONLY_ENV}
    env = {**os.environ, **image_env, "PATH": f"{tmp_path}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    assert image_env["DPGATE_HEALTH_PORT"] == "50051"
    for port, expected in ((serving_port, 0), (free_port(), 1)):
        env["DPGATE_HEALTH_PORT"] = str(port)
        result = subprocess.run(SPEC.healthcheck, env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == expected, result.stdout + result.stderr
        assert result.stdout.startswith(f"127.0.0.1:{port}: ")


def test_ports_are_published_and_exposed() -> None:
    for name, service in DEFAULT_SERVICES.items():
        flags = _flags(list_form(service["command"], name))
        listening = {int(flags["--port"]), int(flags["--metrics-port"])}
        published = {int(str(entry).rsplit(":", 1)[1]) for entry in service["ports"]}
        assert listening == published, name
        assert listening <= SPEC.exposed, name
        assert flags["--host"] == "0.0.0.0", f"{name} must listen beyond its container's loopback"
        health_address = healthcheck_command(service, name)[healthcheck_command(service, name).index("--address") + 1]
        assert health_address == f"127.0.0.1:{flags['--port']}", name


def test_gateway_waits_for_every_engine_and_forwards_to_each() -> None:
    engines = {name for name, s in DEFAULT_SERVICES.items() if s["command"][0] == "engine"}
    gateway = DEFAULT_SERVICES["gateway"]
    assert gateway["depends_on"] == {name: {"condition": "service_healthy"} for name in engines}
    forwarded = {word.partition("=")[2] for word in gateway["command"] if word.startswith("--engine=")}
    assert forwarded == {f"{name}:{_flags(DEFAULT_SERVICES[name]['command'])['--port']}" for name in engines}


def test_prometheus_scrapes_every_metrics_port() -> None:
    prometheus = SERVICES["prometheus"]
    assert prometheus["profiles"] == ["monitoring"]
    source, target = prometheus["volumes"][0].split(":")[:2]
    assert target == "/etc/prometheus/prometheus.yml"
    config = yaml.safe_load((ROOT / source).read_text())
    targets = {t for job in config["scrape_configs"] for group in job["static_configs"] for t in group["targets"]}
    expected = {f"{name}:{_flags(s['command'])['--metrics-port']}" for name, s in DEFAULT_SERVICES.items()}
    assert targets == expected


def test_interpolation_follows_compose() -> None:
    env = {"SET": "x", "EMPTY": ""}
    assert interpolate("${SET:-d} ${EMPTY:-d} ${UNSET:-d} ${EMPTY-d} ${UNSET-d} $SET $$SET", env) == "x d d  d x $SET"
    assert interpolate("${SET:?required}", env) == "x"
    with pytest.raises(ValueError, match="EMPTY must be set: required"):
        interpolate("${EMPTY:?required}", env)
    with pytest.raises(ValueError, match="not a substitution"):
        interpolate("${SET:+alternative}", env)


def test_localize_changes_only_hosts_and_ports() -> None:
    ports = PortMap()
    argv = ["gateway", "--host=0.0.0.0", "--port=50051", "--engine=engine-0:50061", "--policy", "least_loaded"]
    local = localize("gateway", argv, {"gateway", "engine-0"}, ports)
    assert local == [
        "gateway", "--host=127.0.0.1", f"--port={ports('gateway', 50051)}",
        f"--engine=127.0.0.1:{ports('engine-0', 50061)}", "--policy", "least_loaded",
    ]  # fmt: skip
    assert localize("engine-0", ["--address", "127.0.0.1:50061"], {"engine-0"}, ports) == [
        "--address", f"127.0.0.1:{ports('engine-0', 50061)}",
    ]  # fmt: skip
    assert ports("gateway", 50051) != ports("engine-0", 50061)
