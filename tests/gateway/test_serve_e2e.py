"""`dpgate serve --data-parallel-size 2`: a gateway plus two engine subprocesses, stopped by SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import grpc

from tests.gateway.processes import (
    PYTHON,
    RANK_KEY,
    ROOT,
    free_port,
    generate_request,
    inference_stub,
    read_line,
    wait_ranks,
)


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


def test_serve_brings_up_gateway_and_engines(tiny_model_dir, log_dir):
    port = free_port()
    log = open(log_dir / "serve.log", "a")  # noqa: SIM115 (the child keeps it)
    serve = subprocess.Popen(
        [PYTHON, "-m", "dpgate.cli", "serve", "--data-parallel-size", "2", "--port", str(port),
         "--model", str(tiny_model_dir)],
        stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    try:
        read_line(serve, "listening on", timeout=30)
        engines = children_of(serve.pid)
        assert len(engines) == 2
        wait_ranks(f"127.0.0.1:{port}", [0, 1], timeout=90)  # the engines load the model first
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            ranks = set()
            for _ in range(4):
                _, call = inference_stub(channel).Generate.with_call(generate_request(2), timeout=30)
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
