"""compose.yaml's stack, run without Docker: the services' own commands, flags and environment
(tests/ops/local_stack.py says what is localized: hosts and ports only), started in compose's
order: engines first, the gateway once both passed their own healthcheck command.

The model: compose.yaml reads it from DPGATE_MODEL (default: the packaged SmolLM2); this test sets
DPGATE_MODEL to the tiny random Llama (tests/tiny_model.py), because two SmolLM2 engines take too
long to start in CI. Nothing else differs from what `docker compose up` runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from dpgate.v1 import control_pb2, control_pb2_grpc
from tests.ops.container_files import list_form, read_compose, read_dockerfile
from tests.ops.local_stack import local_stack
from tests.support.gateway_processes import generate_request, inference_stub, scrape, wait_ranks

pytestmark = pytest.mark.e2e  # every test here starts a process

RANK_KEY = "x-data-parallel-rank"


def _flag(command: list[str], flag: str) -> str:
    """The value of `--flag=value` in a compose command."""
    values = [word.partition("=")[2] for word in command if word.startswith(f"{flag}=")]
    assert len(values) == 1, f"{flag} given {len(values)} times in {command}"
    return values[0]


def _engine_generate_calls(metrics_port: int) -> float:
    samples = scrape(metrics_port)
    return sum(v for k, v in samples.items() if k.startswith("dpgate_engine_requests_total{") and 'rpc="Generate"' in k)


def test_compose_stack_serves_both_ranks(tiny_model_dir: Path, tmp_path: Path) -> None:
    token = "compose-test-token"
    services = read_compose({**os.environ, "DPGATE_MODEL": str(tiny_model_dir), "DPGATE_ENGINE_TOKEN": token})
    commands = {name: list_form(s.get("command"), name) for name, s in services.items() if not s.get("profiles")}
    engines = {int(_flag(c, "--data-parallel-rank")): name for name, c in commands.items() if c[0] == "engine"}
    assert sorted(engines) == [0, 1]
    assert {_flag(commands[name], "--data-parallel-size") for name in engines.values()} == {"2"}

    with local_stack(read_dockerfile(), services, tmp_path, timeout=60) as stack:
        gateway = f"127.0.0.1:{stack.ports('gateway', _flag(commands['gateway'], '--port'))}"
        wait_ranks(gateway, [0, 1])
        engine_metrics = {r: stack.ports(name, _flag(commands[name], "--metrics-port")) for r, name in engines.items()}
        with grpc.insecure_channel(gateway) as channel:
            control = control_pb2_grpc.ControlServiceStub(channel)
            for rank in (0, 1):
                before = {r: _engine_generate_calls(port) for r, port in engine_metrics.items()}
                metadata = [(RANK_KEY, str(rank))]
                response = inference_stub(channel).Generate(
                    generate_request(max_tokens=3), metadata=metadata, timeout=30
                )
                assert len(response.token_ids) == 3
                after = {r: _engine_generate_calls(port) for r, port in engine_metrics.items()}
                assert {r: after[r] - before[r] for r in after} == {rank: 1, 1 - rank: 0}
                info = control.GetServerInfo(control_pb2.GetServerInfoRequest(), metadata=metadata, timeout=5)
                assert (info.parallelism.data_parallel_rank, info.parallelism.data_parallel_size) == (rank, 2)
        gateway_metrics = scrape(stack.ports("gateway", _flag(commands["gateway"], "--metrics-port")))
        assert gateway_metrics['dpgate_gateway_routed_requests_total{rank="0"}'] >= 1
        assert gateway_metrics['dpgate_gateway_routed_requests_total{rank="1"}'] >= 1
        for rank, name in engines.items():  # an engine serves only calls carrying the token
            engine = f"127.0.0.1:{stack.ports(name, _flag(commands[name], '--port'))}"
            with grpc.insecure_channel(engine) as channel:
                try:
                    inference_stub(channel).Generate(generate_request(max_tokens=1), timeout=10)
                except grpc.RpcError as error:
                    assert error.code() == grpc.StatusCode.UNAUTHENTICATED, (rank, error.code())
                else:
                    raise AssertionError(f"engine rank {rank} served a call without the engine token")


def test_compose_refuses_to_start_without_an_engine_token() -> None:
    environment = {key: value for key, value in os.environ.items() if key != "DPGATE_ENGINE_TOKEN"}
    try:
        read_compose(environment)
    except ValueError as error:
        assert "DPGATE_ENGINE_TOKEN must be set" in str(error)
    else:
        raise AssertionError("compose.yaml read without DPGATE_ENGINE_TOKEN")
