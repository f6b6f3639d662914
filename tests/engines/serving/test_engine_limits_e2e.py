"""Limits seen over real gRPC: KV usage in GetLoad, RESOURCE_EXHAUSTED for a request the cache
cannot hold and for a full queue, and the engine's Prometheus metrics."""

from __future__ import annotations

import time
import urllib.request

import grpc
import pytest

from dpgate.v1 import control_pb2 as cpb
from dpgate.v1 import control_pb2_grpc, generate_pb2_grpc
from dpgate.v1 import generate_pb2 as pb
from tests.support.processes import free_port, running


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    port, metrics_port = free_port(), free_port()
    flags = [
        "engine",
        "--port",
        str(port),
        "--model",
        str(tiny_model_dir),
        "--metrics-port",
        str(metrics_port),
        "--num-kv-blocks",
        "4",
        "--block-size",
        "16",
        "--max-num-seqs",
        "1",
        "--max-waiting",
        "1",
    ]
    with running(flags, port) as proc, grpc.insecure_channel(proc.address) as channel:
        yield channel, metrics_port


def long_stream(inference, request_id: str):
    request = pb.GenerateStreamRequest(
        request_id=request_id,
        token_ids=pb.TokenIds(ids=[5, 6, 7]),
        stopping=pb.StoppingCriteria(max_tokens=60, ignore_eos=True),
    )
    return inference.GenerateStream(request)


def test_limits(engine):
    channel, metrics_port = engine
    inference = generate_pb2_grpc.InferenceServiceStub(channel)
    control = control_pb2_grpc.ControlServiceStub(channel)
    info = control.GetServerInfo(cpb.GetServerInfoRequest())
    assert (info.kv_block_size, info.num_kv_blocks) == (16, 4)

    with pytest.raises(grpc.RpcError) as too_large:
        inference.Generate(
            pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5] * 50), stopping=pb.StoppingCriteria(max_tokens=20))
        )
    assert too_large.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert too_large.value.details() == (
        "the request needs up to 5 KV-cache blocks (prompt plus max_tokens) but the cache has 4"
    )

    first = long_stream(inference, "first")
    next(first)  # prompt info: the request is in
    second = long_stream(inference, "second")
    deadline = time.monotonic() + 5
    load = control.GetLoad(cpb.GetLoadRequest())
    while (load.num_running, load.num_waiting) != (1, 1) and time.monotonic() < deadline:
        time.sleep(0.01)
        load = control.GetLoad(cpb.GetLoadRequest())
    assert (load.num_running, load.num_waiting) == (1, 1)
    assert 0.0 < load.kv_usage <= 1.0
    with pytest.raises(grpc.RpcError) as queue_full:
        inference.Generate(pb.GenerateRequest(text="x", stopping=pb.StoppingCriteria(max_tokens=2)))
    assert queue_full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert queue_full.value.details() == "the engine's waiting queue is full (1 requests)"
    first.cancel()
    assert list(second)[-1].finish.reason == pb.FINISH_REASON_LENGTH

    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    for name in (
        "dpgate_engine_running_requests",
        "dpgate_engine_waiting_requests",
        "dpgate_engine_kv_cache_usage",
        "dpgate_engine_preemptions_total",
        "dpgate_engine_prompt_tokens_total",
        "dpgate_engine_generated_tokens_total",
        "dpgate_engine_time_to_first_token_seconds_bucket",
        "dpgate_engine_time_per_output_token_seconds_bucket",
        "dpgate_engine_step_seconds_bucket",
    ):
        assert name in body, name
    assert 'dpgate_engine_requests_total{code="RESOURCE_EXHAUSTED",rpc="Generate"} 2.0' in body
