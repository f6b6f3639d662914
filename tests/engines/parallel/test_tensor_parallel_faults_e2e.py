"""A tensor-parallel worker that dies or hangs: the engine stops serving and exits non-zero with a
line naming the rank within 60 s, calls in flight end with a status instead of hanging, no
process outlives the engine, and a gateway in front routes around it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import grpc
import pytest

from dpgate.v1 import generate_pb2 as pb
from dpgate.v1 import generate_pb2_grpc
from tests.support.gateway_processes import FAST_HEALTH, GatewayProcess
from tests.support.processes import free_port, running
from tests.tiny_model import make_tiny_llama_dir


@pytest.fixture(scope="module")
def one_kv_head_model(tmp_path_factory):
    return make_tiny_llama_dir(tmp_path_factory.mktemp("tiny-one-kv-head"), seed=3, num_key_value_heads=1)


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


def worker_of(pid: int) -> int:
    """The engine's one TP worker among its children (it may have others, e.g. a compile pool)."""
    [worker] = [c for c in children_of(pid) if b"engines.runner.worker" in Path(f"/proc/{c}/cmdline").read_bytes()]
    return worker


def is_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def long_stream(address: str):
    channel = grpc.insecure_channel(address)
    request = pb.GenerateStreamRequest(
        token_ids=pb.TokenIds(ids=[5, 6, 7]), stopping=pb.StoppingCriteria(max_tokens=900, ignore_eos=True)
    )
    return channel, generate_pb2_grpc.InferenceServiceStub(channel).GenerateStream(request, timeout=120)


def fault_and_watch(model: Path, log_path: Path, fault: signal.Signals, *flags: str) -> tuple[str, float]:
    """Start a TP-2 engine, stream from it, send `fault` to its worker; returns the status the
    stream ended with and the seconds from the fault until the engine had exited."""
    port = free_port()
    args = ["engine", "--port", str(port), "--model", str(model), "--tensor-parallel-size", "2", *flags]
    with running(args, port, timeout=180, log_path=str(log_path)) as engine:
        children = children_of(engine.process.pid)
        worker = worker_of(engine.process.pid)
        channel, stream = long_stream(engine.address)
        next(stream), next(stream)  # the call is generating
        faulted = time.monotonic()
        os.kill(worker, fault)
        with pytest.raises(grpc.RpcError) as ended:
            for _ in stream:
                pass
        channel.close()
        status = engine.process.wait(60)
        exited = time.monotonic() - faulted
        assert status != 0
        assert not survivors(children), "a child outlived its engine"
    return ended.value.code(), exited


def survivors(children: list[int], grace_s: float = 10.0) -> list[str]:
    """The children still alive `grace_s` after their engine exited, by command line. The grace is
    for multiprocessing's resource tracker: it exits when it reads its engine's end of the pipe
    closed, after unlinking the shared memory the engine left, which takes a moment on a loaded
    machine; a child that is really orphaned is still there when the grace is over."""
    deadline = time.monotonic() + grace_s
    while (alive := [child for child in children if is_alive(child)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [command_line(child) for child in alive]


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"pid {pid} (gone)"


def test_a_worker_that_dies_stops_the_engine_naming_its_rank(one_kv_head_model, tmp_path):
    code, seconds = fault_and_watch(one_kv_head_model, tmp_path / "engine.log", signal.SIGKILL)
    assert code != grpc.StatusCode.OK and seconds < 60
    log = (tmp_path / "engine.log").read_text()
    assert "tensor parallel rank 1 (pid" in log and "exited with status -9" in log


def test_a_worker_that_hangs_stops_the_engine_naming_its_rank(one_kv_head_model, tmp_path):
    code, seconds = fault_and_watch(
        one_kv_head_model, tmp_path / "engine.log", signal.SIGSTOP, "--worker-step-timeout", "3"
    )
    assert code != grpc.StatusCode.OK and seconds < 60
    assert "tensor parallel rank 1 did not finish step" in (tmp_path / "engine.log").read_text()


def test_the_gateway_routes_around_an_engine_whose_worker_died(one_kv_head_model, tmp_path):
    ports = free_port(), free_port()
    tp = ["engine", "--port", str(ports[0]), "--model", str(one_kv_head_model), "--tensor-parallel-size", "2",
          "--data-parallel-rank", "0", "--data-parallel-size", "2"]  # fmt: skip
    single = ["engine", "--port", str(ports[1]), "--model", str(one_kv_head_model),
              "--data-parallel-rank", "1", "--data-parallel-size", "2"]  # fmt: skip
    with (
        running(tp, ports[0], timeout=180, log_path=str(tmp_path / "tp.log")) as first,
        running(single, ports[1], timeout=180, log_path=str(tmp_path / "single.log")) as second,
    ):
        gateway = GatewayProcess([first.address, second.address], *FAST_HEALTH, log_dir=tmp_path)
        try:
            gateway.wait_ranks([0, 1], timeout=60)
            os.kill(worker_of(first.process.pid), signal.SIGKILL)
            assert first.process.wait(60) != 0
            with grpc.insecure_channel(gateway.address) as channel:
                stub = generate_pb2_grpc.InferenceServiceStub(channel)
                stopping = pb.StoppingCriteria(max_tokens=3)
                request = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 6]), stopping=stopping)
                deadline = time.monotonic() + 30
                while True:  # the gateway notices the lost engine within its health interval
                    try:
                        _, call = stub.Generate.with_call(request, timeout=10)
                        break
                    except grpc.RpcError:
                        assert time.monotonic() < deadline, "the gateway kept routing to the lost engine"
                        time.sleep(0.25)
                for _ in range(5):
                    _, call = stub.Generate.with_call(request, timeout=10)
                    assert dict(call.trailing_metadata())["x-data-parallel-rank"] == "1"
        finally:
            gateway.stop()
