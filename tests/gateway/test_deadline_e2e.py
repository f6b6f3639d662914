"""The client's deadline reaches the engine (shown by a synthetic engine that echoes what it saw)."""

from __future__ import annotations

import grpc
import pytest

from bench.synthetic_engine import ECHO_DEADLINE_PROMPT
from dpgate.v1 import generate_pb2
from tests.support.gateway_processes import gateway_starter, inference_stub, running_synthetic_engine


@pytest.fixture(scope="module")
def synthetic_gateway(log_dir):
    with running_synthetic_engine(log_dir) as engine, gateway_starter(engine, log_dir) as start:
        gateway = start(name="gateway-deadline")
        gateway.wait_ranks([0])
        yield gateway


def test_deadline_is_passed_downstream(synthetic_gateway):
    with grpc.insecure_channel(synthetic_gateway.address) as channel:
        stub = inference_stub(channel)
        seen = float(stub.Generate(generate_pb2.GenerateRequest(text=ECHO_DEADLINE_PROMPT), timeout=7).text)
        assert 6 < seen <= 7.1  # the grpc-timeout header rounds up slightly
        assert stub.Generate(generate_pb2.GenerateRequest(text=ECHO_DEADLINE_PROMPT)).text == "none"
