"""What the relay hands back besides bytes, and how a relayed call ends, against a scripted engine.

- Custom initial and trailing metadata and grpc-status-details-bin from the engine reach the
  client unchanged (compared with the same call made straight to the engine).
- TTFT is recorded for a stream whose messages the engine gzip-compresses.
- A stream far longer than the flow-control window the gateway opens upstream is relayed whole:
  the engine gets its credit back as the bytes reach the client.
- However the client's stream ends (a gRPC cancel, a raw RST_STREAM, a dropped connection, its
  deadline), the engine sees its call cancelled and stops.
"""

from __future__ import annotations

import time

import grpc
import pytest

from dpgate.v1 import generate_pb2
from gateway.http2.stream import LOCAL_STREAM_WINDOW
from tests.gateway.raw_grpc import RawCall, message
from tests.gateway.scripted_engine import (
    BULK_TEXT_BYTES,
    DETAILS,
    DETAILS_MESSAGE,
    INITIAL,
    TOKEN_DELAY_S,
    TRAILING,
    ScriptedEngine,
)
from tests.support.gateway_processes import FAST_HEALTH, RANK_KEY, GatewayProcess, inference_stub

STREAM_PATH = "/dpgate.v1.InferenceService/GenerateStream"


@pytest.fixture(scope="module")
def scripted():
    engine = ScriptedEngine().start()
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def front(scripted, log_dir):
    gateway = GatewayProcess([scripted.address], *FAST_HEALTH, log_dir=log_dir, name="gateway-scripted")
    try:
        gateway.wait_ranks([0])
        yield gateway
    finally:
        gateway.stop()


def unary(text: str) -> generate_pb2.GenerateRequest:
    return generate_pb2.GenerateRequest(text=text)


def streamed(text: str, max_tokens: int) -> generate_pb2.GenerateStreamRequest:
    return generate_pb2.GenerateStreamRequest(text=text, stopping=generate_pb2.StoppingCriteria(max_tokens=max_tokens))


def metadata_dict(metadata) -> dict[str, str | bytes]:
    return {item.key: item.value for item in metadata}


def test_custom_initial_and_trailing_metadata_reach_the_client(scripted, front):
    for address in (scripted.address, front.address):
        with grpc.insecure_channel(address) as channel:
            response, call = inference_stub(channel).Generate.with_call(unary("trailers"), timeout=10)
        assert response.text == "with trailers"
        assert dict(INITIAL).items() <= metadata_dict(call.initial_metadata()).items(), address
        assert dict(TRAILING).items() <= metadata_dict(call.trailing_metadata()).items(), address
    assert metadata_dict(call.trailing_metadata())[RANK_KEY] == "0"  # the gateway's own, added


def test_status_details_and_trailing_metadata_of_a_failed_call_reach_the_client(scripted, front):
    for address in (scripted.address, front.address):
        with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as info:
            inference_stub(channel).Generate(unary("details"), timeout=10)
        error = info.value
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, address
        assert error.details() == DETAILS_MESSAGE, address
        trailing = metadata_dict(error.trailing_metadata())
        assert trailing["grpc-status-details-bin"] == DETAILS, address
        assert dict(TRAILING).items() <= trailing.items(), address


def test_ttft_is_recorded_for_a_gzip_compressed_stream(front):
    def ttft_count() -> float:
        return front.metrics()["dpgate_gateway_time_to_first_token_seconds_count"]

    before = ttft_count()
    with grpc.insecure_channel(front.address) as channel:
        events = [m.WhichOneof("event") for m in inference_stub(channel).GenerateStream(streamed("gzip", 3))]
    assert events == ["prompt_info", "delta", "delta", "delta", "finish"]
    assert ttft_count() == before + 1

    # The messages really crossed the gateway compressed: its response says gzip and flags them.
    call = RawCall(front.port, STREAM_PATH, (("grpc-accept-encoding", "identity,deflate,gzip"),))
    call.send(message(streamed("gzip", 3).SerializeToString()))
    answer = call.finish()
    assert answer.headers.get("grpc-encoding") == "gzip" and answer.status == 0
    assert compressed_flags(answer.data)[:4] == [1, 1, 1, 1]  # the small finish may go uncompressed
    assert ttft_count() == before + 2


def test_the_added_latency_leaves_out_the_engines_time(front):
    """The engine takes four 50 ms steps over a stream: the call's duration holds them, the latency
    the gateway says it added (reading the request to queuing it upstream, reading the engine's
    end to queuing the client's) does not."""

    def read() -> tuple[float, float, float]:
        samples = front.metrics()
        return (
            samples.get('dpgate_gateway_added_latency_seconds_count{rpc="GenerateStream"}', 0.0),
            samples.get('dpgate_gateway_added_latency_seconds_sum{rpc="GenerateStream"}', 0.0),
            samples.get('dpgate_gateway_request_duration_seconds_sum{rpc="GenerateStream"}', 0.0),
        )

    count, added, duration = read()
    with grpc.insecure_channel(front.address) as channel:
        responses = list(inference_stub(channel).GenerateStream(streamed("slow", 4), timeout=10))
    assert responses[-1].HasField("finish")
    count_after, added_after, duration_after = read()
    assert count_after == count + 1
    assert duration_after - duration >= 3 * TOKEN_DELAY_S
    assert 0 < added_after - added < TOKEN_DELAY_S


def compressed_flags(data: bytes) -> list[int]:
    """The compressed flag of each length-prefixed message in `data`."""
    flags = []
    while data:
        flags.append(data[0])
        data = data[5 + int.from_bytes(data[1:5], "big") :]
    return flags


def wait_cancelled(engine: ScriptedEngine, count: int, within: float = 5) -> None:
    deadline = time.monotonic() + within
    while len(engine.cancelled) < count or engine.num_running:
        assert time.monotonic() < deadline, f"engine saw {engine.cancelled}, running {engine.num_running}"
        time.sleep(0.01)


def open_slow_raw_stream(front) -> RawCall:
    call = RawCall(front.port, STREAM_PATH)
    call.send(message(streamed("slow", 200).SerializeToString()))
    call.read_until(lambda answer: len(answer.data) > 0)  # the engine is generating
    return call


def test_a_stream_many_windows_long_is_relayed_whole(front):
    num_deltas = 3 * LOCAL_STREAM_WINDOW // BULK_TEXT_BYTES  # three upstream windows' worth
    with grpc.insecure_channel(front.address) as channel:
        responses = list(inference_stub(channel).GenerateStream(streamed("bulk", num_deltas), timeout=60))
    deltas = [response.delta.text for response in responses if response.HasField("delta")]
    assert len(deltas) == num_deltas and all(len(text) == BULK_TEXT_BYTES for text in deltas)
    assert responses[-1].HasField("finish")


def test_a_client_cancel_cancels_the_engine_call(scripted, front):
    before = len(scripted.cancelled)
    with grpc.insecure_channel(front.address) as channel:
        call = inference_stub(channel).GenerateStream(streamed("slow", 200), timeout=30)
        next(call)
        call.cancel()
    wait_cancelled(scripted, before + 1)


def test_a_raw_rst_stream_cancels_the_engine_call(scripted, front):
    before = len(scripted.cancelled)
    call = open_slow_raw_stream(front)
    assert front.metrics()["dpgate_gateway_in_flight_requests"] == 1  # the gauge counts the call it serves
    call.reset()
    wait_cancelled(scripted, before + 1)
    call.close()
    assert front.metrics()["dpgate_gateway_in_flight_requests"] == 0


def test_a_dropped_connection_cancels_the_engine_call(scripted, front):
    before = len(scripted.cancelled)
    call = open_slow_raw_stream(front)
    call.close()
    wait_cancelled(scripted, before + 1)


def test_a_client_deadline_cancels_the_engine_call(scripted, front):
    before = len(scripted.cancelled)
    with grpc.insecure_channel(front.address) as channel, pytest.raises(grpc.RpcError) as info:
        list(inference_stub(channel).GenerateStream(streamed("slow", 200), timeout=0.5))
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_cancelled(scripted, before + 1)
