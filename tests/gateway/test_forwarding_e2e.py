"""Through a real gateway to real engine processes: metadata refusals, pinning, spreading, control calls."""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc
import pytest
from grpc import aio

from dpgate.v1 import control_pb2, control_pb2_grpc, generate_pb2_grpc
from gateway.metadata import RANK_ERROR_MESSAGE
from tests.gateway.rank_corpus import SENDABLE_BAD
from tests.support.gateway_processes import RANK_KEY, generate_request, inference_stub, stream_request

# The gateway's own probes reach the engines; every other rpc must stay untouched by refusals.
PROBE_RPCS = {"GetLoad", "GetServerInfo"}


def client_calls(engines) -> list[dict[str, float]]:
    return [{rpc: n for rpc, n in engine.requests_total().items() if rpc not in PROBE_RPCS} for engine in engines]


def test_bad_rank_metadata_is_refused_before_any_engine_is_contacted(gateway, engines):
    before = client_calls(engines)
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_stub(channel)
        for name, metadata in SENDABLE_BAD:
            with pytest.raises(grpc.RpcError) as unary:
                stub.Generate(generate_request(), metadata=metadata, timeout=5)
            assert unary.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
            assert unary.value.details() == RANK_ERROR_MESSAGE, name

            call = stub.GenerateStream(stream_request(), metadata=metadata, timeout=5)
            with pytest.raises(grpc.RpcError) as streamed:
                next(call)  # refused before the stream opens: not even the prompt info arrives
            assert streamed.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
            assert streamed.value.details() == RANK_ERROR_MESSAGE, name
            assert not call.initial_metadata(), name
    assert client_calls(engines) == before
    rejected = gateway.metrics()['dpgate_gateway_rejected_metadata_total{key="x-data-parallel-rank"}']
    assert rejected >= 2 * len(SENDABLE_BAD)


def test_rank_no_engine_owns_is_invalid_argument_and_never_falls_back(gateway, engines):
    before = client_calls(engines)
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_stub(channel)
        for value in ("2", "4294967295"):
            with pytest.raises(grpc.RpcError) as info:
                stub.Generate(generate_request(), metadata=[(RANK_KEY, value)], timeout=5)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details() == (
                f"data parallel rank {value} is not connected to this gateway; connected ranks: [0, 1]"
            )
    assert client_calls(engines) == before


def test_pinned_calls_are_all_served_by_their_rank(gateway, engines):
    before = [engine.requests_total().get("Generate", 0) for engine in engines]
    served = Counter()
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_stub(channel)
        for _ in range(100):
            _, call = stub.Generate.with_call(generate_request(1), metadata=[(RANK_KEY, "1")], timeout=10)
            served[dict(call.trailing_metadata())[RANK_KEY]] += 1
    assert served == {"1": 100}
    after = [engine.requests_total().get("Generate", 0) for engine in engines]
    assert after[0] - before[0] == 0
    assert after[1] - before[1] == 100


def test_pinned_stream_and_leading_zeros(gateway):
    with grpc.insecure_channel(gateway.address) as channel:
        call = inference_stub(channel).GenerateStream(stream_request(3), metadata=[(RANK_KEY, " +000 ")], timeout=10)
        events = [message.WhichOneof("event") for message in call]
        assert events[0] == "prompt_info" and events[-1] == "finish" and "delta" in events
        assert dict(call.trailing_metadata())[RANK_KEY] == "0"


def test_unpinned_calls_spread_over_both_ranks(gateway):
    async def run() -> Counter:
        served = Counter()
        async with aio.insecure_channel(gateway.address) as channel:
            stub = generate_pb2_grpc.InferenceServiceStub(channel)

            async def one(i: int) -> None:
                if i % 2:
                    call = stub.Generate(generate_request(2), timeout=20)
                    await call
                else:
                    call = stub.GenerateStream(stream_request(2), timeout=20)
                    async for _ in call:
                        pass
                served[dict(await call.trailing_metadata())[RANK_KEY]] += 1

            await asyncio.gather(*(one(i) for i in range(20)))
            for i in range(10):  # sequential calls spread too: ties rotate
                await one(i)
        return served

    served = asyncio.run(run())
    assert set(served) == {"0", "1"}
    assert min(served.values()) >= 5


def test_control_calls_are_forwarded_and_pinned(gateway):
    with grpc.insecure_channel(gateway.address) as channel:
        control = control_pb2_grpc.ControlServiceStub(channel)
        for rank in (0, 1):
            info = control.GetServerInfo(control_pb2.GetServerInfoRequest(), metadata=[(RANK_KEY, str(rank))])
            assert info.parallelism.data_parallel_rank == rank
            assert info.parallelism.data_parallel_size == 2
        assert control.GetModelInfo(control_pb2.GetModelInfoRequest()).vocab_size > 0
        assert control.GetLoad(control_pb2.GetLoadRequest(), metadata=[(RANK_KEY, "1")]).num_running == 0
        aborted = control.Abort(control_pb2.AbortRequest(request_ids=["nothing-runs-under-this-id"]))
        assert list(aborted.aborted_request_ids) == []


def test_engine_errors_are_relayed_with_their_code(gateway):
    with grpc.insecure_channel(gateway.address) as channel, pytest.raises(grpc.RpcError) as info:
        inference_stub(channel).Generate(generate_request(max_tokens=0), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Traceback" not in (info.value.details() or "")


def test_metrics_count_routes_and_codes(gateway):
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_stub(channel)
        for _ in range(3):
            stub.Generate(generate_request(1), metadata=[(RANK_KEY, "1")], timeout=10)
        list(stub.GenerateStream(stream_request(2), timeout=10))
        with pytest.raises(grpc.RpcError):
            stub.Generate(generate_request(1), metadata=[(RANK_KEY, "-1")], timeout=10)
    samples = gateway.metrics()
    assert samples['dpgate_gateway_routed_requests_total{rank="1"}'] >= 3
    assert samples['dpgate_gateway_requests_total{code="INVALID_ARGUMENT",rpc="Generate"}'] >= 1
    assert samples['dpgate_gateway_requests_total{code="OK",rpc="GenerateStream"}'] >= 1
    assert samples['dpgate_gateway_rejected_metadata_total{key="x-data-parallel-rank"}'] >= 1
    health = {name: value for name, value in samples.items() if name.startswith("dpgate_gateway_engine_healthy{")}
    assert sorted(name.split('rank="')[1][0] for name, value in health.items() if value == 1) == ["0", "1"]
    circuits = [v for name, v in samples.items() if name.startswith("dpgate_gateway_circuit_state{")]
    assert len(circuits) == 2 and all(value == 0 for value in circuits)
    assert samples["dpgate_gateway_in_flight_requests"] == 0
    assert samples["dpgate_gateway_time_to_first_token_seconds_count"] >= 1
    assert samples['dpgate_gateway_request_duration_seconds_count{rpc="Generate"}'] >= 4
    # The calls an engine answered (the refused one never left the gateway), and each added little.
    added = samples['dpgate_gateway_added_latency_seconds_count{rpc="Generate"}']
    assert added >= 3
    assert samples['dpgate_gateway_added_latency_seconds_sum{rpc="Generate"}'] / added < 0.1
