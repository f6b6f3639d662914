"""The gateway's HTTP/2 relay with real gRPC clients: big messages, compression, multiplexing, reflection.

Each answer through the gateway is compared with the same call made directly to the engine, so
the relay is shown to pass bytes through unchanged whatever their size or framing.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from tests.support.gateway_processes import (
    RANK_KEY,
    gateway_starter,
    generate_request,
    inference_stub,
    running_synthetic_engine,
    stream_request,
)

BIG = 16 << 20


@pytest.fixture(scope="module")
def relay(log_dir):
    with running_synthetic_engine(log_dir) as engine, gateway_starter(engine, log_dir) as start:
        gateway = start("--max-message-bytes", str(BIG), name="gateway-relay")
        gateway.wait_ranks([0])
        yield engine, gateway


def big_channel(address: str, **kwargs) -> grpc.Channel:
    options = [("grpc.max_receive_message_length", BIG), ("grpc.max_send_message_length", BIG)]
    return grpc.insecure_channel(address, options=options, **kwargs)


def test_large_responses_cross_many_frames_and_flow_control_windows(relay):
    """~1.2 MB answers: far beyond one 16 KiB frame and the client's first 64 KiB window."""
    engine, gateway = relay
    request = generate_request(300_000)
    with big_channel(engine.address) as direct, big_channel(gateway.address) as proxied:
        expected = inference_stub(direct).Generate(request, timeout=30)
        response, call = inference_stub(proxied).Generate.with_call(request, timeout=30)
    assert len(expected.SerializeToString()) > 1_000_000
    assert response == expected
    assert (RANK_KEY, "0") in [(item.key, item.value) for item in call.trailing_metadata()]


def test_large_requests_reach_the_engine_whole(relay):
    engine, gateway = relay
    request = generate_request(3, text="y" * 3_000_000)
    with big_channel(engine.address) as direct, big_channel(gateway.address) as proxied:
        assert inference_stub(proxied).Generate(request, timeout=30) == inference_stub(direct).Generate(
            request, timeout=30
        )


@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate])
def test_compressed_calls_pass_through(relay, compression):
    """Compressed messages are relayed as they are, with their grpc-encoding header."""
    engine, gateway = relay
    with big_channel(engine.address) as direct, big_channel(gateway.address, compression=compression) as proxied:
        stub = inference_stub(proxied)
        request = generate_request(2000, text="z" * 50_000)
        assert stub.Generate(request, timeout=10) == inference_stub(direct).Generate(request, timeout=10)
        streamed = list(stub.GenerateStream(stream_request(20), timeout=10))
        assert streamed == list(inference_stub(direct).GenerateStream(stream_request(20), timeout=10))


def test_many_calls_multiplexed_on_one_connection(relay):
    engine, gateway = relay
    with grpc.insecure_channel(engine.address) as direct, grpc.insecure_channel(gateway.address) as proxied:
        stub = inference_stub(proxied)
        expected_unary = inference_stub(direct).Generate(generate_request(7), timeout=10)
        expected_stream = list(inference_stub(direct).GenerateStream(stream_request(9), timeout=10))
        futures = [stub.Generate.future(generate_request(7), timeout=30) for _ in range(300)]

        def one_stream(_: int) -> list:
            return list(stub.GenerateStream(stream_request(9), timeout=30))

        with ThreadPoolExecutor(8) as pool:
            streams = list(pool.map(one_stream, range(40)))
        assert all(future.result() == expected_unary for future in futures)
        assert all(streamed == expected_stream for streamed in streams)


def test_reflection_is_served_through_the_gateway(relay):
    """Reflection is a bidirectional stream: the relay carries it to the gateway's local services."""
    _, gateway = relay
    with grpc.insecure_channel(gateway.address) as channel:
        services = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert {"dpgate.v1.InferenceService", "dpgate.v1.ControlService", "grpc.health.v1.Health"} <= set(services)


def test_unknown_methods_are_unimplemented(relay):
    _, gateway = relay
    with grpc.insecure_channel(gateway.address) as channel:
        for method in ("/dpgate.v1.InferenceService/Chat", "/no.such.Service/Call"):
            with pytest.raises(grpc.RpcError) as info:
                channel.unary_unary(method)(b"", timeout=5)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED, method
