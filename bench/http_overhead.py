"""HTTP vs gRPC through the gateway: what the OpenAI API adds over the gRPC path, in one run.

Starts the synthetic engine (bench/synthetic_engine.py, no model) and one `dpgate gateway
--http-port 0` in front of it, each in its own process, then measures from this process:
- concurrency 1: p50/p99 latency of a unary gRPC Generate and of the same request as
  `POST /v1/completions` (HTTP/1.1 keep-alive); the difference is what HTTP adds (target: at
  most 0.5 ms p50);
- concurrency C (default 32): unary calls/s over each, and the gateway's CPU per call (from
  /proc): on a small shared machine client, engine and gateway share the cores, so the
  wall-clock rate understates a gateway host; CPU per call gives the rate one core sustains
  (target: at least 1,500 HTTP calls/s).
The gRPC client is grpc.aio with a pre-serialized request; the HTTP client writes pre-built
request bytes and reads each answer by its Content-Length (bench/http_server_choice.py), so
neither client parses much. The two paths take turns (one call each at c=1, `--slice` seconds
each under load), so a 2-core VM's drift falls on both alike; still, run it quiet to quote it.

    python bench/http_overhead.py                 # the figures in docs/performance.md
    python bench/http_overhead.py --duration 1    # quicker
    python bench/http_overhead.py --json FILE     # also write the figures as JSON (bench/report.py)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict

from gateway_overhead import (
    GENERATE,
    ROOT,
    Result,
    percentile,
    process_cpu_seconds,
    start_process,
    stop_processes,
    wait_until_serving,
)
from grpc import aio
from http_server_choice import Connection, connect
from results import add_json_argument

from dpgate.v1 import generate_pb2


async def grpc_latency(channel: aio.Channel, request: bytes, num_calls: int) -> list[float]:
    call = channel.unary_unary(GENERATE)
    samples = []
    for _ in range(num_calls):
        start = time.perf_counter()
        await call(request)
        samples.append(time.perf_counter() - start)
    return samples


async def http_latency(connection: Connection, num_calls: int) -> list[float]:
    samples = []
    for _ in range(num_calls):
        start = time.perf_counter()
        await connection.call()
        samples.append(time.perf_counter() - start)
    return samples


async def run_for(duration: float, workers: list) -> tuple[int, float]:
    """(calls completed, seconds) by `workers` (coroutine functions making one call each) until `duration`."""
    count = 0
    deadline = time.perf_counter() + duration

    async def loop(call) -> None:
        nonlocal count
        while time.perf_counter() < deadline:
            await call()
            count += 1

    start = time.perf_counter()
    await asyncio.gather(*(loop(call) for call in workers))
    return count, time.perf_counter() - start


async def measure(grpc_address: str, http_port: int, gateway_pid: int, args: argparse.Namespace) -> dict:
    request = generate_pb2.GenerateRequest(text="hello").SerializeToString()
    body = json.dumps({"model": "", "prompt": "hello"}).encode()
    results: dict[str, list[Result]] = {"grpc": [], "http": []}
    async with aio.insecure_channel(grpc_address) as channel:
        await wait_until_serving(channel, request)
        single = await connect(http_port, "/v1/completions", body)
        await grpc_latency(channel, request, 100)  # warm-up
        await http_latency(single, 100)
        unary = channel.unary_unary(GENERATE)

        async def grpc_call() -> None:
            await unary(request)

        # The two paths take turns (a call each at c=1, `--slice` seconds each under load), so the
        # machine's drift over seconds falls on both alike (bench/gateway_overhead.py does the same).
        samples: dict[str, list[float]] = {"grpc": [], "http": []}
        single_calls = {"grpc": grpc_call, "http": single.call}
        for turn in range(args.calls):
            for name in ("grpc", "http") if turn % 2 == 0 else ("http", "grpc"):
                start = time.perf_counter()
                await single_calls[name]()
                samples[name].append(time.perf_counter() - start)
        for name, taken in samples.items():
            results[name].append(Result("unary c=1", percentile(taken, 50) * 1e3, percentile(taken, 99) * 1e3))
        connections = [await connect(http_port, "/v1/completions", body) for _ in range(args.concurrency)]
        scenarios = [("grpc", [grpc_call] * args.concurrency), ("http", [c.call for c in connections])]
        totals = {name: (0, 0.0, 0.0) for name, _ in scenarios}
        num_slices = max(1, round(args.duration / args.slice))
        for turn in range(num_slices):
            for name, workers in scenarios if turn % 2 == 0 else scenarios[::-1]:
                cpu_before = process_cpu_seconds(gateway_pid)
                count, seconds = await run_for(args.duration / num_slices, workers)
                cpu_seconds = process_cpu_seconds(gateway_pid) - cpu_before
                done, taken_s, cpu = totals[name]
                totals[name] = (done + count, taken_s + seconds, cpu + cpu_seconds)
        for name, (count, seconds, cpu_seconds) in totals.items():
            cpu_us = cpu_seconds / count * 1e6
            results[name].append(Result(f"unary c={args.concurrency}", per_second=count / seconds, cpu_us=cpu_us))
        for connection in (single, *connections):
            connection.writer.close()
    return results


def report(results: dict[str, list[Result]], args: argparse.Namespace) -> None:
    from machine import describe_machine

    print(f"\nsynthetic engine, {args.tokens} tokens a call, through one dpgate gateway; {args.calls} sequential "
          f"calls for latency, {args.duration:.0f} s per throughput run in turns of {args.slice:g} s; "
          f"{os.cpu_count()} CPUs shared by client, engine and gateway")  # fmt: skip
    print(describe_machine(with_torch=False))
    (grpc_c1, grpc_cn), (http_c1, http_cn) = results["grpc"], results["http"]
    for name, c1, cn in (("gRPC Generate", grpc_c1, grpc_cn), ("HTTP /v1/completions", http_c1, http_cn)):
        print(f"\n{name}")
        print(f"  c=1  p50 {c1.p50_ms:7.3f} ms  p99 {c1.p99_ms:7.3f} ms")
        per_core = 1e6 / cn.cpu_us if cn.cpu_us else 0.0
        print(f"  {cn.scenario:<10} {cn.per_second:8,.0f} calls/s  gateway CPU {cn.cpu_us:6.1f} us a call "
              f"= {per_core:8,.0f} calls/s per core")  # fmt: skip
    print(f"\nHTTP adds {http_c1.p50_ms - grpc_c1.p50_ms:+.3f} ms p50 at c=1 over the gRPC path (target <= 0.5 ms)")


def write_json(results: dict[str, list[Result]], args: argparse.Namespace) -> None:
    from results import write_results

    record = {
        "tokens": args.tokens,
        "calls": args.calls,
        "duration_s": args.duration,
        "slice_s": args.slice,
        "concurrency": args.concurrency,
        "paths": {name: [asdict(result) for result in rs] for name, rs in results.items()},
    }
    write_results(args.json, "http_overhead", record, with_torch=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000, help="sequential calls for latency, per path")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per throughput run")
    parser.add_argument("--slice", type=float, default=0.5,
                        help="the two paths' throughput runs take turns of this many seconds")  # fmt: skip
    parser.add_argument("--tokens", type=int, default=16, help="tokens per call from the synthetic engine")
    add_json_argument(parser)
    args = parser.parse_args()
    if args.calls < 2 or args.concurrency < 1 or args.duration <= 0 or args.slice <= 0:
        parser.error("--calls must be at least 2, --concurrency at least 1, --duration and --slice positive")
    python = sys.executable
    started: list[subprocess.Popen] = []
    try:
        engine, engine_address = start_process(
            [python, str(ROOT / "bench/synthetic_engine.py"), "--port", "0", "--num-tokens", str(args.tokens)],
            "listening on ",
        )
        started.append(engine)
        command = [python, "-m", "dpgate.cli", "gateway", "--port", "0", "--http-port", "0", "--engine", engine_address]
        gateway, gateway_address, http_port = start_gateway(command)
        started.append(gateway)
        import uvloop

        results = uvloop.run(measure(gateway_address, http_port, gateway.pid, args))
        report(results, args)
        write_json(results, args)
    finally:
        stop_processes(started)
    return 0


def start_gateway(command: list[str]) -> tuple[subprocess.Popen, str, int]:
    """The gateway, its gRPC address and its HTTP port, read from its `listening on` line."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert process.stdout is not None
    line = process.stdout.readline()
    if "HTTP API on http://" not in line:
        process.kill()
        raise RuntimeError(f"the gateway did not start: {line!r}")
    address = line.split("listening on ", 1)[1].split()[0].rstrip(",")
    http_port = int(line.split("HTTP API on http://", 1)[1].split()[0].rsplit(":", 1)[1])
    return process, address, http_port


if __name__ == "__main__":
    sys.exit(main())
