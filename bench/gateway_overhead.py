"""Gateway overhead: the same calls made directly to an engine and through the gateway.

Starts a synthetic engine (bench/synthetic_engine.py, no model), the gateway in front of it, and
as a peer a bare grpc.aio pass-through proxy (raw bytes relayed with no metadata parsing, routing,
health or metrics: what a grpc.aio gateway costs before it does any work; the gateway was first
built on grpc.aio), each in its own process. Then it measures from this
process, for each target:
- concurrency 1: p50/p99 latency of unary Generate and of whole GenerateStream calls;
- concurrency C (default 64): unary calls/s and streamed messages/s, plus the CPU time the
  proxy process spent per call or message (from /proc), which gives the rate one fully used
  core could relay: on a small machine client, engine and proxy share the cores, so the
  wall-clock rate understates what a gateway host would do.
The client sends pre-serialized requests and reads raw bytes, so its own cost is small and the
same for every target.

    python bench/gateway_overhead.py                 # the figures in docs/performance.md
    python bench/gateway_overhead.py --duration 2    # quicker
    python bench/gateway_overhead.py --json FILE     # also write the figures as JSON (bench/report.py)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
from grpc import aio
from results import add_json_argument

from dpgate.v1 import generate_pb2

ROOT = Path(__file__).resolve().parent.parent
GENERATE = "/dpgate.v1.InferenceService/Generate"
GENERATE_STREAM = "/dpgate.v1.InferenceService/GenerateStream"
TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


@dataclass(slots=True)
class Result:
    scenario: str
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    per_second: float = 0.0
    cpu_us: float | None = None  # proxy CPU per call or message (None for the direct target)


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND  # utime + stime


def start_process(args: list[str], marker: str) -> tuple[subprocess.Popen, str]:
    """Start a child and wait for its `... listening on HOST:PORT` line; return it and the address."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert process.stdout is not None
    line = process.stdout.readline()
    if marker not in line:
        process.kill()
        raise RuntimeError(f"{args[1:4]} did not start: {line!r}")
    return process, line.split(marker, 1)[1].split()[0].rstrip(",")


async def wait_until_serving(channel: aio.Channel, request: bytes) -> None:
    call = channel.unary_unary(GENERATE)
    for _ in range(200):
        try:
            await call(request, timeout=1)
            return
        except aio.AioRpcError:
            await asyncio.sleep(0.05)
    raise RuntimeError("target never answered")


async def latency(channel: aio.Channel, request: bytes, num_calls: int, streaming: bool) -> list[float]:
    unary = channel.unary_unary(GENERATE)
    stream = channel.unary_stream(GENERATE_STREAM)
    samples = []
    for _ in range(num_calls):
        start = time.perf_counter()
        if streaming:
            async for _message in stream(request):
                pass
        else:
            await unary(request)
        samples.append(time.perf_counter() - start)
    return samples


async def throughput(
    channel: aio.Channel, request: bytes, concurrency: int, duration: float, streaming: bool
) -> tuple[int, float]:
    """(completed unary calls or relayed stream messages, seconds taken)."""
    unary = channel.unary_unary(GENERATE)
    stream = channel.unary_stream(GENERATE_STREAM)
    count = 0
    deadline = time.perf_counter() + duration

    async def worker() -> None:
        nonlocal count
        while time.perf_counter() < deadline:
            if streaming:
                async for _message in stream(request):
                    count += 1
            else:
                await unary(request)
                count += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return count, time.perf_counter() - start


def percentile(samples: list[float], q: int) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


async def measure(address: str, proxy_pid: int | None, args: argparse.Namespace) -> list[Result]:
    results = []
    async with aio.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20)]) as channel:
        request = generate_pb2.GenerateRequest(text="hello").SerializeToString()
        await wait_until_serving(channel, request)
        for streaming in (False, True):
            name = "stream" if streaming else "unary"
            await latency(channel, request, 100, streaming)  # warm-up
            samples = await latency(channel, request, args.calls, streaming)
            results.append(Result(f"{name} c=1", percentile(samples, 50) * 1e3, percentile(samples, 99) * 1e3))
            cpu_before = process_cpu_seconds(proxy_pid) if proxy_pid else 0.0
            count, seconds = await throughput(channel, request, args.concurrency, args.duration, streaming)
            cpu_us = (process_cpu_seconds(proxy_pid) - cpu_before) / count * 1e6 if proxy_pid else None
            results.append(Result(f"{name} c={args.concurrency}", per_second=count / seconds, cpu_us=cpu_us))
    return results


def report(targets: dict[str, list[Result]], args: argparse.Namespace) -> None:
    from machine import describe_machine

    print(f"\nsynthetic engine, {args.tokens} tokens a call ({args.tokens + 2} messages a stream); "
          f"{args.calls} sequential calls for latency, {args.duration:.0f} s per throughput run; "
          f"{os.cpu_count()} CPUs shared by client, engine and proxy")  # fmt: skip
    print(describe_machine(with_torch=False))
    direct = targets["direct"]
    for name, results in targets.items():
        print(f"\n{name}")
        for base, result in zip(direct, results, strict=True):
            if result.p50_ms:
                added = "" if name == "direct" else f"  added p50 {result.p50_ms - base.p50_ms:+.3f} ms"
                print(f"  {result.scenario:<14} p50 {result.p50_ms:7.3f} ms  p99 {result.p99_ms:7.3f} ms{added}")
            else:
                unit = "messages/s" if result.scenario.startswith("stream") else "calls/s"
                line = f"  {result.scenario:<14} {result.per_second:9,.0f} {unit}"
                if result.cpu_us is not None:
                    line += f"  proxy CPU {result.cpu_us:6.1f} us each = {1e6 / result.cpu_us:8,.0f} {unit} per core"
                print(line)


def write_json(targets: dict[str, list[Result]], args: argparse.Namespace) -> None:
    """The figures for bench/report.py: each target's scenarios, with its role (direct, peer, dpgate)."""
    from results import write_results

    roles = dict(zip(targets, ("direct", "peer", "dpgate"), strict=True))
    results = {
        "tokens": args.tokens,
        "calls": args.calls,
        "duration_s": args.duration,
        "concurrency": args.concurrency,
        "targets": [
            {"name": name, "role": roles[name], "scenarios": [asdict(r) for r in rs]} for name, rs in targets.items()
        ],
    }
    write_results(args.json, "gateway_overhead", results, with_torch=False)


def serve_bare_proxy(engine: str) -> None:
    """The peer: a grpc.aio relay of raw bytes to one engine with nothing else (no routing, metadata, metrics)."""

    async def main() -> None:
        channel = aio.insecure_channel(engine)
        upstream = channel.unary_unary(GENERATE)
        upstream_stream = channel.unary_stream(GENERATE_STREAM)

        async def generate(request: bytes, context: aio.ServicerContext) -> bytes:
            return await upstream(request, timeout=context.time_remaining())

        async def generate_stream(request: bytes, context: aio.ServicerContext) -> None:
            async for message in upstream_stream(request, timeout=context.time_remaining()):
                await context.write(message)

        server = aio.server()
        server.add_registered_method_handlers(
            "dpgate.v1.InferenceService",
            {
                "Generate": grpc.unary_unary_rpc_method_handler(generate),
                "GenerateStream": grpc.unary_stream_rpc_method_handler(generate_stream),
            },
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(f"bare proxy listening on 127.0.0.1:{port}", flush=True)
        await server.wait_for_termination()

    import uvloop

    uvloop.run(main())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="sequential calls for latency")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per throughput run")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per call from the synthetic engine")
    parser.add_argument("--bare-proxy", metavar="ENGINE", help=argparse.SUPPRESS)  # internal: run the floor
    add_json_argument(parser)
    args = parser.parse_args()
    if args.bare_proxy:
        serve_bare_proxy(args.bare_proxy)
        return 0
    python = sys.executable
    started: list[subprocess.Popen] = []
    try:
        engine, engine_address = start_process(
            [python, str(ROOT / "bench/synthetic_engine.py"), "--port", "0", "--num-tokens", str(args.tokens)],
            "listening on ",
        )
        started.append(engine)
        bare, bare_address = start_process([python, __file__, "--bare-proxy", engine_address], "listening on ")
        started.append(bare)
        gateway, gateway_address = start_process(
            [python, "-m", "dpgate.cli", "gateway", "--port", "0", "--engine", engine_address],
            "listening on ",
        )
        started.append(gateway)
        import uvloop

        targets = {
            "direct": uvloop.run(measure(engine_address, None, args)),
            "bare grpc.aio proxy (peer)": uvloop.run(measure(bare_address, bare.pid, args)),
            "dpgate gateway": uvloop.run(measure(gateway_address, gateway.pid, args)),
        }
        report(targets, args)
        write_json(targets, args)
    finally:
        stop_processes(started)
    return 0


def stop_processes(started: list[subprocess.Popen]) -> None:
    """End the processes a benchmark started, the last started first (SIGTERM, then SIGKILL after 10 s)."""
    for process in reversed(started):
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


if __name__ == "__main__":
    sys.exit(main())
