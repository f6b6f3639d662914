"""Observability over real sockets: a real tiny-model engine and a gateway, both logging JSON.

- Every metric name in every query of deploy/grafana/dpgate.json is exposed by the live
  processes' /metrics, after real calls gave the histograms and labelled families values.
- `promtool check metrics` accepts both expositions.
- `x-request-id`: the client's id comes back once in trailing metadata and is in both processes'
  JSON log lines; without one the gateway makes one; a failing call echoes it too; an unusable
  one is replaced and the replacement logged.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from dpgate.e2e.neighbour import sample_values
from dpgate.v1 import control_pb2, control_pb2_grpc, generate_pb2
from tests.support.gateway_processes import (
    FAST_HEALTH,
    RANK_KEY,
    EngineProcess,
    GatewayProcess,
    generate_request,
    inference_stub,
    stream_request,
)
from tests.support.grafana import dashboard, panel_queries
from tests.support.promql import exposed_names, metric_names
from tests.support.promtool import promtool

REQUEST_ID = "x-request-id"
LOG_KEYS = {"time", "level", "logger", "message"}


class JsonLoggingEngine(EngineProcess):
    def command(self) -> list[str]:
        return [*super().command(), "--log-format", "json"]


@pytest.fixture(scope="module")
def deployment(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    log_dir = tmp_path_factory.mktemp("observability")
    engine = JsonLoggingEngine(tiny_model_dir, 0, 1, log_dir)
    engine.start()
    gateway = None
    try:
        engine.wait_serving()
        gateway = GatewayProcess([engine.address], *FAST_HEALTH, "--log-format", "json", log_dir=log_dir)
        gateway.wait_ranks([0])
        yield engine, gateway
    finally:
        if gateway is not None:
            gateway.stop()
        engine.stop()


@pytest.fixture(scope="module")
def channel(deployment):
    _, gateway = deployment
    with grpc.insecure_channel(gateway.address) as channel:
        yield channel


def trailer_ids(call) -> list[str]:
    return [value for key, value in call.trailing_metadata() if key == REQUEST_ID]


def json_lines(path: Path) -> list[dict]:
    """Every line of a process's log, each of which must be one JSON object with the log keys."""
    entries = []
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        assert entry.keys() >= LOG_KEYS, line
        entries.append(entry)
    return entries


def wait_for_line(path: Path, request_id: str, logger: str, timeout: float = 5) -> dict:
    """The JSON line of `logger` carrying `request_id` (a process logs a call just after it ends)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in json_lines(path) if e.get("request_id") == request_id and e["logger"] == logger]
        if found:
            assert len(found) == 1, found
            return found[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no {logger} line with request_id {request_id} in {path}")
        time.sleep(0.05)


def scrape_text(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def test_the_client_request_id_is_echoed_once_and_logged_by_both(deployment, channel) -> None:
    engine, gateway = deployment
    _, call = inference_stub(channel).Generate.with_call(
        generate_request(), metadata=[(REQUEST_ID, "obs-given-1")], timeout=30
    )
    assert trailer_ids(call) == ["obs-given-1"]
    line = wait_for_line(gateway.log_path, "obs-given-1", "dpgate.gateway.access")
    assert (line["rpc"], line["code"], line["data_parallel_rank"], line["level"]) == ("Generate", "OK", 0, "info")
    line = wait_for_line(engine.log_path, "obs-given-1", "dpgate.engine.requests")
    assert (line["rpc"], line["code"], line["data_parallel_rank"], line["num_generated_tokens"]) == (
        "Generate",
        "OK",
        0,
        4,
    )


def test_a_call_without_an_id_gets_one_made_by_the_gateway(deployment, channel) -> None:
    engine, gateway = deployment
    call = inference_stub(channel).GenerateStream(stream_request(), timeout=30)
    assert list(call)[-1].finish.num_generated_tokens == 4
    [made] = trailer_ids(call)
    assert re.fullmatch("[0-9a-f]{32}", made)
    assert wait_for_line(gateway.log_path, made, "dpgate.gateway.access")["rpc"] == "GenerateStream"
    assert wait_for_line(engine.log_path, made, "dpgate.engine.requests")["code"] == "OK"


def test_failing_calls_echo_the_id(deployment, channel) -> None:
    engine, gateway = deployment
    stub = inference_stub(channel)
    bad = generate_pb2.GenerateRequest(text="hello", stopping=generate_pb2.StoppingCriteria(max_tokens=-1))
    with pytest.raises(grpc.RpcError) as refused_by_engine:
        stub.Generate(bad, metadata=[(REQUEST_ID, "obs-bad-body")], timeout=30)
    assert refused_by_engine.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert trailer_ids(refused_by_engine.value) == ["obs-bad-body"]  # the engine's echo is not relayed twice
    assert wait_for_line(engine.log_path, "obs-bad-body", "dpgate.engine.requests")["code"] == "INVALID_ARGUMENT"
    assert wait_for_line(gateway.log_path, "obs-bad-body", "dpgate.gateway.access")["code"] == "INVALID_ARGUMENT"

    with pytest.raises(grpc.RpcError) as refused_by_gateway:
        stub.Generate(generate_request(), metadata=[(REQUEST_ID, "obs-bad-rank"), (RANK_KEY, "-1")], timeout=30)
    assert refused_by_gateway.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert trailer_ids(refused_by_gateway.value) == ["obs-bad-rank"]
    assert "data_parallel_rank" not in wait_for_line(gateway.log_path, "obs-bad-rank", "dpgate.gateway.access")


def test_control_calls_and_the_abort_fan_out_echo_the_id(channel) -> None:
    stub = control_pb2_grpc.ControlServiceStub(channel)
    _, call = stub.Abort.with_call(control_pb2.AbortRequest(request_ids=["none"]), metadata=[(REQUEST_ID, "obs-ab")])
    assert trailer_ids(call) == ["obs-ab"]
    _, call = stub.GetLoad.with_call(control_pb2.GetLoadRequest(), metadata=[(REQUEST_ID, "obs-load")])
    assert trailer_ids(call) == ["obs-load"]


def test_an_unusable_id_is_replaced_and_the_replacement_logged(deployment, channel) -> None:
    engine, gateway = deployment
    too_long = "x" * 129
    _, call = inference_stub(channel).Generate.with_call(generate_request(), metadata=[(REQUEST_ID, too_long)])
    [made] = trailer_ids(call)
    assert re.fullmatch("[0-9a-f]{32}", made)
    warning = wait_for_line(gateway.log_path, made, "dpgate.gateway.forwarding")
    assert warning["level"] == "warning"
    assert "is 129 characters long, more than 128" in warning["message"]
    assert wait_for_line(engine.log_path, made, "dpgate.engine.requests")["code"] == "OK"
    assert not [e for e in json_lines(engine.log_path) if too_long in json.dumps(e)]


def test_no_access_log_leaves_the_id_in_the_trailers_only(deployment, tmp_path) -> None:
    engine, _ = deployment
    quiet = GatewayProcess([engine.address], *FAST_HEALTH, "--log-format", "json", "--no-access-log", log_dir=tmp_path)
    try:
        quiet.wait_ranks([0])
        with grpc.insecure_channel(quiet.address) as channel:
            _, call = inference_stub(channel).Generate.with_call(generate_request(), metadata=[(REQUEST_ID, "quiet-1")])
        assert trailer_ids(call) == ["quiet-1"]
        wait_for_line(engine.log_path, "quiet-1", "dpgate.engine.requests")
    finally:
        quiet.stop()
    entries = json_lines(quiet.log_path)
    assert entries and not [e for e in entries if e["logger"] == "dpgate.gateway.access"]


def test_dashboard_metrics_are_exposed_with_values_and_pass_promtool(deployment, channel) -> None:
    engine, gateway = deployment
    call = inference_stub(channel).GenerateStream(stream_request(max_tokens=3), timeout=30)
    assert len(list(call)) >= 3  # a stream: the gateway's TTFT and the engine's TTFT and TPOT
    texts = {"gateway": scrape_text(gateway.metrics_port), "engine": scrape_text(engine.metrics_port)}
    for name, text in texts.items():
        result = promtool("check", "metrics", stdin=text)
        assert result.returncode == 0, f"{name}: {result.stdout}{result.stderr}"

    exposed = exposed_names(texts["gateway"]) | exposed_names(texts["engine"])
    missing = unexposed(panel_queries(dashboard()), exposed)
    assert not missing, f"dashboard panels query metrics the processes do not expose: {sorted(missing)}"
    made_up = [("made up", "sum(rate(dpgate_gateway_requests_total[5m])) / dpgate_engine_no_such_metric")]
    assert unexposed(made_up, exposed) == {("made up", "dpgate_engine_no_such_metric")}

    samples = sample_values(texts["gateway"] + texts["engine"])
    assert samples["dpgate_gateway_time_to_first_token_seconds_count"] >= 1
    assert samples["dpgate_engine_time_per_output_token_seconds_count"] >= 1
    assert samples['dpgate_gateway_routed_requests_total{rank="0"}'] >= 1
    engine_labels = f'{{address="{engine.address}",rank="0"}}'
    assert samples["dpgate_gateway_engine_healthy" + engine_labels] == 1
    assert samples["dpgate_gateway_circuit_state" + engine_labels] == 0
    assert 0 <= samples["dpgate_engine_kv_cache_usage"] < 1
    [info] = [name for name in samples if name.startswith("dpgate_engine_info{")]
    assert 'data_parallel_rank="0"' in info and samples[info] == 1


def unexposed(queries: list[tuple[str, str]], exposed: set[str]) -> set[tuple[str, str]]:
    """(panel title, metric name) for each name a query reads that no process exposes."""
    return {(title, name) for title, expr in queries for name in metric_names(expr) if name not in exposed}
