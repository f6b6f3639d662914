"""API keys, TLS, mutual TLS, message size limits and keepalive, over real sockets.

A synthetic engine process stands behind these gateways: what is tested here is the front door.
"""

from __future__ import annotations

import shutil
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.forwarding import UNAUTHENTICATED_MESSAGE
from tests.gateway.tls_files import make_ca, make_signed
from tests.support.gateway_processes import (
    gateway_starter,
    generate_request,
    inference_stub,
    running_synthetic_engine,
    stream_request,
)

TOKEN_DELAY_S = 0.1


@pytest.fixture(scope="module")
def engine(log_dir):
    with running_synthetic_engine(log_dir, "--token-delay", str(TOKEN_DELAY_S)) as process:
        yield process


@pytest.fixture
def start_gateway(engine, log_dir):
    with gateway_starter(engine, log_dir) as start:
        yield start


def inference_calls(engine) -> float:
    totals = engine.requests_total()
    return totals.get("Generate", 0) + totals.get("GenerateStream", 0)


def test_api_keys(start_gateway, engine):
    gateway = start_gateway("--api-key", "first-key", "--api-key", "second-key", name="gateway-keys")
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_stub(channel)
        # Health is exempt: an orchestrator probes without a key.
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status in (health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING)
        before = inference_calls(engine)
        bad = [[], [("authorization", "Bearer wrong")], [("authorization", "first-key")],
               [("authorization", "bearer first-key")],
               [("authorization", "Bearer first-key"), ("authorization", "Bearer first-key")]]  # fmt: skip
        for metadata in bad:
            with pytest.raises(grpc.RpcError) as unary:
                stub.Generate(generate_request(1), metadata=metadata, timeout=5)
            assert unary.value.code() == grpc.StatusCode.UNAUTHENTICATED, metadata
            assert unary.value.details() == UNAUTHENTICATED_MESSAGE
            with pytest.raises(grpc.RpcError) as streamed:
                list(stub.GenerateStream(stream_request(1), metadata=metadata, timeout=5))
            assert streamed.value.code() == grpc.StatusCode.UNAUTHENTICATED, metadata
        assert inference_calls(engine) == before
        for key in ("first-key", "second-key"):
            response = stub.Generate(
                generate_request(1), metadata=[("authorization", f"Bearer {key}")], timeout=10, wait_for_ready=True
            )
            assert response.text


def test_message_size_limit(start_gateway, engine):
    gateway = start_gateway("--max-message-bytes", "2048", name="gateway-limits")
    gateway.wait_ranks([0])
    before = inference_calls(engine)
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_stub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Generate(generate_request(1, text="x" * 4096), timeout=5)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert inference_calls(engine) == before
        assert stub.Generate(generate_request(1, text="x" * 1000), timeout=5).text


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("the TLS tests make certificates with the openssl command line, which is not installed")
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory, "ca")
    other_ca = make_ca(directory, "other-ca")
    return {
        "ca": ca,
        "server": make_signed(directory, "server", ca, "serverAuth"),
        "client": make_signed(directory, "client", ca, "clientAuth"),
        "stranger": make_signed(directory, "stranger", other_ca, "clientAuth"),
    }


def secure_call(port: int, ca, client=None, text: str = "hello") -> str:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.cert.read_bytes(),
        private_key=client.key.read_bytes() if client else None,
        certificate_chain=client.cert.read_bytes() if client else None,
    )
    with grpc.secure_channel(f"localhost:{port}", credentials) as channel:
        request = generate_request(1, text=text)
        return inference_stub(channel).Generate(request, timeout=10, wait_for_ready=False).text


def wait_secure(port: int, ca, client=None) -> None:
    for _ in range(100):
        try:
            secure_call(port, ca, client)
            return
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE:
                raise
    raise AssertionError("the TLS gateway never served")


def test_tls(start_gateway, pki):
    server = pki["server"]
    gateway = start_gateway("--tls-cert", str(server.cert), "--tls-key", str(server.key), name="gateway-tls")
    wait_secure(gateway.port, pki["ca"])
    assert secure_call(gateway.port, pki["ca"])
    # A 3 MB request crosses many TLS records, HTTP/2 frames and flow-control windows.
    assert secure_call(gateway.port, pki["ca"], text="t" * 3_000_000)
    with pytest.raises(grpc.RpcError) as info, grpc.insecure_channel(gateway.address) as plain:
        inference_stub(plain).Generate(generate_request(1), timeout=3)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls(start_gateway, pki):
    server = pki["server"]
    gateway = start_gateway(
        "--tls-cert", str(server.cert), "--tls-key", str(server.key), "--tls-client-ca", str(pki["ca"].cert),
        name="gateway-mtls",
    )  # fmt: skip
    wait_secure(gateway.port, pki["ca"], pki["client"])
    assert secure_call(gateway.port, pki["ca"], pki["client"])
    for client in (None, pki["stranger"]):
        with pytest.raises(grpc.RpcError) as info:
            secure_call(gateway.port, pki["ca"], client)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def long_call_with_pings(address: str, ping_interval_ms: int) -> grpc.StatusCode:
    """A unary call that stays silent for 5 s while the client pings every `ping_interval_ms`."""
    options = [
        ("grpc.keepalive_time_ms", ping_interval_ms),
        ("grpc.keepalive_timeout_ms", 5000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    with grpc.insecure_channel(address, options=options) as channel:
        stub = inference_stub(channel)
        stub.Generate(generate_request(1), timeout=10, wait_for_ready=True)
        try:
            stub.Generate(generate_request(int(5 / TOKEN_DELAY_S)), timeout=20)
        except grpc.RpcError as error:
            return error.code()
    return grpc.StatusCode.OK


def test_keepalive_pings_do_not_cut_off_a_long_quiet_call(start_gateway):
    """Scaled down 20 times: a client pinging every 0.5 s, a gateway accepting pings 0.25 s apart.

    That is the default's ratio (pings accepted 5 s apart, so a client pinging every 10 s is
    inside it; see test_config_matrix). With gRPC's own server default (5 minutes) the same client
    gets GOAWAY too_many_pings about 4 s into the call, which is what this test caught while the
    gateway set a misspelled channel argument.
    """
    gateway = start_gateway("--min-client-ping-interval", "0.25", name="gateway-keepalive")
    gateway.wait_ranks([0])
    assert long_call_with_pings(gateway.address, 500) == grpc.StatusCode.OK


def test_in_flight_limit(start_gateway, engine):
    gateway = start_gateway("--max-in-flight", "1", name="gateway-in-flight")
    gateway.wait_ranks([0])
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_stub(channel)
        slow = stub.Generate.future(generate_request(20), timeout=10)  # 2 s at the engine
        while engine.load().num_running == 0:
            time.sleep(0.01)
        with pytest.raises(grpc.RpcError) as info:
            stub.Generate(generate_request(1), timeout=5)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert info.value.details() == "gateway is at its limit of 1 calls in flight"
        assert slow.result().text
