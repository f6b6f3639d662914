"""`dpgate serve --data-parallel-size 2`: a gateway plus two engine subprocesses, ready only when both
serve, stopped by SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2

from tests.support.gateway_processes import (
    GATEWAY_SERVICES,
    PYTHON,
    RANK_KEY,
    ROOT,
    free_port,
    generate_request,
    inference_stub,
    read_line,
)
from tests.support.health import health_status, poll_until_serving


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def test_serve_is_serving_only_once_every_rank_takes_pinned_calls(tiny_model_dir, log_dir):
    """The first SERVING answer of `dpgate serve --data-parallel-size 2` means both ranks serve now.

    No wait and no retry between that answer and calls pinned to each rank: a gateway that said
    SERVING while one engine was still loading refused those pins. Then unpinned calls spread
    over both ranks, and SIGTERM stops the gateway and its engines.
    """
    port = free_port()
    log = open(log_dir / "serve.log", "a")  # noqa: SIM115 (the child keeps it)
    serve = subprocess.Popen(
        [PYTHON, "-m", "dpgate.cli", "serve", "--data-parallel-size", "2", "--port", str(port), "--http-port", "0",
         "--model", str(tiny_model_dir)],
        stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    try:
        read_line(serve, "listening on", timeout=30)
        engines = children_of(serve.pid)
        assert len(engines) == 2
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            seen = poll_until_serving(channel, timeout=90)  # the engines load the model first
            stub = inference_stub(channel)
            for _ in range(4):
                for rank in ("0", "1"):
                    _, call = stub.Generate.with_call(generate_request(2), metadata=[(RANK_KEY, rank)], timeout=30)
                    assert dict(call.trailing_metadata())[RANK_KEY] == rank
            assert set(seen[:-1]) <= {health_pb2.HealthCheckResponse.NOT_SERVING}, seen
            for service in GATEWAY_SERVICES:
                assert health_status(f"127.0.0.1:{port}", service) == health_pb2.HealthCheckResponse.SERVING
            ranks = set()
            for _ in range(4):
                _, call = stub.Generate.with_call(generate_request(2), timeout=30)
                ranks.add(dict(call.trailing_metadata())[RANK_KEY])
            assert ranks == {"0", "1"}
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(30) == 0
        assert not [pid for pid in engines if Path(f"/proc/{pid}").exists()]
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        serve.stdout.close()
