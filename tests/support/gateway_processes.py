"""Real processes for the end-to-end tests: engines (real or synthetic), gateways, and clients.

Every server binds 127.0.0.1 on a free port; every process started here is stopped by its own
handle (never by name). Gateways run with `--port 0` and report the port they bound on stdout.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc

from dpgate.e2e.neighbour import scrape as scrape  # re-exported: the tests import it from here
from dpgate.ports import free_port
from dpgate.v1 import control_pb2, control_pb2_grpc, generate_pb2, generate_pb2_grpc
from tests.support.health import poll_until_serving

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
RANK_KEY = "x-data-parallel-rank"
# Fast probing keeps the tests short; the failure threshold of 1 makes a dead engine leave the
# rotation at the first failed probe.
FAST_HEALTH = ("--health-interval", "0.25", "--health-timeout", "0.25", "--failure-threshold", "1")
# Tests stop gateways with SIGTERM; without calls in flight there is nothing to wait for.
QUICK_DRAIN = ("--drain-grace", "0", "--shutdown-timeout", "5")


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")


def read_line(process: subprocess.Popen, marker: str, timeout: float) -> str:
    """The first stdout line containing `marker`, waiting at most `timeout` seconds."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.1)
        if ready:
            line = process.stdout.readline()
            if marker in line:
                return line
            if not line and process.poll() is not None:
                break
    raise RuntimeError(f"process {process.args[:4]} printed no {marker!r} (exit {process.poll()})")


def wait_ranks(address: str, ranks: list[int], timeout: float = 30) -> None:
    """Wait until a call pinned to each rank succeeds through the gateway at `address`."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = control_pb2_grpc.ControlServiceStub(channel)
        for rank in ranks:
            while True:
                try:
                    stub.GetServerInfo(control_pb2.GetServerInfoRequest(), metadata=[(RANK_KEY, str(rank))], timeout=1)
                    break
                except grpc.RpcError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)


GATEWAY_SERVICES = ("", "dpgate.v1.InferenceService", "dpgate.v1.ControlService")


class EngineProcess:
    """A `dpgate engine` process (real model) on a fixed port, restartable on the same port."""

    def __init__(self, model_dir: Path, rank: int, size: int, log_dir: Path, *flags: str, name: str = "") -> None:
        self.model_dir, self.rank, self.size, self.flags = model_dir, rank, size, flags
        self.port, self.metrics_port = free_port(), free_port()
        self.log_path = log_dir / f"{name or 'engine'}-{rank}.log"
        self.process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            PYTHON, "-m", "dpgate.cli", "engine", "--host", "127.0.0.1", "--port", str(self.port),
            "--model", str(self.model_dir), "--data-parallel-rank", str(self.rank),
            "--data-parallel-size", str(self.size), "--metrics-port", str(self.metrics_port), *self.flags,
        ]  # fmt: skip

    def start(self) -> None:
        log = open(self.log_path, "a")  # noqa: SIM115 (the child keeps it)
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=log, env=_env(), cwd=ROOT)

    def wait_serving(self, timeout: float = 90) -> None:
        poll_until_serving(self.address, timeout=timeout, process=self.process, log_path=self.log_path, interval=0.1)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def requests_total(self) -> dict[str, float]:
        """`dpgate_engine_requests_total` samples by rpc (codes summed)."""
        totals: dict[str, float] = {}
        for name, value in scrape(self.metrics_port).items():
            if name.startswith("dpgate_engine_requests_total{"):
                rpc = name.split('rpc="', 1)[1].split('"', 1)[0]
                totals[rpc] = totals.get(rpc, 0) + value
        return totals

    def load(self) -> control_pb2.GetLoadResponse:
        with grpc.insecure_channel(self.address) as channel:
            return control_pb2_grpc.ControlServiceStub(channel).GetLoad(control_pb2.GetLoadRequest(), timeout=5)


class SyntheticEngineProcess(EngineProcess):
    """bench/synthetic_engine.py in its own process: same interface, starts in a fraction of a second."""

    def __init__(self, rank: int, size: int, log_dir: Path, *flags: str) -> None:
        super().__init__(Path("synthetic"), rank, size, log_dir, *flags)

    def command(self) -> list[str]:
        return [
            PYTHON, str(ROOT / "bench" / "synthetic_engine.py"), "--port", str(self.port),
            "--data-parallel-rank", str(self.rank), "--data-parallel-size", str(self.size),
            "--metrics-port", str(self.metrics_port), *self.flags,
        ]  # fmt: skip


class GatewayProcess:
    """A `dpgate gateway` process; `port` is the one it reports after binding port 0."""

    def __init__(self, engines: list[str], *flags: str, log_dir: Path, name: str = "gateway") -> None:
        self.log_path = log_dir / f"{name}.log"
        # Port 0 for both, read back from the gateway's line: a port picked here and freed before
        # the gateway binds it can be taken meanwhile by another process's connection.
        command = [PYTHON, "-m", "dpgate.cli", "gateway", "--port", "0", "--metrics-port", "0"]
        command += QUICK_DRAIN  # flags given later win (argparse keeps the last value)
        for engine in engines:
            command += ["--engine", engine]
        log = open(self.log_path, "a")  # noqa: SIM115 (the child keeps it)
        self.process = subprocess.Popen(
            [*command, *flags], stdout=subprocess.PIPE, stderr=log, text=True, env=_env(), cwd=ROOT
        )
        line = read_line(self.process, "listening on", timeout=30)
        self.port = _port_after(line, "listening on ")
        self.metrics_port = _port_after(line, "metrics on ")
        # With --http-port: the OpenAI HTTP API's port, from the same line.
        self.http_port = _port_after(line, "HTTP API on http://") if "HTTP API on" in line else None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def wait_ranks(self, ranks: list[int], timeout: float = 30) -> None:
        wait_ranks(self.address, ranks, timeout)

    def metrics(self) -> dict[str, float]:
        return scrape(self.metrics_port)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def _port_after(line: str, label: str) -> int:
    """The port of the HOST:PORT that follows `label` in a "listening on" line."""
    return int(line.split(label, 1)[1].split()[0].rstrip(",").rsplit(":", 1)[1])


@contextlib.contextmanager
def all_serving(processes: list[EngineProcess]) -> Iterator[list[EngineProcess]]:
    """Start every engine first (so they load side by side), then wait for each to serve; stop
    them all on the way out, also when one never came up."""
    try:
        for process in processes:
            process.start()
        for process in processes:
            process.wait_serving()
        yield processes
    finally:
        for process in processes:
            process.stop()


@contextlib.contextmanager
def running_synthetic_engine(log_dir: Path, *flags: str) -> Iterator[SyntheticEngineProcess]:
    """A serving synthetic engine (rank 0 of 1), stopped on exit."""
    engine = SyntheticEngineProcess(0, 1, log_dir, *flags)
    engine.start()
    try:
        engine.wait_serving()
        yield engine
    finally:
        engine.stop()


@contextlib.contextmanager
def gateway_starter(engine: EngineProcess, log_dir: Path) -> Iterator[Callable[..., GatewayProcess]]:
    """`start(*flags, name=...)` starts a gateway (fast health) in front of `engine`; all stop on exit."""
    started: list[GatewayProcess] = []

    def start(*flags: str, name: str) -> GatewayProcess:
        gateway = GatewayProcess([engine.address], *FAST_HEALTH, *flags, log_dir=log_dir, name=name)
        started.append(gateway)
        return gateway

    try:
        yield start
    finally:
        for gateway in started:
            gateway.stop()


def generate_request(max_tokens: int = 4, text: str = "hello") -> generate_pb2.GenerateRequest:
    return generate_pb2.GenerateRequest(
        text=text, stopping=generate_pb2.StoppingCriteria(max_tokens=max_tokens, ignore_eos=True)
    )


def stream_request(max_tokens: int = 4, text: str = "hello") -> generate_pb2.GenerateStreamRequest:
    return generate_pb2.GenerateStreamRequest(
        text=text, stopping=generate_pb2.StoppingCriteria(max_tokens=max_tokens, ignore_eos=True)
    )


def inference_stub(channel: grpc.Channel) -> generate_pb2_grpc.InferenceServiceStub:
    return generate_pb2_grpc.InferenceServiceStub(channel)
