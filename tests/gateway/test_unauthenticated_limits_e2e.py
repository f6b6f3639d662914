"""What a client without a key, or one address, can hold at the front door (issue 22, item 9):
with API keys, health Check stays open for probes but a Watch stream needs a key (4,000
unauthenticated Watch streams took the gateway from 49 to 104 MB); and one address may hold at
most --max-connections-per-peer connections (4,096 idle connections re-opened every 8 s filled
--max-connections and new clients failed)."""

from __future__ import annotations

import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dpgate.e2e.h2_wire import H2Client
from gateway.http2 import frames as f
from tests.gateway.raw_grpc import RawCall, message
from tests.support.gateway_processes import gateway_starter, generate_request, running_synthetic_engine

KEY = "k-unauth-test"
GENERATE = "/dpgate.v1.InferenceService/Generate"


def wait_serving(address: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                if (
                    health.Check(health_pb2.HealthCheckRequest(), timeout=2).status
                    == health_pb2.HealthCheckResponse.SERVING
                ):
                    return
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, f"{address} not SERVING within {timeout} s"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def engine(log_dir):
    with running_synthetic_engine(log_dir) as process:
        yield process


@pytest.fixture
def start_gateway(engine, log_dir):
    with gateway_starter(engine, log_dir) as start:

        def start_serving(*flags: str):
            gateway = start(*flags, name="gateway-unauth")
            wait_serving(gateway.address)
            return gateway

        yield start_serving


def test_without_a_key_health_check_answers_but_watch_is_refused(start_gateway):
    gateway = start_gateway("--api-key", KEY)
    with grpc.insecure_channel(gateway.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as refused:
            next(iter(health.Watch(health_pb2.HealthCheckRequest(), timeout=5)))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        keyed = health.Watch(health_pb2.HealthCheckRequest(), metadata=[("authorization", f"Bearer {KEY}")], timeout=5)
        assert next(iter(keyed)).status == health_pb2.HealthCheckResponse.SERVING
        keyed.cancel()


def test_one_address_cannot_take_every_connection(start_gateway):
    gateway = start_gateway("--max-connections", "8", "--max-connections-per-peer", "2")
    time.sleep(0.2)
    held = [H2Client(gateway.port) for _ in range(2)]
    for client in held:
        client.handshake()
    time.sleep(0.2)
    extra = H2Client(gateway.port)
    extra.handshake()
    seen = extra.read_until(lambda fr: False, timeout=5)
    (frame,) = seen.of_type(f.GOAWAY)
    assert f.unpack_goaway(frame.payload)[1] == f.ENHANCE_YOUR_CALM
    assert frame.payload[8:] == b"too_many_connections_from_peer"
    other = RawCall(gateway.port, GENERATE, source_host="127.0.0.2")  # another address is served
    other.send(message(generate_request(2).SerializeToString()))
    try:
        assert other.finish(timeout=10).status == 0
    finally:
        for client in [extra, *held]:
            client.close()
