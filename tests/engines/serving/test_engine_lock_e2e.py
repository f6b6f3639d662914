"""Engines serve only their gateway (issue 22, item 11): `dpgate serve` makes a token per run and
hands it to its engines and its gateway; a call straight to an engine's port without it (or with
a wrong one) is UNAUTHENTICATED, Abort included, while grpc.health stays open for probes and calls
through the gateway work. Before, a Generate sent to an engine's port succeeded without any key."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dpgate.engine_token import ENGINE_TOKEN_KEY, EngineTokenError, read_engine_token
from dpgate.v1 import control_pb2, control_pb2_grpc, generate_pb2_grpc
from dpgate.v1 import generate_pb2 as pb
from tests.support.processes import free_port, running

REQUEST = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, 2, 3]), stopping=pb.StoppingCriteria(max_tokens=2))


def engine_ports(serve_pid: int) -> list[int]:
    """The --port of each `dpgate engine` child of `dpgate serve`."""
    ports = []
    for task in Path(f"/proc/{serve_pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            if b"engine" in argv and b"--port" in argv:
                ports.append(int(argv[argv.index(b"--port") + 1]))
    return ports


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    port = free_port()
    with running(["serve", "--port", str(port), "--model", str(tiny_model_dir)], port, timeout=240) as proc:
        yield proc, engine_ports(proc.process.pid)


def test_an_engine_refuses_calls_that_do_not_come_through_its_gateway(served):
    gateway, ports = served
    assert len(ports) == 1
    with grpc.insecure_channel(gateway.address) as channel:  # through the gateway: served
        assert len(generate_pb2_grpc.InferenceServiceStub(channel).Generate(REQUEST, timeout=30).token_ids) == 2
    with grpc.insecure_channel(f"127.0.0.1:{ports[0]}") as channel:
        inference = generate_pb2_grpc.InferenceServiceStub(channel)
        control = control_pb2_grpc.ControlServiceStub(channel)
        calls = {
            "Generate, no token": lambda: inference.Generate(REQUEST, timeout=10),
            "Generate, wrong token": lambda: inference.Generate(
                REQUEST, timeout=10, metadata=((ENGINE_TOKEN_KEY, "guess"),)
            ),
            "GenerateStream": lambda: list(inference.GenerateStream(pb.GenerateStreamRequest(text="x"), timeout=10)),
            "Abort": lambda: control.Abort(control_pb2.AbortRequest(request_ids=["someone-elses"]), timeout=10),
            "GetServerInfo": lambda: control.GetServerInfo(control_pb2.GetServerInfoRequest(), timeout=10),
        }
        for name, call in calls.items():
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, (name, refused.value.code())
            assert "engine token" in refused.value.details()
            assert time.monotonic() - started < 5
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_a_token_source_that_cannot_be_used_is_refused_naming_it(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(EngineTokenError, match="--engine-token-file"):
        read_engine_token(str(empty), {})
    with pytest.raises(EngineTokenError, match="cannot be read"):
        read_engine_token(str(tmp_path / "missing"), {})
    with pytest.raises(EngineTokenError, match=r"\$DPGATE_ENGINE_TOKEN"):
        read_engine_token(None, {"DPGATE_ENGINE_TOKEN": "two words"})
    good = tmp_path / "token"
    good.write_text("s3cret\n")
    assert read_engine_token(str(good), {"DPGATE_ENGINE_TOKEN": "other"}) == "s3cret"
    assert read_engine_token(None, {"DPGATE_ENGINE_TOKEN": "env-token"}) == "env-token"
    assert read_engine_token(None, {}) is None
